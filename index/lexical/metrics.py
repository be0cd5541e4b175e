"""Prometheus metrics of the lexical engine beside the SQL leg: the Tantivy engine a gateway reads
(:mod:`index.lexical.engine`, on the gateway's registry) and its writer (:mod:`index.lexical.writer`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["LexicalMetrics"]

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LexicalMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.partitions = Gauge(
            "mnemo_lexical_partitions",
            "Lexical index partitions by state (loading, ready, failed).",
            ("state",),
            registry=r,
        )
        self.bytes = Gauge(
            "mnemo_lexical_bytes",
            "Bytes of the lexical index a gateway reads, per partition: the Tantivy index's files on disk "
            "(memory-mapped: one copy in the page cache for every worker).",
            ("partition",),
            registry=r,
        )
        self.chunks = Gauge(
            "mnemo_lexical_chunks",
            "Chunks (documents) in the lexical index a gateway reads, per partition.",
            ("partition",),
            registry=r,
        )
        self.load_seconds = Gauge(
            "mnemo_lexical_load_seconds",
            "Seconds the last full load (build) of a partition's lexical index took.",
            ("partition",),
            registry=r,
        )
        self.searches = Counter(
            "mnemo_lexical_searches",
            "Lexical searches with the engine on, by outcome: hit (served by the index), cold (no index "
            "of this store and format yet), image (image rows: not indexed), behind (the index is more than "
            "its bound behind the store). "
            "Every outcome but hit is served by the SQL leg.",
            ("result",),
            registry=r,
        )
        self.apply_lag = Histogram(
            "mnemo_lexical_apply_lag_seconds",
            "Seconds from a row's write in the store to its change being applied in the lexical index.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.changes = Counter(
            "mnemo_lexical_changes",
            "Changed keys applied to the lexical index from the feed, by kind (upsert, delete).",
            ("kind",),
            registry=r,
        )
