"""Prometheus metrics of one gateway app (its own registry, so several apps can live in a process).

Requests are counted by action (the dd_rag_api action, or the route for other
paths) and outcome (``ok`` or the error code); latency histograms cover whole
requests and each retrieval leg (embed, dense, lexical, sparse, fusion, acl).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
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

    def observe_request(self, action: str, outcome: str, seconds: float) -> None:
        self.requests.labels(action, outcome).inc()
        self.request_seconds.labels(action).observe(seconds)

    @contextlib.contextmanager
    def time_leg(self, leg: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.leg_seconds.labels(leg).observe(time.perf_counter() - start)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
