"""The scale suite's FAISS cache cells on a small store (real PostgreSQL, real FAISS, real worker
processes started as the suite starts them): 32 callers with the cache on and off, the sync lag
under a writer that leaves the store as it was, and the workers reading the store or mapping its
snapshot."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from benchmarks.gateway import gateway_read_pool
from benchmarks.lexical import populate
from benchmarks.scale_store import StoreCorpus
from benchmarks.search_scale import exact_top10, measure_dense_cache
from benchmarks.vector_cache import MAPPED_MODES, mapped_workers


def _corpus() -> StoreCorpus:
    bases = np.random.default_rng(3).standard_normal((9, 8)).astype(np.float32)
    return StoreCorpus([f"base {i}" for i in range(9)], bases / np.linalg.norm(bases, axis=1, keepdims=True))


async def test_the_cache_under_load_is_measured_and_its_writer_leaves_the_store_as_it_was(
    database_url: str,
) -> None:
    corpus = _corpus()
    texts = [f"chunk {i} of the cache store" for i in range(300)]
    probes = corpus.row_vectors(1000, 1004)
    pool = await gateway_read_pool(database_url)
    try:
        partition = await populate(
            pool, texts, model="bench-cache-load-8", dimension=8, vectors=corpus.row_vectors
        )
        before = await pool.fetch(
            f"SELECT section_id, source_text, embedding::real[] AS v FROM {partition.table} ORDER BY 1"
        )
        exact = await exact_top10(pool, partition, probes)
        cache = await measure_dense_cache(pool, database_url, partition, probes, exact, 1, texts, seconds=0.5)
        after = await pool.fetch(
            f"SELECT section_id, source_text, embedding::real[] AS v FROM {partition.table} ORDER BY 1"
        )
    finally:
        await pool.close()
    assert set(cache["callers_32"]) == {"cache on", "cache off"}
    assert all(math.isfinite(c["p50_ms"]) and math.isfinite(c["qps"]) for c in cache["callers_32"].values())
    sync = cache["sync"]
    assert sync["rows_written"] >= 32 and sync["rows_written"] % 32 == 0
    # Every transaction reached the cache (a key written in two of them may be applied once).
    assert sync["unapplied_transactions"] == 0 and 0 < sync["changes_applied"] <= sync["rows_written"]
    assert [(r["section_id"], r["source_text"]) for r in after] == [
        (r["section_id"], r["source_text"]) for r in before
    ]
    np.testing.assert_allclose([r["v"] for r in after], [r["v"] for r in before])


async def test_mapped_workers_run_as_processes_and_report_each_ones_cost(
    database_url: str, tmp_path: Path
) -> None:
    corpus = _corpus()
    pool = await gateway_read_pool(database_url)
    try:
        partition = await populate(pool, [f"chunk {i}" for i in range(200)], model="bench-cache-workers-8",
                                   dimension=8, vectors=corpus.row_vectors)  # fmt: skip
    finally:
        await pool.close()
    result = await mapped_workers(database_url, partition, tmp_path / "vectors")
    assert (tmp_path / "vectors").is_dir() and math.isfinite(result["snapshot_s"])
    for mode in MAPPED_MODES:
        first, second = result[mode]
        assert first["vectors"] == second["vectors"] == 200, mode
        for worker in (first, second):
            assert set(worker["latency_ms"]) == {"unfiltered", "ACL 10%"}
            assert worker["uss"] > 0 and math.isfinite(worker["ready_s"])
