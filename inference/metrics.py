"""Prometheus metrics for the sidecar: request counters and latencies kept by the HTTP layer, plus
batching counters pulled from each model replica at scrape time.

Each :class:`SidecarMetrics` has its own registry, so several sidecars (tests, benchmarks) can live in
one process. Rates (items/s, tokens/s) are ``rate()`` over the ``*_total`` counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

__all__ = ["SidecarMetrics"]

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _ModelStatsCollector:
    """Renders the latest per-model batching snapshots (set just before each scrape)."""

    def __init__(self) -> None:
        self.snapshots: Mapping[str, Mapping[str, Any]] = {}
        self.coalescing: Mapping[str, Mapping[str, int]] = {}

    def collect(self) -> Iterator[Any]:
        counters = {
            "batches": "Forward passes (micro-batches) run",
            "batch_items": "Items run in forward passes",
            "batch_padded_tokens": "Padded tokens run (batch size x longest input)",
            "batch_real_tokens": "Unpadded tokens run",
            "forward_seconds": "Seconds spent in forward passes",
            "failed_batches": "Forward passes that raised",
            "skipped_items": "Items dropped before the forward pass because their caller went away",
            "rejected_requests": "Requests refused by admission control (429)",
        }
        families = {
            name: CounterMetricFamily(f"mnemo_sidecar_{name}", text, labels=["model", "task"])
            for name, text in counters.items()
        }
        depth = GaugeMetricFamily(
            "mnemo_sidecar_queue_depth", "Admitted items not yet finished", labels=["model", "task"]
        )
        sizes = HistogramMetricFamily(
            "mnemo_sidecar_batch_size", "Items per forward pass", labels=["model", "task"]
        )
        for model, tasks in self.snapshots.items():
            for task, stats in tasks.items():
                labels = [model, task]
                for name, family in families.items():
                    family.add_metric(labels, float(stats[name]))
                depth.add_metric(labels, float(stats["pending_items"]))
                counts = {int(k): v for k, v in stats["batch_size_counts"].items()}
                buckets = []
                for bound in _BATCH_BUCKETS:  # cumulative, as Prometheus histograms are
                    buckets.append((str(bound), float(sum(v for k, v in counts.items() if k <= bound))))
                buckets.append(("+Inf", float(sum(counts.values()))))
                sizes.add_metric(labels, buckets, sum_value=float(sum(k * v for k, v in counts.items())))
        yield from families.values()
        yield depth
        yield sizes
        calls = CounterMetricFamily(
            "mnemo_sidecar_coalesced_calls", "/embed calls the ingress sent on in bundles", labels=["model"]
        )
        bundles = CounterMetricFamily(
            "mnemo_sidecar_coalesced_bundles",
            "Ray calls from the ingress to the model carrying those /embed calls",
            labels=["model"],
        )
        for model, counts in self.coalescing.items():
            calls.add_metric([model], float(counts["calls"]))
            bundles.add_metric([model], float(counts["bundles"]))
        yield calls
        yield bundles


class SidecarMetrics:
    """The HTTP layer's metrics and the per-model batching collector, in one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mnemo_sidecar_requests",
            "HTTP requests by route, model and status",
            ["route", "model", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mnemo_sidecar_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.in_flight = Gauge("mnemo_sidecar_in_flight", "HTTP requests in progress", registry=self.registry)
        self.items = Counter(
            "mnemo_sidecar_items", "Inputs embedded or scored", ["model", "kind"], registry=self.registry
        )
        self.tokens = Counter("mnemo_sidecar_tokens", "Tokens processed", ["model"], registry=self.registry)
        self._models = _ModelStatsCollector()
        self.registry.register(self._models)

    def observe_request(self, route: str, model: str, status: int, seconds: float) -> None:
        self.requests.labels(route, model, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_items(self, model: str, kind: str, count: int, tokens: int) -> None:
        self.items.labels(model, kind).inc(count)
        if tokens:
            self.tokens.labels(model).inc(tokens)

    def render(
        self,
        model_stats: Mapping[str, Mapping[str, Any]],
        coalescing: Mapping[str, Mapping[str, int]] | None = None,
    ) -> tuple[bytes, str]:
        self._models.snapshots = model_stats
        self._models.coalescing = coalescing or {}
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
