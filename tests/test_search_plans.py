"""The dense leg is planned with its own values every time, never from a generic plan.

PostgreSQL plans a prepared statement with its parameters for five runs, then switches to a generic
plan (parameters unknown) when that one's estimated cost is lower. For a non-admin caller the
generic plan estimates the ACL's ``projects && $n`` at 1% of the rows and leaves the HNSW index for
a bitmap scan of every row, the ACL's jsonb check on each and a sort: 300 ms instead of 3 on 10k
chunks at 100% visibility (issue 15). ``pg_prepared_statements`` counts the plans each statement of
the session got; the dense statement must never have had a generic one.
"""

from __future__ import annotations

import asyncpg
import numpy as np

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from index.search.dense_leg import dense_search
from index.store.hits import Scope
from index.store.partitions import ensure_partition
from index.store.store import EmbeddingRow, copy_rows

DIM = 8
SECTION = "plan1"


async def test_dense_leg_never_runs_a_generic_plan(db_pool: asyncpg.Pool) -> None:
    partition = await ensure_partition(db_pool, "plan-test-8", DIM)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((3000, DIM)).astype(np.float32)
    rows = [
        EmbeddingRow("text", SECTION, i // 5 + 1, "rag:card", "lg-nolan", i % 5, f"h{i}", "t", "t", vectors[i],
                     projects=[1], chunk_meta={"contributors": ["c1"]})
        for i in range(len(vectors))
    ]  # fmt: skip
    async with db_pool.acquire() as conn:
        await copy_rows(conn, partition, rows)
        await conn.execute(f"ANALYZE {partition.table}")
    researcher = Scope(acl=pushdown(Principal("r", frozenset({1}), {SECTION: 1})))
    async with db_pool.acquire() as conn:
        for q in rng.standard_normal((12, DIM)).astype(np.float32):
            hits = await dense_search(conn, partition, q, researcher, 20)
            assert len(hits) == 20
        plans = await conn.fetch(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1",
            "%WITH nn AS MATERIALIZED%",
        )
    assert plans, "the dense statement was not prepared on this connection"
    assert sum(p["custom_plans"] for p in plans) >= 12
    assert sum(p["generic_plans"] for p in plans) == 0


async def test_read_pool_keeps_no_leg_state_between_callers(database_url: str) -> None:
    """The gateway's read pool skips asyncpg's reset query, so a leg must leave nothing behind:
    its scan settings are SET LOCAL in a transaction it ends, also when the query fails."""
    from schema import create_pool

    pool = await create_pool(database_url, max_size=1, reset_session=False)
    try:
        partition = await ensure_partition(pool, "plan-test-4", 4)
        async with pool.acquire() as conn:
            defaults = await conn.fetchrow("SELECT current_setting('plan_cache_mode') AS mode")
            await conn.execute("SET application_name = 'left-behind'")  # session state survives release
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW application_name") == "left-behind"
            assert await dense_search(conn, partition, np.ones(4, np.float32), Scope(), 5) == []
            assert not conn.is_in_transaction()
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW plan_cache_mode") == defaults["mode"]
            assert await conn.fetchval("SHOW hnsw.iterative_scan") == "off"
            try:
                await dense_search(conn, partition, np.ones(3, np.float32), Scope(), 5)  # wrong dimension
            except asyncpg.PostgresError:
                pass
            else:
                raise AssertionError("a 3-d query against a 4-d partition must fail")
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SHOW hnsw.iterative_scan") == "off"
    finally:
        await pool.close()


async def test_default_pool_still_resets_the_session(database_url: str) -> None:
    from schema import create_pool

    pool = await create_pool(database_url, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SET application_name = 'left-behind'")
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW application_name") != "left-behind"
    finally:
        await pool.close()
