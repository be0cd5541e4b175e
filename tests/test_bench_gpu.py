"""The GPU benchmark: runs without Ray, asyncpg or aiohttp, and its CPU smoke run writes a real report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.gpu import peak_tflops

REPO_ROOT = Path(__file__).resolve().parent.parent

# Runs `python -m benchmarks.cli bench` (what benchmarks/gpu_run.sh runs) with ray, asyncpg and aiohttp
# made unimportable, as on a bare CUDA machine, on the GPU suite's CPU smoke config.
_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, runpy, sys

    BLOCKED = ("ray", "asyncpg", "aiohttp")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed on this machine")
            return None

    sys.meta_path.insert(0, Block())
    sys.argv = ["benchmarks.cli", "bench", *sys.argv[1:]]
    try:
        runpy.run_module("benchmarks.cli", run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("BLOCKED-IMPORTS-OK")
    """
)


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", "bfloat16", 989.0),
        ("NVIDIA H100 80GB HBM3", "float16", 989.0),
        ("NVIDIA H100 PCIe", "bfloat16", 756.0),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
        ("NVIDIA L40S", "bfloat16", 362.0),
        ("NVIDIA L4", "bfloat16", 121.0),
        ("NVIDIA A10", "float16", 125.0),
        ("Tesla T4", "float16", 65.0),
        ("Tesla T4", "bfloat16", None),  # no bf16 tensor cores
        ("NVIDIA A10G", "bfloat16", None),  # not in the table: MFU is left out, not guessed
        ("cpu", "float32", None),
    ],
)
def test_peak_table_matches_device_names(name: str, dtype: str, peak: float | None) -> None:
    assert peak_tflops(name, dtype) == peak


@pytest.mark.slow
def test_gpu_mode_runs_on_cpu_without_ray_asyncpg_or_aiohttp(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["--device", "cpu", "--suite", "gpu", "--set", "gpu.lengths=16,24", "--set", "gpu.seconds=0.2"]
    args += ["--work-dir", str(tmp_path / "models"), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BLOCKED-IMPORTS-OK" in done.stdout

    payload = json.loads((out / "results.json").read_text())
    (suite,) = payload["suites"]
    rows = suite["figures"]["rows"]
    assert [(r["task"], r["tokens_per_item"]) for r in rows] == [
        ("/embed dense + sparse", 16),
        ("/embed dense + sparse", 24),
        ("/image", 16),  # 32 px images, 8 px patches
        ("/text (text tower)", 16),
        ("/image", 16),  # the open_clip backend's tiny CLIP: 32 px, 8 px patches
        ("/text (text tower)", 16),
    ]
    assert rows[4]["model"].startswith("open_clip")
    for row in rows:
        assert math.isfinite(row["items_per_s"]) and math.isfinite(row["raw_items_per_s"])
        assert math.isfinite(row["ratio_to_raw"]) and row["gflops_per_item"] > 0
        assert row["mfu"] is None  # no known peak for a CPU: left out, not invented
        assert 1 <= row["mean_batch"] <= row["batch"]
    text_rows = rows[:2]
    # Attention makes FLOPs per token grow with length; the linear layers alone would keep it flat.
    assert text_rows[1]["gflops_per_item"] / 24 > text_rows[0]["gflops_per_item"] / 16
    faiss = suite["figures"]["faiss"]
    assert faiss["vectors"] == 2000 and [r["batch"] for r in faiss["rows"]] == [1, 4, 16]
    assert faiss["peak_hbm_gbps"] is None  # a CPU: no bandwidth bound invented
    headlines = suite["headlines"]
    assert len(headlines) == 6 and all(h["baseline_name"].startswith("bare forward") for h in headlines)
    assert all(math.isfinite(h["ratio"]) for h in headlines)
    report = (out / "REPORT.md").read_text()
    assert "bge-m3 architecture /embed dense + sparse float32 @24 tok" in report and "MFU" in report


@pytest.mark.parametrize(
    ("name", "gbps"),
    [("NVIDIA H200", 4800.0), ("NVIDIA H100 80GB HBM3", 3350.0), ("NVIDIA H100 PCIe", 2000.0),
     ("NVIDIA A100-SXM4-80GB", 2039.0), ("NVIDIA A100-SXM4-40GB", 1555.0), ("cpu", None)],
)  # fmt: skip
def test_hbm_table_matches_device_names(name: str, gbps: float | None) -> None:
    from benchmarks.gpu_faiss import hbm_gbps

    assert hbm_gbps(name) == gbps


def test_faiss_section_measures_flat_search_on_cpu() -> None:
    from benchmarks.gpu_faiss import FaissBenchConfig, run_faiss_benchmark

    config = FaissBenchConfig(
        device="cpu", vectors=3000, dimension=32, batches=(8,), seconds=0.05, add_slice=1000
    )
    result = run_faiss_benchmark(config)
    assert result["bytes_per_scan"] == 3000 * 32 * 4 and result["storage"] == "fp32"
    single, batched = result["rows"]
    assert single["batch"] == 1 and batched["batch"] == 8
    assert math.isfinite(batched["queries_per_s"]) and math.isfinite(single["p50_ms"])
    assert single["hbm_floor_ms"] is None
