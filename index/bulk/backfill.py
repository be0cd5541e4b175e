"""Bulk backfill (``mnemo backfill``): rebuild a model's partition from a whole section's queued
records, a JSONL export, or another model's partition (a model change), without touching the live
partition until one atomic swap.

The run, in order (each step durable in ``rag_backfills`` / ``rag_backfill_records``, so a
killed run resumes where it stopped when the same command runs again):

1. **Scope.** The records the backfill replaces, one ``pending`` row each:
   - ``queue``: the sections' ready ``index`` records in ``rag_index_queue`` (records with images
     stay for the drain, whose image step they need). They are leased to the backfill
     (``backfill:<id>``) and the lease is renewed while it runs, so drains skip them;
   - ``jsonl``: the file's records, validated like ``mnemo ingest records`` (a bad line goes to
     the rejects report);
   - ``model``: every record with text rows in the source model's partition.
2. **Shadow.** :mod:`index.bulk.shadow` creates the target partition's shadow (no index) and copies
   the live rows outside the scope into it.
3. **Embed and COPY.** Batches of pending records are chunked and embedded exactly as the drain
   does (:class:`index.ingest.indexer.Indexer`; a model change re-embeds each stored chunk's text,
   rebuilt from the row and checked against its ``source_hash``) and written with binary COPY
   (:func:`index.store.store.copy_rows`). A batch's rows and its records' ``copied`` state commit
   together: never a record twice, never a record lost. A record that fails is ``rejected`` with
   its reason (the rejects report) and the run goes on; its live rows are kept at the swap.
4. **Build** the indexes (:func:`index.bulk.shadow.build_indexes`, with the memory check).
5. **Swap** (:func:`index.bulk.shadow.swap`). A model change first embeds again the records the
   source partition changed meanwhile, and the swap makes the new model the one that serves
   text queries (``rag_serving_models``). The queue source then completes the records it
   indexed (a record pushed again meanwhile stays queued for the drain) and gives back its leases.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from index.bulk import shadow
from index.bulk.backfill_copy import EmbedStep, embed_and_copy, embed_pending, record_counts, records_done
from index.bulk.backfill_sources import JsonlSource, ModelSource, QueueSource
from index.bulk.backfill_types import BackfillConflict, BackfillOptions, BackfillReport, Progress, Source
from index.ingest import queue
from index.ingest.indexer import Indexer
from index.store.change_feed import Watermark
from index.store.partitions import ModelPartition, ensure_partition, get_partition
from inference.client import ModelInfo, SidecarClient

# The run's vocabulary, its sources and its embed step live in their own modules
# (index.bulk.backfill_types, index.bulk.backfill_sources, index.bulk.backfill_copy); they are named here too, so
# callers import a backfill's whole surface from this one module.
__all__ = [
    "BackfillConflict",
    "BackfillOptions",
    "BackfillReport",
    "EmbedStep",
    "JsonlSource",
    "ModelSource",
    "Progress",
    "QueueSource",
    "Source",
    "abandon",
    "embed_and_copy",
    "records_done",
    "run_backfill",
]

log = logging.getLogger(__name__)

# A model change whose source keeps changing gives up after this many catch-up rounds.
MAX_SWAP_ROUNDS = 5


async def _open_run(
    conn: asyncpg.Connection,
    source: Source,
    model: ModelInfo,
    partition: ModelPartition,
    report: BackfillReport,
) -> asyncpg.Record:
    """Resume the target's unfinished run when it is this source's, or start one: the run, its
    shadow and its scope in one transaction."""
    row = await conn.fetchrow(
        "SELECT * FROM rag_backfills WHERE target_model = $1 AND state IN ('embedding', 'building')", model.id
    )
    if row is not None:
        if row["source"] != source.kind or json.loads(row["source_detail"]) != source.detail():
            raise BackfillConflict(
                f"backfill {row['backfill_id']} of model {model.id} from {row['source']} "
                f"{row['source_detail']} is unfinished: run that command again to resume it, or "
                f"`mnemo backfill --abandon {model.id}` to drop it"
            )
        report.resumed = True
    else:
        backfill_id = f"bf-{secrets.token_hex(4)}"
        async with conn.transaction():
            await shadow.drop_shadow(conn, partition)  # left by an abandoned run killed mid-drop
            await shadow.create_shadow(conn, partition)
            await conn.execute(
                """INSERT INTO rag_backfills (backfill_id, target_model, source, source_detail, shadow_table,
                                              state)
                   VALUES ($1, $2, $3, $4, $5, 'embedding')""",
                backfill_id,
                model.id,
                source.kind,
                json.dumps(source.detail()),
                shadow.shadow_of(partition).partition,
            )
            line_rejects = await source.scope(conn, backfill_id)
            row = await conn.fetchrow(
                "UPDATE rag_backfills SET report = $2 WHERE backfill_id = $1 RETURNING *",
                backfill_id,
                json.dumps({"line_rejects": line_rejects}),
            )
    assert row is not None
    return row


async def _set_state(
    db: asyncpg.Pool, backfill_id: str, state: str, report: BackfillReport | None = None
) -> None:
    await db.execute(
        """UPDATE rag_backfills SET state = $2, updated_at = now(),
                  finished_at = CASE WHEN $2 IN ('swapped', 'abandoned') THEN now() END,
                  report = report || coalesce($3::jsonb, '{}'::jsonb)
           WHERE backfill_id = $1""",
        backfill_id,
        state,
        None if report is None else json.dumps({"result": report.as_dict()}),
    )


def _timed(report: BackfillReport, phase: str, started: float) -> None:
    report.seconds[phase] = round(report.seconds.get(phase, 0.0) + time.perf_counter() - started, 3)


async def run_backfill(
    pool: asyncpg.Pool,
    client: SidecarClient,
    source: Source,
    options: BackfillOptions | None = None,
    *,
    progress: Progress | None = None,
    embed_step: EmbedStep | None = None,
) -> BackfillReport:
    """Run (or resume) a backfill of ``source`` into its target model's partition, up to the swap.
    ``embed_step`` embeds and copies the pending records (default: here, one batch embedding
    while the previous one is written)."""
    options = options or BackfillOptions()
    progress = progress or (lambda done, total: None)
    if options.maintenance_work_mem is not None:
        shadow.parse_memory(options.maintenance_work_mem)  # a bad size fails now, not after the embedding
    model = await source.target(pool, client)
    assert model.dimension is not None
    partition = await ensure_partition(pool, model.id, model.dimension)
    report = BackfillReport(backfill_id="", model=model.id, source=source.kind)
    async with _run_lock(pool, partition):
        return await _run(
            pool, client, source, options, progress, embed_step or embed_pending, model, partition, report
        )


@contextlib.asynccontextmanager
async def _run_lock(pool: asyncpg.Pool, partition: ModelPartition) -> AsyncIterator[None]:
    """One run per target partition at a time (a session advisory lock, released when the run's
    process dies); taking it also ends the sessions a killed run left building."""
    async with pool.acquire() as conn:
        key = f"mnemo.backfill:{partition.model}"
        if not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", key):
            raise BackfillConflict(f"a backfill of model {partition.model} is running now")
        try:
            ended = await shadow.end_orphans(conn, partition)
            if ended:
                log.warning("ended %d database sessions a killed backfill left behind", ended)
            yield
        finally:
            await conn.execute("SELECT pg_advisory_unlock(hashtext($1))", key)


async def _run(
    pool: asyncpg.Pool,
    client: SidecarClient,
    source: Source,
    options: BackfillOptions,
    progress: Progress,
    embed_step: EmbedStep,
    model: ModelInfo,
    partition: ModelPartition,
    report: BackfillReport,
) -> BackfillReport:
    """The run's phases in order: scope, the live rows kept, rounds of embed + build + swap, the
    outcome. Each phase's seconds go to ``report.seconds``."""
    started = time.perf_counter()
    async with pool.acquire() as conn:
        run = await _open_run(conn, source, model, partition, report)
    report.backfill_id = backfill_id = run["backfill_id"]
    _timed(report, "scope", started)
    if not report.resumed and not (await records_done(pool, backfill_id))[1]:
        return await _nothing_to_replace(pool, partition, options, report)
    if isinstance(source, QueueSource):
        source.use(backfill_id)
    holding = source.holding(pool) if isinstance(source, QueueSource) else contextlib.nullcontext()
    indexer = Indexer(pool, client, model, shadow.shadow_of(partition), embed_batch=options.embed_batch)
    async with holding:
        if run["target_seq"] is None:  # the live rows it keeps: redone by a rerun until committed
            run = await _copy_kept(pool, partition, report)
        steps = _Steps(pool, source, options, progress, embed_step, indexer, partition, report)
        await steps.until_swapped(run["state"])
        if isinstance(source, QueueSource):
            await source.finish(pool, backfill_id, report)
    return await _outcome(pool, options, report)


async def _nothing_to_replace(
    pool: asyncpg.Pool, partition: ModelPartition, options: BackfillOptions, report: BackfillReport
) -> BackfillReport:
    """An empty scope: no index build, no swap, the partition stays as it is."""
    async with pool.acquire() as conn:
        await shadow.drop_shadow(conn, partition)
    report.rejects_path = await _write_rejects(pool, report.backfill_id, options.rejects)
    await _set_state(pool, report.backfill_id, "abandoned", report)
    return report


async def _copy_kept(pool: asyncpg.Pool, partition: ModelPartition, report: BackfillReport) -> asyncpg.Record:
    """Step 2: copy the live rows outside the scope into the shadow; returns the run's row after it."""
    started = time.perf_counter()
    async with pool.acquire() as conn:
        report.rows_kept = await shadow.copy_out_of_scope(conn, partition, report.backfill_id)
    run = await pool.fetchrow("SELECT * FROM rag_backfills WHERE backfill_id = $1", report.backfill_id)
    _timed(report, "copy_kept", started)
    return run


@dataclass
class _Steps:
    """Steps 3 to 5 of one run (embed and COPY, build, swap), repeated while the swap finds the
    source changed (a model change catching up)."""

    pool: asyncpg.Pool
    source: Source
    options: BackfillOptions
    progress: Progress
    embed_step: EmbedStep
    indexer: Indexer
    partition: ModelPartition
    report: BackfillReport

    async def until_swapped(self, state: str) -> None:
        backfill_id = self.report.backfill_id
        for round_ in range(MAX_SWAP_ROUNDS + 1):
            if state == "embedding":
                await self.embed()
                state = "building"
            await self.build()
            started = time.perf_counter()
            try:
                swapped = await self.swap()
            except shadow.SwapBlocked as exc:
                log.info(
                    "backfill %s: %s; embedding those records first (round %d)", backfill_id, exc, round_ + 1
                )
                await _set_state(self.pool, backfill_id, "embedding")
                state = "embedding"
                continue
            finally:
                _timed(self.report, "swap", started)
            self.report.records_caught_up, self.report.keys_stamped = (
                swapped.records_caught_up,
                swapped.keys_stamped,
            )
            return
        raise RuntimeError(
            f"backfill {backfill_id}: the source kept changing through {MAX_SWAP_ROUNDS} rounds"
        )

    async def embed(self) -> None:
        started = time.perf_counter()
        backfill_id = self.report.backfill_id
        await self.embed_step(self.pool, self.source, self.indexer, backfill_id, self.options, self.progress)
        _timed(self.report, "embed_copy", started)
        await _set_state(self.pool, backfill_id, "building")

    async def build(self) -> None:
        started = time.perf_counter()
        async with self.pool.acquire() as conn:
            self.report.build = await shadow.build_indexes(
                conn,
                self.partition,
                workers=self.options.build_workers,
                memory=self.options.maintenance_work_mem,
                allow_spill=self.options.allow_spill,
            )
        _timed(self.report, "build", started)

    async def swap(self) -> shadow.SwapReport:
        """The atomic swap; :class:`index.bulk.shadow.SwapBlocked` when the source changed meanwhile."""
        source, backfill_id = self.source, self.report.backfill_id
        async with self.pool.acquire() as conn:
            if isinstance(source, ModelSource) and await source.catch_up(conn, backfill_id, self.partition):
                raise shadow.SwapBlocked("the source changed while the backfill ran")
            fresh = await conn.fetchrow("SELECT * FROM rag_backfills WHERE backfill_id = $1", backfill_id)
            src = None
            if isinstance(source, ModelSource):
                assert source.partition is not None
                src = (source.partition, Watermark(int(fresh["source_seq"]), int(fresh["source_xmin"])))
            return await shadow.swap(
                conn,
                self.partition,
                backfill_id,
                Watermark(int(fresh["target_seq"]), int(fresh["target_xmin"])),
                source=src,
                serve_kind="text" if isinstance(source, ModelSource) else None,
            )


async def _outcome(pool: asyncpg.Pool, options: BackfillOptions, report: BackfillReport) -> BackfillReport:
    """After the swap: the records' counts, the rejects report, and the run's report stored."""
    counts = await record_counts(pool, report.backfill_id)
    report.copied, report.rejected, report.rows_written = (
        counts.get("copied", 0),
        counts.get("rejected", 0),
        counts["rows"],
    )
    report.records = report.copied + report.rejected
    report.rejects_path = await _write_rejects(pool, report.backfill_id, options.rejects)
    await _set_state(pool, report.backfill_id, "swapped", report)  # its report (the swap set the state)
    return report


async def _write_rejects(pool: asyncpg.Pool, backfill_id: str, path: Path | None) -> str | None:
    """The rejects report (JSONL): every rejected record with its reason, then the file's lines
    that were no record. None when there is nothing to report."""
    rows = await pool.fetch(
        """SELECT section_tipo, section_id, reason FROM rag_backfill_records
           WHERE backfill_id = $1 AND state = 'rejected' ORDER BY section_tipo, section_id""",
        backfill_id,
    )
    lines = json.loads(
        await pool.fetchval("SELECT report FROM rag_backfills WHERE backfill_id = $1", backfill_id)
    )
    entries = [dict(r) for r in rows] + list(lines.get("line_rejects", []))
    if not entries:
        return None
    path = path or Path(f"backfill-{backfill_id}.rejects.jsonl")
    with path.open("w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, ensure_ascii=False) + "\n")
    return str(path)


async def abandon(pool: asyncpg.Pool, model: str) -> str | None:
    """Drop the model's unfinished backfill: its shadow, its leases, its state. Returns its id."""
    row = await pool.fetchrow(
        "SELECT backfill_id FROM rag_backfills WHERE target_model = $1 AND state IN ('embedding', 'building')",
        model,
    )
    partition = await get_partition(pool, model)
    if row is None or partition is None:
        return None
    async with pool.acquire() as conn, conn.transaction():
        await shadow.drop_shadow(conn, partition)
        await queue.release_all(conn, f"backfill:{row['backfill_id']}")
        await conn.execute(
            "UPDATE rag_backfills SET state = 'abandoned', finished_at = now() WHERE backfill_id = $1",
            row["backfill_id"],
        )
    return row["backfill_id"]
