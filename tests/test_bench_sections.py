"""The sections that were one-off scripts, run as `mnemo bench` runs them, each alone through the plan
(every other section of its suite set to 0): the gateway suite's levers A/B, the scale suite's Ray
job dispatch and image ingestion. Each writes its figures, tables and headline; what the figures come
to is the benchmark's, not the test's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.bench_support import run_bench

SECTIONS_ALONE = [
    "gateway.sizes=60",
    "gateway.embedded=20",
    "gateway.queries=4",
    "gateway.seconds=0.3",
    "gateway.requests=12",
    "gateway.load_concurrency=2",
    "gateway.selectivity=1",
    "gateway.caches=off",
    "gateway.levers=asyncio loop=RAG_UVLOOP=off,uvloop=RAG_UVLOOP=on",
    "scale.drain_records=0",
    "scale.store_rows=0",
    "scale.halfvec_rows=0",
    "scale.retrieval_sizes=",
    "scale.ray_batches=6",
    "scale.ray_batch_ms=20",
    "scale.ray_passes=1",
    "scale.images=8",
    "scale.images_workers_max=1",
]


@pytest.mark.ray
@pytest.mark.slow
def test_the_levers_ray_and_images_sections_report_their_figures(
    sidecar_url: str, pg_server, tmp_path: Path
) -> None:
    suites = run_bench(("gateway", "scale"), SECTIONS_ALONE, sidecar_url, pg_server, tmp_path)

    (point,) = suites["gateway"]["figures"]["points"]
    levers = point["levers"]
    assert list(levers["variants"]) == ["asyncio loop", "uvloop"] and levers["pairs"] == 2
    assert [p["concurrency"] for p in levers["points"]] == [1, 2]
    for p in levers["points"]:
        assert set(p["by_variant"]) == {"asyncio loop", "uvloop", "sql"}
        assert math.isfinite(p["by_variant"]["uvloop"]["cpu_ms_vs_asyncio loop"])
    (table,) = [t for t in suites["gateway"]["tables"] if t["title"].startswith("Levers A/B")]
    assert [row[:2] for row in table["rows"][:3]] == [[1, "asyncio loop"], [1, "uvloop"], [1, "sql"]]

    scale = suites["scale"]
    assert set(scale["figures"]) == {"ray_dispatch", "images"}  # every other section was set to 0
    ray = scale["figures"]["ray_dispatch"]
    assert ray["batches"] == 6 and all(
        sum(p) == 6 for name in ray["batches_per_actor"] for p in ray["batches_per_actor"][name]
    )
    images = scale["figures"]["images"]
    assert images["images"] == 8 and images["bulk_job"]["embedded"] == 8, images["bulk_job"]
    assert [r["workers"] for r in images["decode_curve"]] == [1]
    names = [h["name"] for h in scale["headlines"]]
    assert names == [
        "Ray job wall time, 1 batch in flight per actor (6 batches of 20 ms, 2 actors)",
        "bulk image job images/s (8 images)",
    ]
    assert all(math.isfinite(h["ratio"]) for h in scale["headlines"])
