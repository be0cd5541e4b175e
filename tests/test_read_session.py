"""A pool of retrieval reads opens its sessions with the legs' settings, so a leg is one statement.

The dense leg needs pgvector's scan settings and custom plans. Set per query they cost a
transaction of three round trips (BEGIN and ``SET LOCAL`` batch, the query, COMMIT); a gateway's
read pool opens every session with them instead (issue 27). These tests watch the statements a
leg sends (asyncpg's query logger) and what the server says its settings are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import numpy as np
import pytest

from index.search.dense_leg import dense_search
from index.search.read_settings import read_session_settings
from index.store.hits import Scope
from index.store.partitions import ModelPartition, ensure_partition
from index.store.store import EmbeddingRow, upsert_rows
from schema import create_pool, session_settings
from schema.database import SessionSettingsLost, verify_session_settings

DIM = 8
EF_SEARCH = 40
MAX_SCAN_TUPLES = 5000
SESSION = read_session_settings(EF_SEARCH, MAX_SCAN_TUPLES)
SHOWN = ("plan_cache_mode", "hnsw.iterative_scan", "hnsw.ef_search", "hnsw.max_scan_tuples")


@pytest.fixture
async def rows(db_pool: asyncpg.Pool) -> AsyncIterator[ModelPartition]:
    partition = await ensure_partition(db_pool, "read-session-8", DIM)
    rng = np.random.default_rng(5)
    batch = [
        EmbeddingRow("text", "oh1", i, "rag:card", "lg-eng", 0, f"h{i}", "t", "t", rng.standard_normal(DIM), projects=[1])
        for i in range(300)
    ]  # fmt: skip
    async with db_pool.acquire() as conn, conn.transaction():
        await upsert_rows(conn, partition, batch)
    yield partition


async def _statements(pool: asyncpg.Pool, partition: ModelPartition, **kw: object) -> tuple[list[str], list]:
    """The statements one dense search sends, and its hits (after a first search has let asyncpg
    introspect the statement's types)."""
    sent: list[str] = []
    async with pool.acquire() as conn:
        await dense_search(conn, partition, np.ones(DIM, np.float32), Scope(), **kw)
        with conn.query_logger(lambda logged: sent.append(logged.query)):
            hits = await dense_search(conn, partition, np.ones(DIM, np.float32), Scope(), **kw)
    return sent, [(h.key, round(h.score, 6)) for h in hits]


async def test_a_session_pool_runs_the_dense_leg_as_one_statement(rows, db_pool, database_url) -> None:
    reads = await create_pool(database_url, max_size=1, reset_session=False, session=SESSION)
    try:
        scan = {"ef_search": EF_SEARCH, "max_scan_tuples": MAX_SCAN_TUPLES}
        plain, plain_hits = await _statements(db_pool, rows, limit=10, **scan)
        alone, alone_hits = await _statements(reads, rows, limit=10, **scan)
        assert alone_hits == plain_hits and len(alone_hits) == 10
        assert len(alone) == 1 and alone[0].lstrip().startswith("WITH nn AS")
        assert len(plain) == 3 and plain[0].startswith("BEGIN READ ONLY") and plain[2] == "COMMIT"
        assert "SET LOCAL hnsw.ef_search = 40" in plain[0]

        # A top-k past the session's ef_search sets only what differs, for that query alone.
        wider, _ = await _statements(reads, rows, limit=60, **scan)
        assert wider[0] == "BEGIN READ ONLY; SET LOCAL hnsw.ef_search = 60"
        exact, _ = await _statements(reads, rows, limit=10, exact=True, **scan)
        assert exact[0] == "BEGIN READ ONLY; SET LOCAL enable_indexscan = off"
        # Settings other than the session's (another gateway configuration) are set per query.
        other, _ = await _statements(reads, rows, limit=10, ef_search=80, max_scan_tuples=MAX_SCAN_TUPLES)
        assert other[0] == "BEGIN READ ONLY; SET LOCAL hnsw.ef_search = 80"
        async with reads.acquire() as conn:
            assert [await conn.fetchval(f"SELECT current_setting('{name}')") for name in SHOWN] == [
                SESSION[name] for name in SHOWN
            ]
    finally:
        await reads.close()


async def test_session_settings_survive_the_reset_on_release(rows, database_url) -> None:
    """asyncpg's reset query (``RESET ALL``) returns a session to its start-up settings, not to
    the server's defaults: the settings hold for every later user of the connection."""
    pool = await create_pool(database_url, max_size=1, session=SESSION)
    try:
        for _ in range(2):
            async with pool.acquire() as conn:
                assert session_settings(conn) == SESSION
                await conn.execute("SET hnsw.ef_search = 400")  # a careless user; the release resets it
                await dense_search(conn, rows, np.ones(DIM, np.float32), Scope(), 5)  # pgvector loaded
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT current_setting('hnsw.ef_search')") == str(EF_SEARCH)
    finally:
        await pool.close()


async def test_a_plain_connection_holds_no_session_settings(database_url) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        assert session_settings(conn) == {}
    finally:
        await conn.close()


async def test_a_session_without_its_settings_is_refused_loudly(database_url) -> None:
    """What a pool's new connection meets when something in between dropped its start-up settings."""
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(SessionSettingsLost, match=r"hnsw\.ef_search"):
            await verify_session_settings(conn, SESSION)
        await conn.execute("SET plan_cache_mode = force_custom_plan; SET hnsw.iterative_scan = relaxed_order")
        await conn.execute(f"SET hnsw.ef_search = {EF_SEARCH}; SET hnsw.max_scan_tuples = {MAX_SCAN_TUPLES}")
        await verify_session_settings(conn, SESSION)  # the same settings, set after the start: held
    finally:
        await conn.close()
