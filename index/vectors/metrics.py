"""Prometheus metrics of the FAISS vector cache (:mod:`index.vectors.cache`), on the gateway's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CacheMetrics"]

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.partitions = Gauge(
            "mnemo_faiss_partitions",
            "Cached model partitions by state (loading, ready, over_budget, failed, missing, foreign).",
            ("state",),
            registry=r,
        )
        self.bytes = Gauge(
            "mnemo_faiss_bytes", "Bytes the cache's indexes hold, per partition.", ("partition",), registry=r
        )
        self.vectors = Gauge(
            "mnemo_faiss_vectors", "Live vectors in the cache, per partition.", ("partition",), registry=r
        )
        self.load_seconds = Gauge(
            "mnemo_faiss_load_seconds",
            "Seconds the last full load of a partition took.",
            ("partition",),
            registry=r,
        )
        self.searches = Counter(
            "mnemo_faiss_searches",
            "Dense searches by outcome: hit (served by the cache), cold (partition not loaded yet), "
            "over_budget (partition not cached), missing (mode mmap: no snapshot on disk yet), foreign "
            "(mode mmap: another store's snapshot), broad (an unfiltered scope left to HNSW on CPU), "
            "fallback (the cache could not prove an exact answer).",
            ("result",),
            registry=r,
        )
        self.packed_bytes = Gauge(
            "mnemo_faiss_packed_scope_bytes",
            "Bytes held by packed copies of small scopes' vectors (RAG_FAISS_PACKED_BYTES bounds them).",
            registry=r,
        )
        self.over_budget = Counter(
            "mnemo_faiss_over_budget",
            "Partitions left to pgvector because they did not fit RAG_FAISS_MAX_BYTES.",
            registry=r,
        )
        self.sync_lag = Gauge(
            "mnemo_faiss_sync_lag_seconds",
            "Seconds the cache is behind the store now (0 when caught up; grows while the feed is down).",
            registry=r,
        )
        self.apply_lag = Histogram(
            "mnemo_faiss_apply_lag_seconds",
            "Seconds from a row's write in the store to its change being applied in the cache.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.changes = Counter(
            "mnemo_faiss_changes",
            "Changed keys applied from the feed, by kind (upsert, delete).",
            ("kind",),
            registry=r,
        )
