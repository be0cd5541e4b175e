"""Step 3 of a backfill (:mod:`index.bulk.backfill`): embed the pending records and COPY their rows into
the shadow, a batch per transaction with the records' states, so a step killed anywhere resumes
from the committed batches."""

from __future__ import annotations

import asyncio
from typing import Protocol

import asyncpg

from index.bulk.backfill_types import BackfillOptions, Embedded, Progress, Source
from index.ingest.indexer import Indexer
from index.store import store
from index.store.partitions import ModelPartition
from index.store.store import RecordKey

__all__ = ["EmbedStep", "embed_and_copy", "embed_pending", "record_counts", "records_done"]


async def record_counts(db: asyncpg.Pool, backfill_id: str) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT state, count(*) AS n, sum(rows_written) AS r FROM rag_backfill_records WHERE backfill_id = $1 GROUP BY state",
        backfill_id,
    )
    out = {r["state"]: int(r["n"]) for r in rows}
    out["rows"] = sum(int(r["r"] or 0) for r in rows)
    return out


async def records_done(db: asyncpg.Pool, backfill_id: str) -> tuple[int, int]:
    """(records done, records in the run's scope): where an embed step starts its progress."""
    counts = await record_counts(db, backfill_id)
    total = sum(v for k, v in counts.items() if k != "rows")
    return total - counts.get("pending", 0), total


async def _write_batch(
    pool: asyncpg.Pool,
    shadow_partition: ModelPartition,
    backfill_id: str,
    keys: list[RecordKey],
    embedded: Embedded,
) -> None:
    """COPY a batch's rows into the shadow and mark its records, in one transaction."""
    written = [row for key in keys for row in embedded.rows.get(key, [])]
    async with pool.acquire() as conn, conn.transaction():
        await store.copy_rows(conn, shadow_partition, written)
        await conn.execute(
            """UPDATE rag_backfill_records r
               SET state = k.state, rows_written = k.n, version = k.version, reason = k.reason
               FROM unnest($2::text[], $3::bigint[], $4::text[], $5::int[], $6::bigint[], $7::text[])
                    AS k(section_tipo, section_id, state, n, version, reason)
               WHERE r.backfill_id = $1 AND r.section_tipo = k.section_tipo AND r.section_id = k.section_id""",
            backfill_id,
            [k[0] for k in keys],
            [k[1] for k in keys],
            ["rejected" if k in embedded.rejects else "copied" for k in keys],
            [len(embedded.rows.get(k, ())) for k in keys],
            [embedded.versions.get(k) for k in keys],
            [embedded.rejects.get(k) for k in keys],
        )


async def embed_and_copy(
    pool: asyncpg.Pool, source: Source, indexer: Indexer, backfill_id: str, keys: list[RecordKey]
) -> int:
    """Embed one batch of pending records and COPY it into the shadow, with their states, in one
    transaction (what each of ``--ray``'s writers does per batch). Returns the rows written."""
    embedded = await source.embed(pool, indexer, keys)
    await _write_batch(pool, indexer.partition, backfill_id, keys, embedded)
    return sum(len(embedded.rows.get(key, ())) for key in keys)


class EmbedStep(Protocol):
    """Step 3, embed and COPY every pending record: in this process (the default) or elsewhere
    (:class:`index.bulk.backfill_ray.RayEmbedStep`). Each batch commits its rows and its records'
    states together, so a step killed anywhere resumes from the committed batches."""

    async def __call__(
        self,
        pool: asyncpg.Pool,
        source: Source,
        indexer: Indexer,
        backfill_id: str,
        options: BackfillOptions,
        progress: Progress,
    ) -> None: ...


async def embed_pending(
    pool: asyncpg.Pool,
    source: Source,
    indexer: Indexer,
    backfill_id: str,
    options: BackfillOptions,
    progress: Progress,
) -> None:
    """Embed and COPY the pending records, a batch per transaction, until none is left. Batch n+1
    is embedded while batch n is written (one write at a time); batches follow the records' key
    order, so the next one is read past the last key rather than waiting for the write."""
    done, total = await records_done(pool, backfill_id)
    progress(done, total)
    after: RecordKey = ("", -1)
    writing: asyncio.Task[None] | None = None
    in_flight = 0
    try:
        while True:
            rows = await pool.fetch(
                """SELECT section_tipo, section_id FROM rag_backfill_records
                   WHERE backfill_id = $1 AND state = 'pending' AND (section_tipo, section_id) > ($2, $3)
                   ORDER BY section_tipo, section_id LIMIT $4""",
                backfill_id,
                after[0],
                after[1],
                options.batch_records,
            )
            if not rows:
                break
            keys = [(r["section_tipo"], r["section_id"]) for r in rows]
            after = keys[-1]
            embedded = await source.embed(pool, indexer, keys)
            if writing is not None:
                await writing
                done += in_flight
                progress(done, total)
            writing = asyncio.create_task(_write_batch(pool, indexer.partition, backfill_id, keys, embedded))
            in_flight = len(keys)
    finally:
        if writing is not None:  # a write under way finishes (its transaction commits or rolls back)
            await asyncio.gather(writing, return_exceptions=True)
    if writing is not None:
        await writing  # its error, if it failed
        progress(done + in_flight, total)
