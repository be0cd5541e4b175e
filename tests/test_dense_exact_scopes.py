"""A scope that sees few rows of a partition is answered exactly, not by an HNSW scan that filters.

On real PostgreSQL: 5,000 chunks with an HNSW index, every 100th record in the project a 1%
researcher holds. The planner reads that scope's 50 rows through the ``projects`` index, so the
dense leg sorts them (exact); an unscoped search, and a scope the planner would read whole, keep
the HNSW scan. The choice is made once per scope and partition (cached), and
``RAG_DENSE_EXACT_MAX_ROWS=0`` turns it off.
"""

from __future__ import annotations

import asyncpg
import numpy as np
import pytest

from benchmarks.gateway import RawLegs
from benchmarks.lexical import SECTION, populate
from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from gateway.base.settings import load_gateway_settings
from gateway.retrieval.engines import build_retrieval
from gateway.retrieval.retriever import Retriever
from index.search import dense_leg
from index.search.dense_leg import dense_search, exact_scan_rows
from index.store.hits import Scope

DIM = 16
N = 5_000


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    rng = np.random.default_rng(4)
    out = rng.standard_normal((N, DIM)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture
async def partition(db_pool: asyncpg.Pool, vectors: np.ndarray):
    texts = [f"chunk {i}" for i in range(N)]
    return await populate(db_pool, texts, model="exact-scopes-16", dimension=DIM,
                          vectors=lambda first, stop: vectors[first:stop])  # fmt: skip


def _researcher(project: int) -> Scope:
    return Scope(acl=pushdown(Principal("r", frozenset({project}), {SECTION: 1})))


def _retriever(pool: asyncpg.Pool, **env: str) -> Retriever:
    return build_retrieval(pool, None, load_gateway_settings(env, auth="off")).retriever


async def test_the_planner_estimates_a_small_scopes_rows_and_declines_a_whole_one(db_pool, partition) -> None:
    query = np.ones(DIM, dtype=np.float32) / np.sqrt(DIM)
    async with db_pool.acquire() as conn:
        few = await exact_scan_rows(conn, partition, query, _researcher(3), 40)
        everything = await exact_scan_rows(conn, partition, query, Scope(section_tipos=(SECTION,)), 40)
    assert few is not None and 10 <= few <= 500  # 50 rows, as the planner estimates them
    assert everything is None  # every row: a sequential scan, not an index's few


async def test_a_small_scope_is_answered_exactly_once_decided_and_a_large_one_by_hnsw(
    db_pool, partition, vectors, monkeypatch
) -> None:
    asked: list[Scope] = []
    decide = dense_leg.reads_exactly

    async def counted(conn, partition, vector, scope, limit, max_rows, modality="text"):
        asked.append(scope)
        return await decide(conn, partition, vector, scope, limit, max_rows, modality)

    monkeypatch.setattr(dense_leg, "reads_exactly", counted)
    retriever = _retriever(db_pool)
    narrow = _researcher(3)
    async with db_pool.acquire() as conn:
        for q in vectors[:20:4]:
            got = await retriever.legs.hnsw_search(conn, partition, q, narrow, 40)
            exact = await dense_search(conn, partition, q, narrow, 40, exact=True)
            assert [h.key for h in got] == [h.key for h in exact]
        assert len(asked) == 1  # decided once for the scope, then cached
        similar = Scope(acl=narrow.acl, exclude_record=(SECTION, 100))
        assert await retriever.legs.dense.reads_exactly(conn, partition, vectors[0], similar, 40)
        assert len(asked) == 1  # the record a similar search excludes does not make a new scope
        assert not await retriever.legs.dense.reads_exactly(conn, partition, vectors[0], Scope(), 40)
        assert not await retriever.legs.dense.reads_exactly(conn, partition, vectors[0], _researcher(1), 40)
        assert len(asked) == 2  # unscoped: never asked; the 100% researcher: asked, too many rows

        off = _retriever(db_pool, RAG_DENSE_EXACT_MAX_ROWS="0")
        assert not await off.legs.dense.reads_exactly(conn, partition, vectors[0], narrow, 40)
        assert len(asked) == 2


async def test_the_benchmarks_raw_legs_take_the_gateways_path(
    db_pool, partition, vectors, monkeypatch
) -> None:
    """The gateway suite's baseline (benchmarks.gateway.RawLegs) runs a scoped dense leg exactly
    where the gateway does, decided once per scope, and an unscoped one by HNSW."""
    ran: list[bool] = []
    estimates: list[Scope] = []
    search_dense, estimate = dense_leg.dense_search, dense_leg.exact_scan_rows

    async def recorded(*args, exact: bool = False, **kwargs):
        ran.append(exact)
        return await search_dense(*args, exact=exact, **kwargs)

    async def counted(conn, partition, vector, scope, limit, modality="text"):
        estimates.append(scope)
        return await estimate(conn, partition, vector, scope, limit, modality)

    monkeypatch.setattr(dense_leg, "dense_search", recorded)
    monkeypatch.setattr(dense_leg, "exact_scan_rows", counted)
    raw = RawLegs(db_pool, partition, ["chunk"], vectors[:4], limit=10)
    for scope, exact in [(_researcher(3), True), (_researcher(1), False), (Scope(), False)]:
        raw.scope = scope
        for i in range(3):
            await raw.dense(i)
        assert ran == [exact] * 3
        ran.clear()
    assert estimates == [_researcher(3), _researcher(1)]  # once per scope; unscoped never asks
