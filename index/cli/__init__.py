"""The ingestion commands: ``mnemo drain``, ``ingest``, ``backfill``, ``queue``, ``sections``, ...

The commands are ``drain``, ``ingest``, ``backfill``, ``queue``, ``sections``, ``reconcile``,
``lexical`` and ``vectors``.

``register.register`` is the ``mnemo.commands`` entry point; each command lives in its own module
(``drain``, ``ingest``, ``images``, ``backfill``, ``queue``, ``sections``, ``lexical``, ``vectors``),
with what they share in ``common`` (sidecar flags, settings, pools) and ``folders`` (the swapped
folders of ``lexical`` and ``vectors``).
"""
