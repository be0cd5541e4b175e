"""The ``dd_rag_api`` actions: their declarations, options, handlers, and ``ask``.

Modules and their public names:
- ``specs``: every action declared once (``ActionSpec``, ``run_action``, ``handle``).
- ``options``: one ``Option`` per option, its reader and its JSON Schema side by side.
- ``handlers``: ``semantic_search``, ``retrieve``, ``similar_to``, ... shaping ``(msg, data)``.
- ``context``: what a handler runs against (``ActionContext``, ``action_context``).
- ``ask``: grounded answers (``run_ask``, ``stream_ask``); ``providers``: ``ExtractiveProvider``,
  the OpenAI-compatible provider; ``citations``: ``validate_markers``.
"""
