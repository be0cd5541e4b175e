"""One 1% scope of 1M vectors (384 dimensions), searched three ways at one thread (the gateway's
RAG_FAISS_THREADS default): FAISS's bitmap selector over every slot, a numpy gather of the permitted
rows, and a contiguous packed copy (index.packed_scopes). From the repository root:
python benchmarks/results/2026-12-02/packed-scopes/flat_vs_packed.py (output: flat-vs-packed.txt)"""

import sys
import time

import numpy as np

sys.path.insert(0, ".")
from index.faiss_backend import FlatIndex, limit_cpu_threads
from index.packed_scopes import PackedScope

limit_cpu_threads(1)
N, D, K = 1_000_000, 384, 88  # K: the cache's first fetch for the gateway's over-fetch of 40
rng = np.random.default_rng(0)
index = FlatIndex(D)
for _ in range(N // 100_000):
    v = rng.standard_normal((100_000, D)).astype(np.float32)
    index.append(v / np.linalg.norm(v, axis=1, keepdims=True))
query = rng.standard_normal(D).astype(np.float32)
query /= np.linalg.norm(query)


def p50_ms(f, runs: int = 21) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def report(share: float) -> None:
    mask = np.zeros(N, dtype=bool)
    mask[:: int(1 / share)] = True
    slots = np.flatnonzero(mask).astype(np.int64)
    bitmap = np.packbits(mask, bitorder="little")
    packed = PackedScope(slots, index.vectors(slots), 0)
    none = np.zeros(0, dtype=np.int64)
    want = set(index.search(query, K, bitmap)[1].tolist())
    assert set(packed.top(query, K, none).tolist()) == want
    view = index._view()
    print(f"{share:.0%} scope ({len(slots):,} of {N:,} vectors), p50 of 21:")
    print(f"  bitmap selector, with building the bitmap: {p50_ms(lambda: index.search(query, K, np.packbits(mask, bitorder='little'))):.2f} ms")  # fmt: skip
    print(f"  numpy gather of the permitted rows:        {p50_ms(lambda: view[slots] @ query):.2f} ms")
    print(f"  packed copy (PackedScope.top):             {p50_ms(lambda: packed.top(query, K, none)):.2f} ms")
    print(f"  taking the packed copy once:               {p50_ms(lambda: index.vectors(slots), 5):.2f} ms")


for share in (0.01, 0.02):
    report(share)
