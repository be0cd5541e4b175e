"""Retrieval reads on a real streaming replica (``RAG_DATABASE_READ_URL``), issue 25.

The replica is the session's embedded PostgreSQL cloned with its own ``pg_basebackup`` and run as a
hot standby on its own socket (``schema.embedded_replica``). The gateway reads from it while it is
fresh, shows its lag on ``/readyz`` and ``/metrics``, sends reads to the primary while it lags or is
down, and a search loop running while the replica is stopped and started again never fails.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from gateway.base.resources import READ_POOL_KEY
from schema import EmbeddedPostgres, create_pool, session_settings
from schema.embedded_replica import StreamingReplica
from tests.fixtures.gateway import CORPUS, Gateway, index_docs, running_gateway
from tests.waiting import until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def replica(pg_server: EmbeddedPostgres) -> Iterator[StreamingReplica]:
    with StreamingReplica(pg_server, Path(tempfile.mkdtemp(prefix="mnemo-test-replica-"))) as standby:
        yield standby


def _database(url: str) -> str:
    return url.split("@/", 1)[1].split("?", 1)[0]


@pytest.fixture
async def replicated(
    database_url: str, replica: StreamingReplica, sidecar_url: str
) -> AsyncIterator[tuple[Gateway, asyncpg.Pool]]:
    """A gateway whose retrieval reads go to the replica, over a corpus written on the primary."""
    primary = await create_pool(database_url, max_size=2)
    try:
        await index_docs(primary, sidecar_url, CORPUS)
        env = {
            "RAG_DATABASE_READ_URL": replica.url_for(_database(database_url)),
            "RAG_READ_MAX_LAG": "5",
            "RAG_READ_CHECK_INTERVAL": "0.1",
        }
        async with running_gateway(database_url, sidecar_url, **env) as gw:
            yield gw, primary
    finally:
        await primary.close()


async def _replica_state(gw: Gateway) -> dict[str, Any]:
    """``/readyz``'s replica detail. A 503 means a readiness probe (5 s each) timed out, which a
    loaded machine does to the sidecar's: that is readiness working, not the replica's state, so
    it is asked again."""

    async def answered() -> dict[str, Any] | None:
        async with aiohttp.ClientSession() as http, http.get(gw.url + "/readyz") as r:
            payload = await r.json()
        if r.status == 503 and payload["error"]["code"] == "service.unavailable":
            return None
        assert r.status == 200 and payload["ok"], payload
        return payload["data"]["read_replica"]

    return await until("the gateway's readiness to answer", answered, every_s=0.1)


async def _until_replica(gw: Gateway, in_use: bool) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        state = await _replica_state(gw)
        return state if state["in_use"] is in_use else None

    return await until(f"the replica to become in_use={in_use}", reached, every_s=0.1)


async def _search(gw: Gateway) -> list[Any]:
    data = await gw.ok("semantic_search", {"query": "when the water came we had to leave"})
    return data["results"] if isinstance(data, dict) else data


async def test_searches_read_from_the_replica_and_readyz_shows_its_lag(
    replicated: tuple[Gateway, asyncpg.Pool],
) -> None:
    gw, _ = replicated
    await _until_replica(gw, True)

    async def caught_up() -> dict[str, Any] | None:  # replayed up to the primary once its last writes arrive
        state = await _replica_state(gw)
        return state if state["lag_s"] == 0.0 else None

    state = await until("the replica to replay up to the primary", caught_up, every_s=0.1)
    assert state["configured"] and state["lag_s"] == 0.0 and state["error"] is None, state
    before = state["replica_reads"]
    assert await _search(gw)  # the corpus written on the primary, read back from the standby
    after = await _replica_state(gw)
    assert after["replica_reads"] > before and after["fallbacks"] == state["fallbacks"], after
    metrics = await _metrics(gw)
    # The replica in use, and its lag exported. Not the lag's value: the search itself writes on the
    # primary (its budget), so the standby may be a replay behind again when /metrics is read.
    exported = re.search(r"^mnemo_read_replica_lag_seconds \S+$", metrics, re.MULTILINE)
    assert "mnemo_read_replica_in_use 1.0" in metrics and exported, metrics
    reads = gw.app[READ_POOL_KEY]
    async with reads.acquire() as conn:  # the replica's pool opens its sessions as the primary's does
        assert session_settings(conn) == reads.session and reads.session
        assert (
            await conn.fetchval("SELECT current_setting('hnsw.ef_search')") == reads.session["hnsw.ef_search"]
        )


async def _metrics(gw: Gateway) -> str:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        return await r.text()


async def test_a_lagging_replica_sends_reads_to_the_primary_and_is_counted(
    replicated: tuple[Gateway, asyncpg.Pool], replica: StreamingReplica, database_url: str
) -> None:
    gw, primary = replicated
    await _until_replica(gw, True)
    standby = await asyncpg.connect(replica.url_for(_database(database_url)))
    try:
        await standby.execute("SELECT pg_wal_replay_pause()")
        await primary.execute("CREATE TABLE lag_marker (x int); INSERT INTO lag_marker VALUES (1)")
        # Replay is paused, so the standby falls behind; once older than RAG_READ_MAX_LAG it is skipped
        # (how far behind it was when the check said so is the clock's: no assertion here).
        state = await _until_replica(gw, False)
        fallbacks = state["fallbacks"]
        assert await _search(gw)
        assert (await _replica_state(gw))["fallbacks"] > fallbacks
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()
    await _until_replica(gw, True)


async def test_no_search_fails_while_the_replica_is_stopped_and_started(
    replicated: tuple[Gateway, asyncpg.Pool], replica: StreamingReplica
) -> None:
    gw, _ = replicated
    await _until_replica(gw, True)
    stop = asyncio.Event()
    outcomes: list[str] = []

    async def caller() -> None:
        while not stop.is_set():
            status, body = await gw.call("semantic_search", {"query": "the reservoir flooded the valley"})
            outcomes.append("ok" if status == 200 and body["ok"] else f"{status} {body}")

    async def served(count: int) -> None:  # wait for more searches to be answered, however long they take
        target = len(outcomes) + count
        await until(f"{count} more searches to be answered", lambda: len(outcomes) >= target, every_s=0.01)

    callers = [asyncio.create_task(caller()) for _ in range(4)]
    try:
        await served(8)
        await asyncio.to_thread(replica.stop)  # -m fast: sessions in flight are cut
        down = await _until_replica(gw, False)
        await served(8)
        await asyncio.to_thread(replica.start)
        up = await _until_replica(gw, True)
        await served(8)
    finally:
        stop.set()
        await asyncio.gather(*callers)
    failed = [o for o in outcomes if o != "ok"]
    assert failed == [] and len(outcomes) >= 24, failed[:3]
    assert down["error"] and up["fallbacks"] > 0, (down, up)
