"""Prometheus metrics of ingestion: queue gauges, drain counters, phase timings.

One :class:`IngestMetrics` per registry: the gateway passes its app registry so
``/metrics`` shows them; ``mnemo drain`` uses a private one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from index.ingest.drain_registry import WorkerRow
from index.ingest.queue import QueueStats

__all__ = ["IngestMetrics", "PassReport"]


class PassReport(Protocol):
    """What the metrics read of a drain pass (:class:`index.ingest.drain.DrainReport`). A protocol, because
    the drain imports these metrics: importing the drain back would make the two a cycle."""

    processed: int
    indexed: int
    deleted: int
    failed: int
    parked: int
    superseded: int
    chunks_embedded: int
    rows_written: int
    truncated: int
    unavailable: bool

    @property
    def seconds(self) -> Mapping[str, float]: ...

    @property
    def sidecar_seen(self) -> bool | None: ...


_PHASE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class IngestMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        # Three families, registered in this order (the order /metrics lists them in).
        self._queue_metrics(self.registry)
        self._drain_metrics(self.registry)
        self._worker_metrics(self.registry)

    def _queue_metrics(self, r: CollectorRegistry) -> None:
        """The queue's gauges, and whether the drain reaches the sidecar."""
        self.queue = Gauge(
            "mnemo_ingest_queue_records",
            "Queued records by state: pending (= ready + blocked), ready, blocked (backing off), "
            "failed (parked after max attempts), waiting_on_sidecar, leased (being processed by a "
            "worker), expired_leases (held by a worker that stopped renewing: taken over next).",
            ("state",),
            registry=r,
        )
        self.oldest_age = Gauge(
            "mnemo_ingest_queue_oldest_age_seconds",
            "Age of the oldest pending record (0 when nothing is pending).",
            registry=r,
        )
        self.sidecar_available = Gauge(
            "mnemo_ingest_sidecar_available",
            "1 when the last drain pass reached the sidecar, 0 while the drain is paused by an outage.",
            registry=r,
        )
        self.sidecar_available.set(1)

    def _drain_metrics(self, r: CollectorRegistry) -> None:
        """What the drain passes did, how long their phases took, and whether the loop runs."""
        self.records = Counter(
            "mnemo_ingest_records",
            "Records processed by the drain, by outcome (indexed, deleted, failed, parked, superseded).",
            ("outcome",),
            registry=r,
        )
        self.chunks_embedded = Counter(
            "mnemo_ingest_chunks_embedded", "Chunk texts sent to the sidecar for embedding.", registry=r
        )
        self.rows_written = Counter("mnemo_ingest_rows_written", "Rows upserted into the store.", registry=r)
        self.truncations = Counter(
            "mnemo_ingest_truncations",
            "Chunks still over the model's input limit after re-chunking, embedded truncated.",
            registry=r,
        )
        self.drain_crashes = Counter(
            "mnemo_ingest_drain_crashes",
            "Times the background drain loop died of an unexpected error (it restarts with backoff).",
            registry=r,
        )
        self.drain_up = Gauge(
            "mnemo_ingest_drain_up",
            "1 while the drain loop runs, 0 while a crashed loop waits to restart.",
            registry=r,
        )
        self.drain_up.set(1)
        self.outages = Counter(
            "mnemo_ingest_sidecar_outages",
            "Drain passes paused because the sidecar was unreachable.",
            registry=r,
        )
        self.phase_seconds = Histogram(
            "mnemo_ingest_phase_seconds",
            "Seconds per drain pass spent in each phase (chunk, tokenize, embed, write).",
            ("phase",),
            buckets=_PHASE_BUCKETS,
            registry=r,
        )

    def _worker_metrics(self, r: CollectorRegistry) -> None:
        """The live drain workers sharing the queue (every process and host), per worker."""
        self.workers = Gauge(
            "mnemo_ingest_drain_workers",
            "Drain workers with a recent heartbeat, in every process and host sharing the queue, "
            "by role (drain: `mnemo drain`; gateway: a gateway's own drain).",
            ("role",),
            registry=r,
        )
        self.worker_leases = Gauge(
            "mnemo_ingest_drain_worker_leases",
            "Queued records a live drain worker holds under a lease (it is processing them).",
            ("worker",),
            registry=r,
        )
        self.worker_rate = Gauge(
            "mnemo_ingest_drain_worker_records_per_second",
            "A live drain worker's records processed per second over its last minute.",
            ("worker",),
            registry=r,
        )
        self.worker_records = Gauge(
            "mnemo_ingest_drain_worker_records",
            "Records a live drain worker has processed since it started, by outcome (done, failed).",
            ("worker", "outcome"),
            registry=r,
        )

    def observe_workers(self, rows: list[WorkerRow]) -> None:
        """Publish the registry's live workers; workers gone since the last call disappear."""
        for gauge in (self.workers, self.worker_leases, self.worker_rate, self.worker_records):
            gauge.clear()
        live = [w for w in rows if w.alive]
        for role in sorted({w.role for w in live} | {"drain", "gateway"}):
            self.workers.labels(role).set(sum(w.role == role for w in live))
        for w in live:
            self.worker_leases.labels(w.worker_id).set(w.leases)
            self.worker_rate.labels(w.worker_id).set(w.records_per_s)
            self.worker_records.labels(w.worker_id, "done").set(w.records_done)
            self.worker_records.labels(w.worker_id, "failed").set(w.records_failed)

    def observe_stats(self, stats: QueueStats) -> None:
        for state in (
            "pending",
            "ready",
            "blocked",
            "failed",
            "waiting_on_sidecar",
            "leased",
            "expired_leases",
        ):
            self.queue.labels(state).set(getattr(stats, state))
        self.oldest_age.set(stats.oldest_age_s or 0.0)

    def observe_report(self, report: PassReport) -> None:
        for outcome in ("indexed", "deleted", "failed", "parked", "superseded"):
            value = getattr(report, outcome)
            if value:
                self.records.labels(outcome).inc(value)
        self.chunks_embedded.inc(report.chunks_embedded)
        self.rows_written.inc(report.rows_written)
        self.truncations.inc(report.truncated)
        for phase, seconds in report.seconds.items():
            self.phase_seconds.labels(phase).observe(seconds)
        if report.unavailable:
            self.outages.inc()
        if report.sidecar_seen is not None:
            self.sidecar_available.set(int(report.sidecar_seen))

    def observe_crash(self) -> None:
        self.drain_crashes.inc()
        self.drain_up.set(0)

    def observe_restart(self) -> None:
        self.drain_up.set(1)
