"""The gateway's base: settings, the error table, metrics, shared resources, logs, request bodies.

What every other part of the gateway stands on, importing none of them.

Modules and their public names:
- ``settings``: ``GatewaySettings``, ``load_gateway_settings``; ``ask_settings``: ``AskSettings``;
  ``budget_settings``: ``BudgetSettings``; ``settings_catalog``: the generated reference of every
  ``RAG_*`` variable.
- ``errors``: ``ApiError``, the status table and envelope v2 (``error_response``, ``error_middleware``).
- ``metrics``: ``Metrics`` (the app's own Prometheus registry).
- ``resources``: the typed ``AppKey``/``RequestKey`` s routes share.
- ``logs``: JSON log lines with the request id; ``body``: ``read_json`` from untrusted clients.
- ``locator``: stable names for what a citation points at (``chunk_id``, ``record_locator``).
"""
