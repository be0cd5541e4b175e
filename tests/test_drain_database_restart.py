"""A PostgreSQL restart under a running drain (issue 57): an expected fault, retried and recovered, so
it is logged at WARNING with the retry count and the time to the next try, never at ERROR, and the
drain resumes by itself. The server is this test's own (the session's is shared), stopped hard
(``pg_ctl stop -m immediate``, as a crash) and started again on the same socket."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

import asyncpg
import pytest

from index.ingest.drain import DrainLoop
from index.ingest.intake import enqueue_records
from index.store.sections import SectionStore
from schema import EmbeddedPostgres, create_pool, migrate
from tests.ingest_support import ORAL_HISTORY, SETTINGS, TEXT_MODEL, CountingClient, queue_rows, record
from tests.waiting import until

pytestmark = pytest.mark.ray

# A heartbeat every third of a second: the outage below spans several, each retried.
BEATING = dataclasses.replace(SETTINGS, lease_seconds=1.0)


async def test_a_postgresql_restart_under_a_running_drain_logs_no_error_and_the_drain_resumes(
    sidecar_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # Not under pytest's basetemp, which another session on this machine may prune (tests/conftest.py).
    root = Path(tempfile.mkdtemp(prefix="mnemo-test-pg-drain-"))
    server = EmbeddedPostgres(root / "pg")
    await asyncio.to_thread(server.start)
    stop = asyncio.Event()
    try:
        await migrate(server.url)
        pool = await create_pool(server.url, max_size=4)
        try:
            await SectionStore(pool).put("oh1", ORAL_HISTORY)
            async with CountingClient(sidecar_url) as client:
                drain = DrainLoop(pool, client, BEATING, text_model=TEXT_MODEL)
                runner = asyncio.create_task(drain.supervise(stop))
                try:
                    await enqueue_records(pool, [record(1)])
                    drain.wake()
                    await until("record 1 indexed", lambda: _drained(pool))

                    caplog.clear()
                    await asyncio.to_thread(server.halt)
                    # Down long enough for passes and heartbeats to fail and be retried.
                    await until("two failed passes", lambda: drain.outages >= 2)
                    await until("a failed heartbeat", lambda: _retried(caplog, "heartbeat"))
                    await asyncio.to_thread(server.start)  # waits out crash recovery

                    await until("a record enqueued again", lambda: _enqueued(pool, 2))
                    drain.wake()
                    await until("record 2 indexed after the restart", lambda: _drained(pool))
                finally:
                    stop.set()
                    await asyncio.wait_for(runner, 60)
        finally:
            await pool.close()
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(root, ignore_errors=True)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [f"{r.name}: {r.getMessage()}" for r in errors]
    passes = _retried(caplog, "drain pass: the database did not answer")
    assert any("retry 2 in" in m for m in passes), passes
    assert drain.crashes == 0 and drain.status()["state"] == "running"


def _retried(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    """The WARNING lines of retries whose text holds ``what``."""
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return [m for m in lines if what in m and " retry " in m]


async def _drained(pool: asyncpg.Pool) -> bool:
    try:
        return not await queue_rows(pool)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False


async def _enqueued(pool: asyncpg.Pool, section_id: int) -> bool:
    """Enqueue the record once the database answers again (False while it does not)."""
    try:
        await enqueue_records(pool, [record(section_id)])
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    return True
