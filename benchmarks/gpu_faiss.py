"""The FAISS section of GPU mode: exact flat search at 1M x 1024 fp16, against the HBM bound.

What the gateway's cache does on a GPU (:class:`index.vectors.faiss_backend.GpuFlatIndex`): a
``GpuIndexFlatIP`` with fp16 storage, searched for the top 10. Measured:

- single-query latency (p50/p95 of synchronous searches: every call scans the whole matrix);
- batched queries/s at several batch sizes (one scan serves the whole batch);
- the bound: a full scan must read ``n x d x 2`` bytes from HBM, so one scan takes at least
  ``bytes / bandwidth`` (:data:`PEAK_HBM_GBPS`, data-sheet figures); single-query latency is
  reported against that floor, and batched throughput as the share of peak bandwidth it implies
  (``scans/s x bytes / bandwidth``; above 100% means the batch is compute-bound, not memory-bound).

Vectors are random (speed does not depend on their values) and added in slices, so the host never
holds the whole fp32 matrix. Only faiss and numpy are imported (no torch needed for this section).
``device="cpu"`` runs the same measurements on a CPU ``IndexFlatIP`` (a smoke run at small sizes).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PEAK_HBM_GBPS", "FaissBenchConfig", "hbm_gbps", "run_faiss_benchmark"]

# Peak memory bandwidth in GB/s (10^9 bytes/s) per NVIDIA's data sheets; the first match wins.
PEAK_HBM_GBPS: tuple[tuple[str, float], ...] = (
    (r"GB200", 8000.0),
    (r"B200", 8000.0),
    (r"H200 NVL", 4800.0),
    (r"H200", 4800.0),
    (r"H100 PCIe", 2000.0),
    (r"H100 NVL", 3900.0),
    (r"H100|H800|GH200", 3350.0),
    (r"A100.*80GB|A800.*80GB", 2039.0),
    (r"A100|A800", 1555.0),
    (r"L40S|L40\b", 864.0),
    (r"\bL4\b", 300.0),
    (r"\bA10\b", 600.0),
    (r"RTX 6000 Ada", 960.0),
    (r"RTX 4090", 1008.0),
    (r"V100", 900.0),
    (r"\bT4\b", 320.0),
)


def hbm_gbps(device_name: str) -> float | None:
    """Peak memory bandwidth (GB/s) of a GPU by name, or None when unknown."""
    for pattern, gbps in PEAK_HBM_GBPS:
        if re.search(pattern, device_name):
            return gbps
    return None


@dataclass(frozen=True)
class FaissBenchConfig:
    device: str = "cuda"
    vectors: int = 1_000_000
    dimension: int = 1024
    fp16: bool = True
    k: int = 10
    batches: tuple[int, ...] = (16, 128, 1024)
    seconds: float = 3.0  # per measurement
    add_slice: int = 100_000


def _build(config: FaissBenchConfig) -> tuple[Any, Any]:
    import faiss

    resources = None
    if config.device.startswith("cuda"):
        if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() == 0:
            raise RuntimeError("the FAISS section needs faiss-gpu and a GPU (pip install '.[gpu]')")
        resources = faiss.StandardGpuResources()
        flat = faiss.GpuIndexFlatConfig()
        flat.useFloat16 = config.fp16
        flat.device = int(config.device.partition(":")[2] or 0)
        index = faiss.GpuIndexFlatIP(resources, config.dimension, flat)
    else:
        index = faiss.IndexFlatIP(config.dimension)
    rng = np.random.default_rng(0)
    for start in range(0, config.vectors, config.add_slice):
        n = min(config.add_slice, config.vectors - start)
        block = rng.standard_normal((n, config.dimension), dtype=np.float32)
        block /= np.linalg.norm(block, axis=1, keepdims=True)
        index.add(block)
    return index, resources  # the resources must outlive the index


def _times(fn: Any, seconds: float, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        fn()
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(out) < 5:
        start = time.perf_counter()
        fn()  # a FAISS search returns host arrays: the call is synchronized
        out.append(time.perf_counter() - start)
    return out


def run_faiss_benchmark(config: FaissBenchConfig, device_name: str = "cpu") -> dict[str, Any]:
    """Single-query latency and batched queries/s of an exact flat search; a JSON-able dict."""
    import faiss

    started = time.perf_counter()
    index, _resources = _build(config)
    build_s = time.perf_counter() - started
    bytes_per_scan = config.vectors * config.dimension * (2 if config.fp16 and config.device != "cpu" else 4)
    peak = hbm_gbps(device_name) if config.device.startswith("cuda") else None
    floor_ms = None if peak is None else bytes_per_scan / (peak * 1e9) * 1e3
    queries = np.random.default_rng(1).standard_normal(
        (max(config.batches), config.dimension), dtype=np.float32
    )
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    single = _times(lambda: index.search(queries[:1], config.k), config.seconds)
    p50, p95 = float(np.percentile(single, 50)) * 1e3, float(np.percentile(single, 95)) * 1e3
    rows = [
        {
            "batch": 1,
            "p50_ms": p50,
            "p95_ms": p95,
            "queries_per_s": 1e3 / p50,
            "hbm_floor_ms": floor_ms,
            "share_of_peak_bandwidth": None if floor_ms is None else floor_ms / p50,
        }
    ]
    for batch in config.batches:
        times = _times(lambda b=batch: index.search(queries[:b], config.k), config.seconds)
        t50 = float(np.percentile(times, 50))
        rows.append(
            {
                "batch": batch,
                "p50_ms": t50 * 1e3,
                "p95_ms": float(np.percentile(times, 95)) * 1e3,
                "queries_per_s": batch / t50,
                "hbm_floor_ms": floor_ms,
                # One scan per call: the bandwidth the call would need if it only read the matrix once.
                "share_of_peak_bandwidth": None if peak is None else bytes_per_scan / t50 / (peak * 1e9),
            }
        )
    return {
        "device": config.device,
        "device_name": device_name,
        "faiss": faiss.__version__,
        "vectors": config.vectors,
        "dimension": config.dimension,
        "storage": "fp16" if config.fp16 and config.device != "cpu" else "fp32",
        "k": config.k,
        "bytes_per_scan": bytes_per_scan,
        "peak_hbm_gbps": peak,
        "build_s": build_s,
        "rows": rows,
    }
