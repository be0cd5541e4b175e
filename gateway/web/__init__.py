"""The gateway's web edge: the app, its server, dispatch, intake routes, console, MCP, OpenAPI.

Modules and their public names:
- ``app``: ``create_app`` (builds every engine once and wires the routes), ``serve``.
- ``server``: ``GatewayRunner`` and the limits against hostile clients.
- ``dispatch``: ``POST /api/v1/json``; ``intake``: record and section routes, the background drain.
- ``embeddings``: ``POST /v1/embeddings``; ``thumbnails``: Mnemo's thumbnails.
- ``console``: ``/console`` and ``/docs`` (static files in ``console/``); ``openapi``: ``build_spec``.
- ``mcp``: the read actions as MCP tools; ``observe``: the outermost middleware.
"""
