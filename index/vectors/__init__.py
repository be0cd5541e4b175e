"""The FAISS vector cache: exact in-process dense search, its mapped snapshots and their writer.

An optional accelerator of the dense leg: each partition's text vectors in an exact index, held in
process (``cache.VectorCache``, CPU or GPU) or mapped by every worker from snapshots on disk
(``mapped_cache.MappedVectorCache``) that ``mnemo vectors follow`` writes (``writer.VectorWriter``).

Modules and their public names:
- ``cache``: ``VectorCache``, ``CacheUnavailable``; ``partition``: ``PartitionCache``, ``CacheConfig``.
- ``faiss_backend``: ``FlatIndex``, ``GpuFlatIndex``, ``top_permitted``.
- ``mapped_cache``, ``mapped_flat``: the snapshot-mapped cache and its index.
- ``files``: snapshots on disk (``open_current``); ``snapshot_build``: ``SnapshotBuilder`` writes
  one in bounded memory; ``writer``: ``VectorWriter``.
- ``slot_keys``: key <-> slot maps over a snapshot; ``packed_scopes``: small scopes packed together.
- ``metrics``: ``CacheMetrics``.
"""
