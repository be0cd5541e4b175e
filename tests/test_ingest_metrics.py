"""The drain's metrics in a gateway of several workers: prometheus_client's multi-process mode, where
clearing a labelled gauge is not implemented (it warned on every refresh, in `mnemo up`'s first
screen too). The drain workers' families are computed from the registry's rows at each scrape
instead, so a worker that stops disappears and nothing warns."""

from __future__ import annotations

import warnings
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from index.ingest.drain_registry import WorkerRow
from index.ingest.metrics import IngestMetrics


def _worker(worker_id: str, role: str, *, alive: bool = True, done: int = 3) -> WorkerRow:
    now = datetime.now(UTC)
    return WorkerRow(worker_id, role, "host", 1, now, now, alive, 2, done, 1, 9, 0.5)


def test_the_drain_workers_follow_the_registry_without_a_warning_in_multi_process_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # a worker of `mnemo gateway --workers N`
    metrics = IngestMetrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics.observe_workers(
            [_worker("a", "drain"), _worker("b", "gateway"), _worker("c", "drain", alive=False)]
        )
        before = generate_latest(metrics.registry).decode()
        metrics.observe_workers([_worker("b", "gateway", done=5)])
        after = generate_latest(metrics.registry).decode()
    assert 'mnemo_ingest_drain_workers{role="drain"} 1.0' in before
    assert 'mnemo_ingest_drain_worker_leases{worker="a"} 2.0' in before and 'worker="c"' not in before
    assert 'mnemo_ingest_drain_workers{role="drain"} 0.0' in after  # both roles are always listed
    assert 'mnemo_ingest_drain_workers{role="gateway"} 1.0' in after
    assert 'worker="a"' not in after  # gone from every family once it left the registry
    assert 'mnemo_ingest_drain_worker_records{outcome="done",worker="b"} 5.0' in after
    assert 'mnemo_ingest_drain_worker_records_per_second{worker="b"} 0.5' in after
