"""Per-principal budgets and fairness in front of the sidecar and the language model.

Modules and their public names:
- ``ledger``: ``Budgets``, ``Ledger``, ``Metering`` (reserve before spending, settle after), ``Leases``
  (a principal without a limit counted one ledger write per lease).
- ``admin``: ``show``, ``set_limit``, ``clear_limit``, ``reset`` (the operators' side of the ledger).
- ``fairness``: ``FairLimiter`` (a token bucket and in-flight bound per principal).
- ``routes``: the admin routes ``/v1/budgets`` (``setup_budget_routes``).
"""
