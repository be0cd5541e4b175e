"""The store's two write paths for a backfill, both including the HNSW index (issue 23), same run:

- **row path**: what the drain does, one transaction per record with the indexer's multi-row
  upsert and the stale-tail prune (:func:`index.store.upsert_rows` / ``prune_rows``) into a
  partition whose HNSW index is maintained row by row;
- **bulk path**: what ``mnemo backfill`` does: binary ``COPY`` (:func:`index.store.copy_rows`)
  into the partition's shadow without indexes, then the indexes built from the catalog with
  parallel maintenance workers (:func:`index.shadow.build_indexes`), then the swap.

The figure is ``bulk rows/s / row rows/s``. No model runs: the vectors are clustered
(``--centers`` random unit vectors, each row one of them plus normalized noise) so the graph is
not a uniform cloud, and every row carries real-sized text. Run it::

    python -m benchmarks.bulk_store --rows 20000            # a throw-away embedded PostgreSQL
    python -m benchmarks.bulk_store --rows 100000 --database-url postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg
import numpy as np

from index import shadow, store
from index.change_feed import Watermark
from index.partitions import ModelPartition, ensure_partition
from index.store import EmbeddingRow

ROWS_PER_RECORD = 5
COPY_BATCH = 5_000


def make_rows(n: int, dimension: int, centers: int, seed: int = 0) -> list[EmbeddingRow]:
    """``n`` text rows of ``n / ROWS_PER_RECORD`` records with clustered unit vectors."""
    rng = np.random.default_rng(seed)
    middle = rng.standard_normal((centers, dimension)).astype(np.float32)
    middle /= np.linalg.norm(middle, axis=1, keepdims=True)
    vectors = middle[rng.integers(0, centers, n)] + 0.15 * rng.standard_normal((n, dimension)).astype(
        np.float32
    )
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    words = "the reservoir rose a hand each night and the village carried its bells to higher ground".split()
    rows = []
    for i in range(n):
        text = " ".join(words[(i + k) % len(words)] for k in range(60))
        rows.append(
            EmbeddingRow(
                modality="text",
                section_tipo="bench",
                section_id=i // ROWS_PER_RECORD,
                component_tipo="rag:summary",
                lang="lg-eng",
                chunk_index=i % ROWS_PER_RECORD,
                source_hash=f"{i:064x}",
                source_text=text,
                lexical_text=text,
                embedding=vectors[i],
                projects=(1,),
                chunk_meta={"group": "summary", "contributors": ["oh1"]},
            )
        )
    return rows


async def row_path(pool: asyncpg.Pool, partition: ModelPartition, rows: list[EmbeddingRow]) -> float:
    """Seconds to write ``rows`` as the drain does: per record, upsert and prune in one transaction."""
    started = time.perf_counter()
    for first in range(0, len(rows), ROWS_PER_RECORD):
        record = rows[first : first + ROWS_PER_RECORD]
        async with pool.acquire() as conn, conn.transaction():
            await store.upsert_rows(conn, partition, record)
            await store.prune_rows(conn, partition, record[0].record, "text", [r.slot for r in record])
    return time.perf_counter() - started


async def bulk_path(
    pool: asyncpg.Pool, partition: ModelPartition, rows: list[EmbeddingRow], *, workers: int, memory: str
) -> dict[str, float]:
    """Seconds of each bulk stage: COPY into the shadow, the index build, the swap."""
    backfill_id = f"bench-{partition.partition}"
    async with pool.acquire() as conn:
        await shadow.create_shadow(conn, partition)
        # A backfill row and its scope, so the swap stamps every new key as a real run does.
        await conn.execute(
            """INSERT INTO rag_backfills (backfill_id, target_model, source, source_detail, shadow_table, state)
               VALUES ($1, $2, 'jsonl', '{}', $3, 'embedding')""",
            backfill_id,
            partition.model,
            shadow.shadow_of(partition).partition,
        )
        await conn.execute(
            """INSERT INTO rag_backfill_records (backfill_id, section_tipo, section_id, state)
               SELECT $1, 'bench', g, 'copied' FROM generate_series(0, $2) g""",
            backfill_id,
            len(rows) // ROWS_PER_RECORD,
        )
        await shadow.copy_out_of_scope(conn, partition, backfill_id)
        row = await conn.fetchrow(
            "SELECT target_seq, target_xmin FROM rag_backfills WHERE backfill_id = $1", backfill_id
        )
        watermark = Watermark(row["target_seq"], row["target_xmin"])
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    for first in range(0, len(rows), COPY_BATCH):
        async with pool.acquire() as conn, conn.transaction():
            await store.copy_rows(conn, shadow.shadow_of(partition), rows[first : first + COPY_BATCH])
    seconds["copy"] = time.perf_counter() - started
    started = time.perf_counter()
    async with pool.acquire() as conn:
        await shadow.build_indexes(conn, partition, workers=workers, memory=memory)
    seconds["build"] = time.perf_counter() - started
    started = time.perf_counter()
    async with pool.acquire() as conn:
        await shadow.swap(conn, partition, backfill_id, watermark)
    seconds["swap"] = time.perf_counter() - started
    return seconds


async def run(
    pool: asyncpg.Pool, n: int, dimension: int, centers: int, workers: int, memory: str
) -> dict[str, Any]:
    rows = make_rows(n, dimension, centers)
    row_partition = await ensure_partition(pool, "bench-row-path", dimension)
    bulk_partition = await ensure_partition(pool, "bench-bulk-path", dimension)
    row_s = await row_path(pool, row_partition, rows)
    bulk = await bulk_path(pool, bulk_partition, rows, workers=workers, memory=memory)
    bulk_s = sum(bulk.values())
    counts = [await pool.fetchval(f"SELECT count(*) FROM {p.table}") for p in (row_partition, bulk_partition)]
    return {
        "rows": n,
        "dimension": dimension,
        "build_workers": workers,
        "maintenance_work_mem": memory,
        "hnsw_estimate_mib": round(shadow.hnsw_build_bytes(n, dimension, "vector") / 2**20, 1),
        "row_path_s": round(row_s, 2),
        "row_path_rows_per_s": round(n / row_s, 1),
        "bulk_path_s": {k: round(v, 2) for k, v in bulk.items()},
        "bulk_path_rows_per_s": round(n / bulk_s, 1),
        "bulk_over_row": round(row_s / bulk_s, 2),
        "rows_stored": counts,
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from .ingest import _database

    async with _database(args.database_url) as pool:
        return await run(
            pool, args.rows, args.dimension, args.centers, args.build_workers, args.maintenance_work_mem
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bulk_store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dimension", type=int, default=384)
    parser.add_argument("--centers", type=int, default=200, help="clusters the vectors gather around")
    parser.add_argument("--build-workers", type=int, default=2)
    parser.add_argument("--maintenance-work-mem", default="1GB")
    parser.add_argument("--database-url", default=None, help="default: a throw-away embedded PostgreSQL")
    print(json.dumps(asyncio.run(_main(parser.parse_args(argv))), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
