"""Ingestion: intake, the durable queue, the indexer, the drain and its workers, images on save.

Records are validated and queued (``intake``), claimed in leased batches (``queue``), chunked and
embedded by the ``indexer`` (re-embedding only what changed), written by the drain
(``drain_pass``, ``drain``, ``drain_worker``), its workers listed in ``drain_registry``.

Modules and their public names:
- ``intake``: ``validate_records``, ``enqueue_records``, ``enqueue_delete``, ``IntakeError``.
- ``queue``: ``enqueue``, ``claim_ready``, ``complete``, ``fail``, ``Job``, ``Lease``, ``QueueStats``.
- ``indexer``: ``Indexer``; ``drain_pass``: ``drain_once``, ``drain_parallel``; ``drain``: ``DrainLoop``.
- ``drain_worker``: ``DrainWorker``; ``drain_registry``: the ``rag_drain_workers`` table.
- ``image_indexer``: images on save (``ImageIndexer``); ``images``: image bytes and preparation.
- ``reconcile``: ``reconcile_section``; ``metrics``: ``IngestMetrics``.
"""
