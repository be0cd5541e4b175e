"""Parallel drain workers on real PostgreSQL against the session sidecar: three `mnemo drain`
processes and a gateway's drain share one queue, one process is killed with SIGKILL mid-work,
and every record is indexed exactly once (issue 23's done-when); a worker's heartbeat keeps
its leases; inside a worker the next batch embeds while the current one is written; `mnemo drain
--once --workers 3` drains a queue and unregisters its workers.

Time never decides an outcome here: the lease is made short by its setting so that the killed
worker's records expire soon, and the test waits on conditions under a generous overall limit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

import index.store.store
from benchmarks.faults import drain_processes, leased_by
from index.ingest import queue
from index.ingest.drain import DrainWorker, drain_once
from index.ingest.intake import enqueue_records
from index.store.partitions import get_partition
from index.store.sections import SectionStore
from inference.client import EmbedResult
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import ADMIN, running_gateway
from tests.ingest_support import ORAL_HISTORY, SETTINGS, TEXT_MODEL, CountingClient, record
from tests.waiting import until

# `mnemo` as its entry point runs it (gateway.cli:main), with this interpreter.
MNEMO = (sys.executable, "-m", "gateway.cli")
RECORDS = 160
# Short enough that the killed worker's records come back within seconds; three heartbeats
# per lease keep a live worker's claims.
LEASE_SECONDS = "4"
INGEST_ENV = {
    "RAG_INGEST_LEASE_SECONDS": LEASE_SECONDS,
    "RAG_INGEST_BATCH_RECORDS": "4",  # small batches: every worker gets some, the kill lands mid-work
    "RAG_INGEST_DRAIN_INTERVAL": "0.2",
}
OVERALL_LIMIT_S = 600.0


def _until(what: str, check: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    """:func:`tests.waiting.until` under this module's wider bound (several processes, lease expiries)."""
    return until(what, check, limit_s=OVERALL_LIMIT_S)


async def _lease_owners(pool: asyncpg.Pool) -> set[str]:
    rows = await pool.fetch("SELECT DISTINCT lease_owner FROM rag_index_queue WHERE lease_owner IS NOT NULL")
    return {r["lease_owner"] for r in rows}


def _pid_of(worker_id: str) -> int:
    """``role@host:pid#index-tag`` -> pid."""
    return int(worker_id.rsplit(":", 1)[1].split("#", 1)[0])


async def test_three_drain_processes_and_a_gateway_index_every_record_exactly_once_despite_a_kill(
    tmp_path: Path,
    database_url: str,
    db_pool: asyncpg.Pool,
    sidecar_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in INGEST_ENV.items():  # the gateway reads its ingest settings from the environment
        monkeypatch.setenv(name, value)
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    env = {
        **INGEST_ENV,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    seen_owners: set[str] = set()

    async def owners_now() -> set[str]:
        owners = await _lease_owners(db_pool)
        seen_owners.update(owners)
        return owners

    async with running_gateway(database_url, sidecar_url, **INGEST_ENV) as gateway:
        await enqueue_records(db_pool, [record(i) for i in range(1, RECORDS + 1)])
        # The gateway's drain starts on the queue alone; the processes join it.
        await _until("the gateway's drain to lease records", lambda: _with_role(owners_now, "gateway@"))
        async with drain_processes(
            database_url, sidecar_url, tmp_path, 3, text_model=TEXT_MODEL, **env
        ) as procs:
            victim = procs[0]

            async def victim_leases() -> set[str]:
                return {o for o in await owners_now() if _pid_of(o) == victim.pid}

            await _until("the first drain process to hold leases", victim_leases)
            victim.kill()  # SIGKILL mid-work: it holds leased, unfinished records
            await victim.wait()
            orphan_ids = await leased_by(db_pool, victim.pid)
            assert orphan_ids, "the killed process held no lease at its death"

            async def queue_empty() -> bool:
                await owners_now()
                return await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0

            await _until("every record to leave the queue", queue_empty)
            assert all(p.returncode is None for p in procs[1:]), "a surviving drain process died"

            # Stats list the live workers (two processes and the gateway) and the killed one as
            # stale once a whole lease passes without its heartbeat.
            async def stats_settled() -> dict[str, Any] | None:
                async with aiohttp.ClientSession() as http:
                    async with http.get(
                        gateway.url + "/v1/queue/stats", headers={"Authorization": f"Bearer {ADMIN}"}
                    ) as resp:
                        data = (await resp.json())["data"]
                dead = [w for w in data["workers"] if _pid_of(w["worker_id"]) == victim.pid]
                return data if dead and not any(w["alive"] for w in dead) else None

            stats = await _until("the killed worker to show as stale", stats_settled)
            alive = {(w["role"], _pid_of(w["worker_id"])) for w in stats["workers"] if w["alive"]}
            assert alive == {("gateway", os.getpid()), ("drain", procs[1].pid), ("drain", procs[2].pid)}
            assert (stats["pending"], stats["failed"], stats["leased"], stats["expired_leases"]) == (
                0,
                0,
                0,
                0,
            )
            async with aiohttp.ClientSession() as http, http.get(gateway.url + "/metrics") as resp:
                exposition = await resp.text()
            assert 'mnemo_ingest_drain_workers{role="drain"} 2.0' in exposition
            assert 'mnemo_ingest_drain_workers{role="gateway"} 1.0' in exposition
            assert "mnemo_ingest_drain_worker_records_per_second{worker=" in exposition
            listed = json.loads(await _mnemo(env, "queue", "stats", "--json", "--database-url", database_url))
            assert listed["pending"] == 0
            assert {w["worker_id"] for w in listed["workers"]} == {w["worker_id"] for w in stats["workers"]}
            text = await _mnemo(env, "queue", "stats", "--database-url", database_url)
            assert "leased 0 (expired 0)" in text and "workers: 3 alive, 1 stale" in text
            assert f":{victim.pid}#0" in text and "records/s" in text

    # The gateway's drain and the processes each held leases: they drained together.
    assert {_pid_of(o) for o in seen_owners} >= {os.getpid(), victim.pid}
    assert any(o.startswith("gateway@") for o in seen_owners)

    # Every record indexed exactly once: all present, each with the same complete set of chunk
    # keys (none missing, no stray tail), each written by one transaction, none written twice.
    partition = await get_partition(db_pool, TEXT_MODEL)
    assert partition is not None
    rows = await db_pool.fetch(
        f"""SELECT section_id, array_agg(component_tipo || '/' || lang || '/' || chunk_index
                                         ORDER BY component_tipo, lang, chunk_index) AS keys
            FROM {partition.table} WHERE section_tipo = 'oh1' GROUP BY section_id"""
    )
    keys = {r["section_id"]: tuple(r["keys"]) for r in rows}
    assert set(keys) == set(range(1, RECORDS + 1))
    assert orphan_ids <= set(keys)  # the killed worker's records, taken over after its lease expired
    assert len(set(keys.values())) == 1 and len(keys[1]) >= 3
    # No row was ever rewritten (an upsert over an existing row moves its updated_at), so no two
    # workers indexed the same record one after the other either.
    assert (
        await db_pool.fetchval(f"SELECT count(*) FROM {partition.table} WHERE updated_at <> created_at") == 0
    )
    writes = await db_pool.fetch(
        """SELECT section_id, count(*) AS changes, count(DISTINCT xid) AS transactions
           FROM rag_embedding_changes WHERE section_tipo = 'oh1' GROUP BY section_id"""
    )
    assert {r["section_id"]: (r["changes"], r["transactions"]) for r in writes} == {
        i: (len(keys[1]), 1) for i in range(1, RECORDS + 1)
    }


async def _with_role(owners: Callable[[], Awaitable[set[str]]], prefix: str) -> bool:
    return any(o.startswith(prefix) for o in await owners())


async def test_a_live_workers_heartbeat_renews_the_leases_it_works_on_and_a_stop_gives_them_back(
    db_pool: asyncpg.Pool,
) -> None:
    await queue.enqueue(db_pool, [queue.Job("oh1", i, "index", {}) for i in (1, 2)])
    settings = dataclasses.replace(SETTINGS, lease_seconds=1.5)
    async with DrainWorker(db_pool, settings, role="drain") as worker:
        assert len(await queue.claim_ready(db_pool, 10, 5, lease=worker.lease)) == 2
        # It works on record 1 only; record 2's claim was left behind (a pass that died).
        worker.holding.add(("oh1", 1))
        first = await db_pool.fetchval("SELECT lease_until FROM rag_index_queue WHERE section_id = 1")
        left = await db_pool.fetchval("SELECT lease_until FROM rag_index_queue WHERE section_id = 2")

        async def renewed() -> bool:
            return (
                await db_pool.fetchval("SELECT lease_until FROM rag_index_queue WHERE section_id = 1") > first
            )

        await _until("the heartbeat to renew the lease", renewed)
        assert await db_pool.fetchval("SELECT lease_until FROM rag_index_queue WHERE section_id = 2") == left
        row = await db_pool.fetchrow(
            "SELECT role, pid FROM rag_drain_workers WHERE worker_id = $1", worker.id
        )
        assert (row["role"], row["pid"]) == ("drain", os.getpid())
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue WHERE lease_owner IS NOT NULL") == 0
    assert await db_pool.fetchval("SELECT count(*) FROM rag_drain_workers") == 0


class _WatchingClient(CountingClient):
    """The real client, noting the texts of every ``/embed`` call as it starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[str] = []

    async def embed(self, model: str, texts: Any, **kwargs: Any) -> EmbedResult:
        self.asked.extend(texts)
        return await super().embed(model, texts, **kwargs)


async def test_inside_a_worker_the_next_batch_embeds_while_the_current_one_is_written(
    db_pool: asyncpg.Pool, sidecar_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    await enqueue_records(db_pool, [record(i) for i in range(1, 5)])
    settings = dataclasses.replace(SETTINGS, batch_records=2)  # two batches: records 1-2, then 3-4
    real_upsert = index.store.store.upsert_rows
    overlapped: list[bool] = []

    async with _WatchingClient(sidecar_url) as client:

        async def second_batch_embedding() -> bool:
            return any("(record 3)" in text for text in client.asked)

        async def gated(*args: Any, **kwargs: Any) -> int:
            # The first record's write holds, its transaction open, until the second batch's
            # texts go to the sidecar: done one batch after the other, they never would.
            if not overlapped:
                try:
                    await _until("the second batch's embedding", second_batch_embedding)
                    overlapped.append(True)
                except AssertionError:
                    overlapped.append(False)
            return await real_upsert(*args, **kwargs)

        monkeypatch.setattr(index.store.store, "upsert_rows", gated)
        report = await drain_once(db_pool, client, settings, text_model=TEXT_MODEL)
    assert overlapped == [True]
    assert (report.indexed, report.failed, report.lost_leases) == (4, 0, 0)


async def test_mnemo_drain_once_with_three_workers_drains_the_queue_and_unregisters(
    database_url: str, db_pool: asyncpg.Pool, sidecar_url: str
) -> None:
    await SectionStore(db_pool).put("oh1", ORAL_HISTORY)
    await enqueue_records(db_pool, [record(i) for i in range(1, 25)])
    env = {
        "RAG_INGEST_BATCH_RECORDS": "2",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    args = ("drain", "--once", "--workers", "3", "--database-url", database_url, "--sidecar-url", sidecar_url)
    out = await _mnemo(env, *args, "--text-model", TEXT_MODEL)
    assert "drained: 24 indexed, 0 deleted, 0 failed" in out
    assert await db_pool.fetchval("SELECT count(*) FROM rag_index_queue") == 0
    partition = await get_partition(db_pool, TEXT_MODEL)
    assert partition is not None
    stored = await db_pool.fetch(f"SELECT DISTINCT section_id FROM {partition.table}")
    assert {r["section_id"] for r in stored} == set(range(1, 25))
    assert await db_pool.fetchval("SELECT count(*) FROM rag_drain_workers") == 0  # all three unregistered


async def _mnemo(env: dict[str, str], *args: str) -> str:
    """``mnemo ARGS`` in a subprocess; its stdout (it must succeed)."""
    proc = await asyncio.create_subprocess_exec(
        *MNEMO,
        *("--log-level", "WARNING", *args),
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), OVERALL_LIMIT_S)
    assert proc.returncode == 0, err.decode()
    return out.decode()
