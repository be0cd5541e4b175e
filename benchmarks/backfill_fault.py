"""Reliability fault: a `mnemo backfill` killed with SIGKILL mid-build, then resumed (issue 23).

The backfill of a queued section runs in a subprocess. The harness holds an ``ACCESS SHARE`` lock
on the shadow table from the moment it exists: COPY and ``CREATE INDEX`` go on beside it, but the
primary key (``ALTER TABLE ... ADD CONSTRAINT``, which needs ``ACCESS EXCLUSIVE``) waits, so the
kill lands with the build half done (the indexes named before ``*_pkey`` built, the rest not) at
the same point in every run, whatever the machine's speed. Then the lock goes and the same
command runs again. Figures: records lost against a clean drain of the same records (missing, or
other text or vector), duplicate rows, indexes built at the kill, seconds from the rerun's start
to its completion, and the queue left.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .fault_store import DRAIN_SECTION, _queue_size, _wait_for, compare_stores, faulted_store, store_snapshot

__all__ = ["backfill_killed_mid_build"]


async def _backfill_process(
    url: str, sidecar_url: str, text_model: str, log: Path
) -> asyncio.subprocess.Process:
    from .processes import start_mnemo

    argv = ["--log-level", "INFO", "backfill", "--section", DRAIN_SECTION, "--batch", "4", "--no-progress"]
    argv += ["--database-url", url, "--sidecar-url", sidecar_url, "--text-model", text_model]
    return await start_mnemo(argv, log)


async def _hold_at_primary_key(
    pool: Any, holder: Any, proc: Any, table: str, deadline: float, log: Path
) -> Any:
    """Once the backfill's shadow ``table`` exists, take a share lock on it in ``holder``'s transaction
    (returned, still open) and wait until the build waits on it at the primary key (its ALTER TABLE),
    with the indexes before it built."""

    async def shadow_exists() -> bool:
        return bool(await pool.fetchval("SELECT to_regclass($1) IS NOT NULL", table))

    await _wait_for(shadow_exists, deadline)
    tx = holder.transaction()
    await tx.start()
    await holder.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")

    async def build_waiting() -> bool:  # the build reached the primary key and waits on us
        if proc.returncode is not None:
            raise RuntimeError(f"the backfill ended before the kill; see {log}")
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.relation = to_regclass($1) AND NOT l.granted AND a.query ILIKE 'ALTER TABLE%'",
                table,
            )
        )

    if not await _wait_for(build_waiting, deadline):
        raise RuntimeError(f"the backfill never reached its index build; see {log}")
    return tx


async def _progress_at_kill(pool: Any, table: str) -> tuple[int, int]:
    """(indexes built on the shadow ``table``, records copied) where the build is held."""
    built = await pool.fetchval("SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1)", table)
    copied = await pool.fetchval("SELECT count(*) FROM rag_backfill_records WHERE state = 'copied'")
    return built, copied


async def _duplicate_keys(pool: Any, model: str) -> int:
    """Chunk keys of ``model``'s partition written more than once (after the swap)."""
    from index.store.partitions import get_partition

    final = await get_partition(pool, model)
    assert final is not None
    return await pool.fetchval(
        f"""SELECT count(*) FROM (SELECT 1 FROM {final.table}
            GROUP BY section_tipo, section_id, component_tipo, lang, view, chunk_index
            HAVING count(*) > 1) d"""
    )


async def backfill_killed_mid_build(
    server_url: str,
    sidecar_url: str,
    log_dir: Path,
    *,
    text_model: str,
    records: int = 48,
    deadline_s: float = 300.0,
) -> dict[str, Any]:
    """The fault above on ``records`` records; databases on ``server_url`` (created, then dropped).
    Bounded by ``deadline_s``."""
    import asyncpg

    from index.bulk import shadow
    from index.store.partitions import get_partition
    from inference.client import SidecarClient

    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    names = ("backfill_clean_run", "backfill_killed_run")
    log = log_dir / "backfill-killed.log"
    async with (
        SidecarClient(sidecar_url) as client,
        faulted_store(server_url, names, client, text_model, records, deadline) as (clean, url, pool),
    ):
        holder = await asyncpg.connect(url)
        try:
            proc = await _backfill_process(url, sidecar_url, text_model, log)
            partition = await _wait_for(lambda: get_partition(pool, text_model), deadline)
            if partition is None:
                raise RuntimeError(f"the backfill provisioned no partition; see {log}")
            table = shadow.shadow_of(partition).table
            tx = await _hold_at_primary_key(pool, holder, proc, table, deadline, log)
            built, copied = await _progress_at_kill(pool, table)
            proc.kill()  # SIGKILL: no handler, no cleanup
            await proc.wait()
            await tx.rollback()
            resumed_at = loop.time()
            rerun = await _backfill_process(url, sidecar_url, text_model, log)
            code = await asyncio.wait_for(rerun.wait(), max(1.0, deadline - loop.time()))
            finished_s = round(loop.time() - resumed_at, 2)
            if code != 0:
                raise RuntimeError(f"the resumed backfill exited {code}; see {log}")
            after = await store_snapshot(pool, text_model)
            duplicates = await _duplicate_keys(pool, text_model)
            queue_left = await _queue_size(pool)
            resumed = await pool.fetchval("SELECT (report->'result'->>'resumed')::boolean FROM rag_backfills")
        finally:
            await holder.close()
    return {
        "records": records,
        "records_copied_at_kill": copied,
        "indexes_built_at_kill": built,
        "duplicate_rows": duplicates + len(after.keys() - clean.keys()),
        **compare_stores(clean, after),
        "resumed": resumed,
        "resume_to_done_s": finished_s,
        "queue_left": queue_left,
    }
