"""Loading a benchmark's corpus the way a backfill does, instead of row by row or with live indexes."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import asyncpg

from index.bulk.shadow import build_indexes, create_shadow, hnsw_build_bytes, shadow_of, swap
from index.store import store
from index.store.change_feed import current_watermark
from index.store.partitions import ModelPartition

__all__ = ["bulk_load"]


async def bulk_load(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    batches: Iterable[Sequence[store.EmbeddingRow]],
    *,
    build_workers: int,
) -> dict[str, Any]:
    """The backfill's bulk path for a benchmark's corpus: COPY ``batches`` into the partition's
    shadow (no index), build the live partition's indexes on it, swap it in. The build's
    ``maintenance_work_mem`` is the HNSW estimate plus a tenth, so it never spills nor over-asks.
    Time spent producing the batches is measured apart (``generate_seconds``), not as COPY.
    The partition must be empty: the swap replaces its table, rows and all."""
    if await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {partition.table})"):
        raise ValueError(f"bulk_load needs an empty partition; {partition.table} has rows")
    watermark = await current_watermark(conn, partition)
    phases: dict[str, float] = {}
    started = time.perf_counter()
    await create_shadow(conn, partition)
    shadow = shadow_of(partition)
    generating, rows = 0.0, 0
    produced = iter(batches)
    while True:
        made = time.perf_counter()
        batch = next(produced, None)
        generating += time.perf_counter() - made
        if batch is None:
            break
        rows += len(batch)
        await store.copy_rows(conn, shadow, batch)
    phases["copy"] = time.perf_counter() - started - generating
    need = hnsw_build_bytes(rows, partition.dimension, partition.vector_type)
    memory_mb = max(64, math.ceil(need * 1.1 / 2**20))
    started = time.perf_counter()
    built = await build_indexes(conn, partition, workers=build_workers, memory=f"{memory_mb}MB")
    phases["build"] = time.perf_counter() - started
    started = time.perf_counter()
    await swap(conn, partition, "bench-bulk-load", watermark)
    phases["swap"] = time.perf_counter() - started
    return {
        "rows": rows,
        "phase_seconds": phases,
        "generate_seconds": generating,
        "maintenance_work_mem_mb": memory_mb,
        "hnsw_estimate_bytes": built["hnsw_bytes_estimate"],
    }
