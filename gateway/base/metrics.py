"""Prometheus metrics of one gateway app (its own registry, so several apps can live in a process).

Requests are counted by action (the dd_rag_api action, or the route for other
paths) and outcome (``ok`` or the error code); latency histograms cover whole
requests and each retrieval leg (embed, dense, lexical, sparse, fusion, acl).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from schema.read_pool import ReplicaStatus

_MULTIPROCESS_READS = 3  # listings of the workers' metric files one scrape may take (see render)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _LegTimer:
    """Times one block into a histogram child (a plain class: cheaper than a generator context manager)."""

    __slots__ = ("_child", "_start")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._child.observe(time.perf_counter() - self._start)


class Metrics:
    """``multiprocess_dir``: this process is one worker of ``mnemo gateway --workers N``
    (:mod:`gateway.run.processes`); :meth:`render` then sums every worker's metric files in that folder."""

    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mnemo_gateway_requests",
            "Requests by action and outcome (ok or the error code).",
            ("action", "outcome"),
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "mnemo_gateway_request_seconds",
            "Request latency by action.",
            ("action",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.leg_seconds = Histogram(
            "mnemo_retrieval_leg_seconds",
            "Latency of each retrieval step (embed, dense, lexical, sparse, fusion, acl).",
            ("leg",),
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.query_cache = Counter(
            "mnemo_query_vector_cache",
            "Query-vector cache lookups by result (hit, miss).",
            ("result",),
            registry=self.registry,
        )
        self.acl_dropped = Counter(
            "mnemo_acl_dropped_candidates",
            "Candidates the ACL gate removed after the SQL push-down (should stay near zero).",
            registry=self.registry,
        )

        self.rerank_fallbacks = Counter(
            "mnemo_rerank_fallbacks",
            "Reranks that kept the fused order, by reason (timeout, the sidecar's error, no model).",
            ("reason",),
            registry=self.registry,
        )
        self.citations_removed = Counter(
            "mnemo_ask_citations_removed",
            "Citation markers removed from generated answers because they named no supplied passage.",
            registry=self.registry,
        )
        self.ask_outcomes = Counter(
            "mnemo_ask_outcomes",
            "ask outcomes (ok, no_grounded_context, external_generation_restricted, generation_failed).",
            ("outcome",),
            registry=self.registry,
        )
        self._add_budget_metrics()

        # Labelled children by label values, looked up once: prometheus_client's ``labels()`` checks
        # and converts its arguments and takes a lock on every call, and every request made five of
        # them (issue 15). Label values come from fixed sets (actions, routes, error codes, legs).
        self._request_children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._leg_children: dict[str, Any] = {}
        self._cache_children: dict[str, Any] = {}

    def _add_budget_metrics(self) -> None:
        """The budgets' counters (gateway.budgets.ledger): labelled by meter and role (user, admin), never by
        principal, so the series stay few however many principals call."""
        self.budget_units = Counter(
            "mnemo_budget_units",
            "Units charged to principals' budgets (reservations and settled excess), by meter and role.",
            ("meter", "role"),
            registry=self.registry,
        )
        self.budget_refunded_units = Counter(
            "mnemo_budget_refunded_units",
            "Units given back: failed calls, and calls that used less than they reserved.",
            ("meter", "role"),
            registry=self.registry,
        )
        self.budget_exhausted = Counter(
            "mnemo_budget_exhausted",
            "Calls refused with 429 budget_exhausted, by the meter that was spent and role.",
            ("meter", "role"),
            registry=self.registry,
        )
        self.budget_rate_limited = Counter(
            "mnemo_budget_rate_limited",
            "Calls shed by the per-principal fairness limiter (429 rate_limited), by role.",
            ("role",),
            registry=self.registry,
        )
        self.budget_ledger_errors = Counter(
            "mnemo_budget_ledger_errors",
            "Ledger operations the database did not answer (reserve: the call failed closed with a 503; "
            "settle: the reservation stayed charged).",
            ("operation",),
            registry=self.registry,
        )

    def observe_request(self, action: str, outcome: str, seconds: float) -> None:
        children = self._request_children.get((action, outcome))
        if children is None:
            children = (self.requests.labels(action, outcome), self.request_seconds.labels(action))
            self._request_children[(action, outcome)] = children
        children[0].inc()
        children[1].observe(seconds)

    def query_cache_lookup(self, result: str) -> None:
        """One query-vector cache lookup (``hit`` or ``miss``)."""
        child = self._cache_children.get(result)
        if child is None:
            child = self._cache_children[result] = self.query_cache.labels(result)
        child.inc()

    def time_leg(self, leg: str) -> _LegTimer:
        """``with metrics.time_leg("dense"): ...`` observes the block's seconds for that leg."""
        child = self._leg_children.get(leg)
        if child is None:
            child = self._leg_children[leg] = self.leg_seconds.labels(leg)
        return _LegTimer(child)

    def watch_read_pool(self, status: Callable[[], ReplicaStatus]) -> None:
        """Expose the read replica's state, read at each scrape (nothing to update on the hot path)."""
        self.registry.register(_ReadReplicaCollector(status))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type: this process's metrics, or, in a worker, every
        worker's counters and histograms summed (gauges per worker, label ``pid``) beside what this
        worker's collectors compute at scrape time."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        in_files = self._workers_families()
        # The metric objects of this registry are already in the files; only what is computed at
        # scrape time (collectors of families not in the files) is this worker's own.
        names = {family.name for family in in_files}
        own = [family for family in self.registry.collect() if family.name not in names]
        return generate_latest(_Families(in_files + own)), CONTENT_TYPE_LATEST

    def _workers_families(self) -> list[Any]:
        """Every worker's metric families, read from their files once."""
        collector = MultiProcessCollector(None, path=str(self.multiprocess_dir))
        for _ in range(_MULTIPROCESS_READS - 1):
            try:
                return list(collector.collect())
            except FileNotFoundError:
                # The supervisor removed a dead worker's gauge file between the collector's listing
                # of the folder and its read (prometheus_client forgives that for `live` gauges
                # only); the next listing no longer has it.
                continue
        return list(collector.collect())


class _Families:
    """Metric families already collected, as ``generate_latest`` reads a collector."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> Iterator[Any]:
        return iter(self._families)


class _ReadReplicaCollector(Collector):
    """``RAG_DATABASE_READ_URL``'s replica: in use, lag, reads it served and reads sent to the primary."""

    def __init__(self, status: Callable[[], ReplicaStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        state = self._status()
        if not state.configured:
            return
        yield GaugeMetricFamily(
            "mnemo_read_replica_in_use", "1 while retrieval reads go to the replica.", value=int(state.in_use)
        )
        lag = float("nan") if state.lag_s is None else state.lag_s
        yield GaugeMetricFamily(
            "mnemo_read_replica_lag_seconds",
            "The replica's lag at the last check (NaN: unreachable).",
            value=lag,
        )
        yield CounterMetricFamily(
            "mnemo_read_replica_reads", "Reads the replica served.", value=state.replica_reads
        )
        yield CounterMetricFamily(
            "mnemo_read_replica_fallbacks",
            "Reads sent to the primary while a replica is configured (down, lagging or lost mid-read).",
            value=state.fallbacks,
        )
