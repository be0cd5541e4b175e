"""Per-principal budgets and fairness in front of the sidecar and the language model.

Modules and their public names:
- ``ledger``: ``Ledger``, ``Reservation`` (the ledger in PostgreSQL: reserve, adjust, show, set).
- ``metering``: ``Budgets``, ``Metering``, ``metered`` (one call: reserve before spending, settle after).
- ``lease``: ``Leases`` (a principal without a limit counted one ledger write per lease).
- ``fairness``: ``FairLimiter`` (a token bucket and in-flight bound per principal).
- ``routes``: the admin routes ``/v1/budgets`` (``setup_budget_routes``).
"""
