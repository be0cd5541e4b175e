"""Running the gateway: its commands, worker processes and ``mnemo up``.

Modules and their public names:
- ``commands``: ``register`` (``mnemo gateway``, ``token``, ``up``, ``mcp``, ... ; the entry point).
- ``processes``: ``serve_workers`` and its ``Supervisor`` (``mnemo gateway --workers N``).
- ``worker``: one worker process (``python -m gateway.run.worker``).
- ``up``: ``run_up``, the whole stack in the foreground.
"""
