"""Prometheus metrics of ingestion: queue gauges, drain counters, phase timings.

One :class:`IngestMetrics` per registry: the gateway passes its app registry so
``/metrics`` shows them; ``mnemo drain`` uses a private one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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
        """The live drain workers sharing the queue (every process and host), per worker: the
        registry's rows as last read (:meth:`observe_workers`), written out at each scrape."""
        self._workers = _WorkersCollector()
        r.register(self._workers)

    def observe_workers(self, rows: list[WorkerRow]) -> None:
        """Publish the registry's live workers; workers gone since the last call disappear."""
        self._workers.rows = [w for w in rows if w.alive]

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


class _WorkersCollector(Collector):
    """The drain workers' families, computed from the rows last read at each scrape.

    Not labelled gauges: a worker that stops must disappear from them, and clearing a labelled
    gauge is not implemented in prometheus_client's multi-process mode (a gateway of several
    workers), where it warned on every call. The rows are the database's registry, the same for
    every process, so whichever gateway worker answers a scrape reports them whole."""

    def __init__(self) -> None:
        self.rows: list[WorkerRow] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = self.rows
        workers = GaugeMetricFamily(
            "mnemo_ingest_drain_workers",
            "Drain workers with a recent heartbeat, in every process and host sharing the queue, "
            "by role (drain: `mnemo drain`; gateway: a gateway's own drain).",
            labels=("role",),
        )
        for role in sorted({w.role for w in live} | {"drain", "gateway"}):
            workers.add_metric((role,), sum(w.role == role for w in live))
        leases = GaugeMetricFamily(
            "mnemo_ingest_drain_worker_leases",
            "Queued records a live drain worker holds under a lease (it is processing them).",
            labels=("worker",),
        )
        rate = GaugeMetricFamily(
            "mnemo_ingest_drain_worker_records_per_second",
            "A live drain worker's records processed per second over its last minute.",
            labels=("worker",),
        )
        records = GaugeMetricFamily(
            "mnemo_ingest_drain_worker_records",
            "Records a live drain worker has processed since it started, by outcome (done, failed).",
            labels=("worker", "outcome"),
        )
        for w in live:
            leases.add_metric((w.worker_id,), w.leases)
            rate.add_metric((w.worker_id,), w.records_per_s)
            records.add_metric((w.worker_id, "done"), w.records_done)
            records.add_metric((w.worker_id, "failed"), w.records_failed)
        yield from (workers, leases, rate, records)
