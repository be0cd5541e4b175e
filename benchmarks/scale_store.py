"""The scale suite's store section: the drain's row path against ``mnemo backfill``'s bulk path (COPY
into a shadow, every index built in parallel, the swap), both including every index, on ``bases`` real
MiniLM embeddings reused with noise (a graph as clustered as real data); halfvec against vector; and
the projection of a full re-embedding from this run's bulk path. The row path's rate may be taken on
fewer rows than the bulk path's (an HNSW insert gets dearer as the graph grows, so the ratio is then a
lower bound). benchmarks/README.md says what each figure is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import psutil

from gateway.base.settings import GatewaySettings
from index.bulk.shadow import hnsw_build_bytes
from index.search.read_settings import fetch_with_local_settings, hnsw_scan_settings
from index.store import store
from index.store.partitions import ModelPartition, ensure_partition
from inference.client import SidecarClient
from schema import create_pool

from .bulk_load import bulk_load
from .gateway import load_sentences
from .gpu import peak_tflops
from .gpu_models import BGE_M3_SHAPE
from .measure import tie_aware_recall

__all__ = ["StoreCorpus", "embed_bases", "measure_store_paths", "project_reembed", "write_records"]

SECTION = "scale_store"
CHUNKS_PER_RECORD = 5
COPY_ROWS = 20_000  # rows per COPY statement (and rows held in memory at once)
NOISE = 0.2  # the noise vector's norm against the unit base vector


@dataclass(frozen=True)
class StoreCorpus:
    """Base sentences with their real embeddings; rows are drawn from them deterministically."""

    sentences: list[str]
    vectors: np.ndarray  # (bases, dimension), unit norm

    @property
    def dimension(self) -> int:
        return int(self.vectors.shape[1])

    def row_vectors(self, start: int, stop: int, seed: int = 0) -> np.ndarray:
        """The unit vectors of rows ``start`` .. ``stop`` - 1: row i is base ``i % bases`` plus noise
        seeded by ``start`` (a batch's rows come out the same however often they are drawn)."""
        rng = np.random.default_rng([seed, start])
        base_ids = np.arange(start, stop) % len(self.sentences)
        noise = rng.standard_normal((stop - start, self.dimension)).astype(np.float32)
        noise *= NOISE / np.linalg.norm(noise, axis=1, keepdims=True)
        vectors = self.vectors[base_ids] + noise
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors

    def rows(self, start: int, stop: int, seed: int = 0) -> list[store.EmbeddingRow]:
        """Rows ``start`` .. ``stop`` - 1: row i is base ``i % bases``'s sentence with :meth:`row_vectors`."""
        base_ids = np.arange(start, stop) % len(self.sentences)
        vectors = self.row_vectors(start, stop, seed)
        out = []
        for offset, (i, b) in enumerate(zip(range(start, stop), base_ids, strict=True)):
            text = self.sentences[b]
            out.append(
                store.EmbeddingRow(
                    "text",
                    SECTION,
                    i // CHUNKS_PER_RECORD + 1,
                    "rag:doc",
                    "lg-eng",
                    i % CHUNKS_PER_RECORD,
                    hashlib.sha256(f"{i}:{text}".encode()).hexdigest(),
                    text,
                    text,
                    vectors[offset],
                    projects=(1 + (i // CHUNKS_PER_RECORD) % 3,),
                )
            )
        return out


async def embed_bases(client: SidecarClient, model: str, bases: int) -> StoreCorpus:
    """``bases`` real sentences of the bundled corpora and their embeddings by ``model``."""
    sentences = load_sentences(bases)[:bases]
    vectors = []
    for start in range(0, len(sentences), 64):
        result = await client.embed(model, sentences[start : start + 64], truncate=True)
        vectors.append(result.embeddings)
    matrix = np.concatenate(vectors).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return StoreCorpus(sentences, matrix)


class _PeakMemory:
    """The peak of the PostgreSQL server's summed resident memory, sampled every ``interval`` s."""

    def __init__(self, postmaster_pid: int, interval: float = 0.5) -> None:
        self.root = psutil.Process(postmaster_pid)
        self.interval = interval
        self.peak = 0

    def sample(self) -> None:
        total = 0
        for proc in [self.root, *self.root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        self.peak = max(self.peak, total)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[_PeakMemory]:
        async def loop() -> None:
            while True:
                await asyncio.to_thread(self.sample)
                await asyncio.sleep(self.interval)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.sample()


async def _postmaster_pid(pool: asyncpg.Pool) -> int:
    """The server's postmaster (first line of ``postmaster.pid``; the server must be on this host)."""
    data_dir = await pool.fetchval("SHOW data_directory")
    return int((Path(data_dir) / "postmaster.pid").read_text().split("\n", 1)[0])


async def _sizes(pool: asyncpg.Pool, partition: ModelPartition) -> dict[str, int]:
    row = await pool.fetchrow(
        "SELECT pg_total_relation_size($1::regclass) AS total, pg_relation_size($1::regclass) AS heap, "
        "coalesce(pg_relation_size(to_regclass($2)), 0) AS hnsw",
        partition.table,
        '"' + partition.partition + '_hnsw"',
    )
    return {"total_bytes": row["total"], "heap_bytes": row["heap"], "hnsw_bytes": row["hnsw"]}


def _record_batches(corpus: StoreCorpus, rows: int, first: int = 0) -> Iterator[list[store.EmbeddingRow]]:
    """Rows ``first`` .. ``first + rows`` - 1, a record's rows at a time (``first`` a whole record)."""
    for start in range(first, first + rows, COPY_ROWS):
        batch = corpus.rows(start, min(first + rows, start + COPY_ROWS))
        for first in range(0, len(batch), CHUNKS_PER_RECORD):
            yield batch[first : first + CHUNKS_PER_RECORD]


async def write_records(
    pool: asyncpg.Pool,
    partition: ModelPartition,
    records: Iterable[Sequence[store.EmbeddingRow]],
    writers: int,
    *,
    prune: bool = True,
) -> float:
    """Seconds for ``writers`` connections to write ``records`` as the drain's writer does: one
    transaction per record, its upsert (and, with ``prune``, the prune of its stale tail)."""
    cursor = iter(records)

    async def writer() -> None:
        for rows in cursor:  # one shared iterator: each record is written once
            async with pool.acquire() as conn, conn.transaction():
                await store.upsert_rows(conn, partition, rows)
                if prune:
                    await store.prune_rows(conn, partition, rows[0].record, "text", [r.slot for r in rows])

    started = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return time.perf_counter() - started


async def _row_path(
    pool: asyncpg.Pool,
    corpus: StoreCorpus,
    rows: int,
    writers: int,
    model: str = "scale-store-row-path",
    first: int = 0,
) -> dict[str, Any]:
    """The drain's writer into ``model``'s partition (a fresh one by default; the bulk path's built
    graph to measure an insert at that graph's size)."""
    partition = await ensure_partition(pool, model, corpus.dimension)
    seconds = await write_records(pool, partition, _record_batches(corpus, rows, first), writers)
    return {"rows": rows, "seconds": seconds, "rows_per_s": rows / seconds, **await _sizes(pool, partition)}


BULK_MODEL = "scale-store-bulk-path"


async def _bulk_path(
    pool: asyncpg.Pool,
    corpus: StoreCorpus,
    rows: int,
    build_workers: int,
    model: str = BULK_MODEL,
) -> dict[str, Any]:
    partition = await ensure_partition(pool, model, corpus.dimension)
    batches = (corpus.rows(start, min(rows, start + COPY_ROWS)) for start in range(0, rows, COPY_ROWS))
    async with pool.acquire() as conn:
        loaded = await bulk_load(conn, partition, batches, build_workers=build_workers)
    phases = loaded["phase_seconds"]
    seconds = sum(phases.values())
    return {
        "rows": rows,
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "phase_seconds": {k: round(v, 3) for k, v in phases.items()},
        "generate_seconds_excluded": round(loaded["generate_seconds"], 3),
        "bound": max(phases, key=phases.__getitem__),
        "vector_type": partition.vector_type,
        "maintenance_work_mem_mb": loaded["maintenance_work_mem_mb"],
        "hnsw_estimate_bytes": loaded["hnsw_estimate_bytes"],
        **await _sizes(pool, partition),
    }


async def measure_store_paths(
    database_url: str,
    corpus: StoreCorpus,
    *,
    rows: int,
    row_rows: int,
    row_writers: int,
    build_workers: int,
    recall_queries: int = 0,
    recall_ef_search: Sequence[int] = (),
) -> dict[str, Any]:
    """Both paths on one fresh database (empty partitions of their own), with PostgreSQL's peak memory.

    When the row path writes fewer rows than the bulk path (``row_rows < rows``: a million rows
    one transaction at a time takes hours), its rate on a small graph flatters it, since an HNSW
    insert gets dearer as the graph grows. So the same ``row_rows`` are then also written, the
    same way, into the bulk path's built graph (``row_path_at_size``), and the speedup is taken
    against that rate. With ``recall_queries``, the built graph's recall@10 is measured at each
    ``recall_ef_search`` first (``recall_by_ef_search``)."""
    pool = await create_pool(database_url, max_size=row_writers + 2)
    at_size: dict[str, Any] | None = None
    try:
        pid = await _postmaster_pid(pool)
        async with _PeakMemory(pid).watching() as memory:
            row = await _row_path(pool, corpus, row_rows, row_writers)
        row["postgres_peak_rss_bytes"] = memory.peak
        async with _PeakMemory(pid).watching() as memory:
            bulk = await _bulk_path(pool, corpus, rows, build_workers)
        bulk["postgres_peak_rss_bytes"] = memory.peak
        recall: dict[int, float] = {}
        if recall_queries and recall_ef_search:
            partition = await ensure_partition(pool, BULK_MODEL, corpus.dimension)
            probe = probe_vectors(corpus, recall_queries)
            recall = await recall_by_ef_search(pool, partition, probe, recall_ef_search)
        if row_rows < rows:
            async with _PeakMemory(pid).watching() as memory:
                at_size = await _row_path(pool, corpus, row_rows, row_writers, BULK_MODEL, first=rows)
            at_size["postgres_peak_rss_bytes"] = memory.peak
            at_size["graph_rows_before"] = rows
    finally:
        await pool.close()
    baseline = at_size or row
    return {
        "dimension": corpus.dimension,
        "bases": len(corpus.sentences),
        "row_path": row,
        "row_path_at_size": at_size,
        "bulk_path": bulk,
        "recall_by_ef_search": {"queries": recall_queries, "rows": rows, "recall_at_10": recall},
        "speedup": bulk["rows_per_s"] / baseline["rows_per_s"],
        "speedup_against_empty_graph": bulk["rows_per_s"] / row["rows_per_s"],
    }


# -- halfvec against vector ------------------------------------------------------------------------


def probe_vectors(corpus: StoreCorpus, queries: int, seed: int = 7) -> np.ndarray:
    """``queries`` unit vectors near the corpus's bases (a base plus the rows' noise level)."""
    rng = np.random.default_rng(seed)
    probe = corpus.vectors[rng.integers(0, len(corpus.vectors), queries)]
    probe = probe + (NOISE / np.sqrt(corpus.dimension)) * rng.standard_normal(probe.shape).astype(np.float32)
    return probe / np.linalg.norm(probe, axis=1, keepdims=True)


async def recall_by_ef_search(
    pool: asyncpg.Pool, partition: ModelPartition, queries: np.ndarray, ef_values: Sequence[int]
) -> dict[int, float]:
    """Mean recall@10 of the HNSW index at each ``hnsw.ef_search`` (iterative scan on, as the
    dense leg runs it) against one exact scan per query of the same partition (tie-aware)."""
    cast = partition.cast
    sql = f"SELECT section_id, chunk_index, embedding::vector <=> $1::vector AS d FROM {partition.table} ORDER BY embedding::{cast} <=> $1::{cast} LIMIT 10"
    exact_sql = f"SELECT section_id, chunk_index, embedding::vector <=> $1::vector AS d FROM {partition.table} ORDER BY 3 LIMIT 10"
    totals = dict.fromkeys(ef_values, 0.0)
    # The dense leg's own scan settings at each ef_search (and the gateway's default tuple bound),
    # set as the leg sets them.
    max_scan_tuples = GatewaySettings().hnsw_max_scan_tuples
    scans = {ef: hnsw_scan_settings(ef, max_scan_tuples) for ef in ef_values}
    async with pool.acquire() as conn:
        for q in queries:
            exact_rows = await fetch_with_local_settings(conn, {"enable_indexscan": "off"}, exact_sql, [q])
            exact = [((r["section_id"], r["chunk_index"]), r["d"]) for r in exact_rows]
            for ef in ef_values:
                got = await fetch_with_local_settings(conn, scans[ef], sql, [q])
                totals[ef] += tie_aware_recall(
                    [((r["section_id"], r["chunk_index"]), r["d"]) for r in got], exact
                )
    return {ef: total / len(queries) for ef, total in totals.items()}


async def measure_halfvec(
    database_url: str,
    corpus: StoreCorpus,
    *,
    rows: int,
    queries: int,
    build_workers: int,
    ef_search: int = 100,
) -> dict[str, Any]:
    """The same rows through the bulk path into a ``vector`` and a ``halfvec`` partition
    (``RAG_VECTOR_TYPE``): HNSW size, build seconds and recall@10 against exact search."""
    probe = probe_vectors(corpus, queries)
    out: dict[str, Any] = {"rows": rows, "queries": queries, "ef_search": ef_search}
    for vector_type in ("vector", "halfvec"):
        pool = await create_pool(database_url, max_size=2, vector_type=vector_type)
        try:
            built = await _bulk_path(pool, corpus, rows, build_workers, model=f"scale-store-{vector_type}")
            partition = await ensure_partition(pool, f"scale-store-{vector_type}", corpus.dimension)
            out[vector_type] = {
                "hnsw_bytes": built["hnsw_bytes"],
                "build_seconds": built["phase_seconds"]["build"],
                "recall_at_10": (await recall_by_ef_search(pool, partition, probe, [ef_search]))[ef_search],
            }
        finally:
            await pool.close()
    return out


# -- the projection on paper ------------------------------------------------------------------------


def _flops_per_token(shape: dict[str, int], tokens: int) -> float:
    """Forward FLOPs per token of a BERT-shaped encoder: the layers' matmuls plus attention."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    return layers * (2 * (4 * h * h + 2 * h * i) + 4 * tokens * h)


def project_reembed(
    measured: dict[str, Any],
    *,
    chunks: int = 5_000_000,
    dimension: int = 1024,
    tokens_per_chunk: int = 256,
    gpu: str = "H200",
    mfu: float = 0.4,
    cores_measured: int = 2,
    cores_target: int = 16,
) -> dict[str, Any]:
    """Wall time to re-embed ``chunks`` chunks of ``dimension`` (bge-m3) on one ``gpu``, on paper.

    - **Embed**: bge-m3's forward FLOPs per token (:data:`benchmarks.gpu_models.BGE_M3_SHAPE`) at ``mfu``
      of the GPU's peak bf16 (:func:`benchmarks.gpu.peak_tflops`). No GPU run is on record yet:
      ``mfu`` is an assumption, which the gpu suite replaces with a measurement when a device is lent.
    - **COPY**: the measured bulk rows/s, scaled by row bytes (vector 4 bytes a dimension).
    - **HNSW build**: the measured build time, scaled by ``n log n`` in rows, by dimension (the
      distance computations), and by cores (parallel maintenance workers; linear scaling is optimistic).
    The stages overlap in a backfill (COPY while embedding; the build after), so the wall time is
    ``max(embed, copy) + build``, and the larger term names the bound.
    """
    bulk = measured["bulk_path"]
    n0, d0 = bulk["rows"], measured["dimension"]
    peak = peak_tflops(gpu, "bfloat16")
    if peak is None:
        raise ValueError(f"no peak TFLOPS known for {gpu!r}")
    tokens_per_s = peak * 1e12 * mfu / _flops_per_token(BGE_M3_SHAPE, tokens_per_chunk)
    embed_s = chunks * tokens_per_chunk / tokens_per_s
    row_bytes0, row_bytes = d0 * 4 + 600, dimension * 4 + 600  # vector plus the row's text and keys
    copy_s = bulk["phase_seconds"]["copy"] * (chunks / n0) * (row_bytes / row_bytes0)
    growth = (chunks * math.log(chunks)) / (n0 * math.log(n0))
    build_s = bulk["phase_seconds"]["build"] * growth * (dimension / d0) * (cores_measured / cores_target)
    stages = {"embed": embed_s, "copy": copy_s, "build": build_s}
    wall = max(embed_s, copy_s) + build_s
    return {
        "chunks": chunks,
        "dimension": dimension,
        "gpu": gpu,
        "assumed_mfu": mfu,
        "embed_tokens_per_s": tokens_per_s,
        "stage_seconds": {k: round(v) for k, v in stages.items()},
        "wall_seconds": round(wall),
        "bound": "build"
        if build_s > max(embed_s, copy_s)
        else max(("embed", embed_s), ("copy", copy_s), key=lambda kv: kv[1])[0],
        "hnsw_memory_bytes": hnsw_build_bytes(chunks, dimension, "vector"),
    }
