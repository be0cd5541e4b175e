"""benchmarks.sidecar runs end to end (tiny durations) and gives the sidecar suite what it reports."""

from __future__ import annotations

import math

import pytest

from benchmarks.plan import SidecarPlan
from benchmarks.sidecar import run_sidecar_benchmark

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_sidecar_benchmark_reports_cells_ratios_and_bars(sidecar_url: str) -> None:
    plan = SidecarPlan(
        concurrencies=(1, 2),
        sizes=(4,),
        seconds_per_cell=0.3,
        baseline_seconds=0.1,
        repeats=2,
        sweep_batches=(4, 8),
        sweep_seconds=0.05,
        sweep_sample=16,
    )
    result = run_sidecar_benchmark(sidecar_url, plan)
    assert [(c["mode"], c["concurrency"], c["request_size"]) for c in result["cells"]] == [
        ("sidecar", 1, 4),
        ("sidecar", 2, 4),
    ]
    assert result["headline_concurrency"] == 2 and len(result["cells"][1]["windows"]) == 2
    configs = result["configurations"]
    assert configs["strongest"]["batch"] in (4, 8) and configs["st_encode"]["batch"] in (4, 8)
    assert configs["ceiling"]["batch"] == configs["strongest"]["batch"]
    assert configs["strongest"]["overlap"] in (True, False)  # whichever was faster at that batch size
    # Every configuration and cell was timed; what the figures come to is the benchmark's to report.
    assert all(
        math.isfinite(configs[k]["items_per_s"])
        for k in ("inprocess_batch32", "strongest", "ceiling", "st_encode")
    )
    for cell in result["cells"]:
        assert math.isfinite(cell["items_per_s"]) and math.isfinite(cell["tokens_per_s"])
        assert all(math.isfinite(cell["latency_ms"][p]) for p in ("p50", "p95", "p99"))
        assert math.isfinite(cell["ratio_to_inprocess"])
        assert math.isfinite(cell["ratio_to_strongest"])  # every baseline window also ran the strongest
        assert len(cell["spread"]["ratio_to_inprocess"]) == 2
    assert result["baseline"]["windows"] == 3  # before and after the size's cells, after the repeat
    assert set(result["bars"]) == {"c16_1item", "c16_32item"}  # not measured in this small grid
    assert all(bar["ratio"] is None for bar in result["bars"].values())
