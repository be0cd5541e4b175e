"""The ACL push-down over the stored acl_pairs/acl_sections arrays admits exactly what the gate admits.

Migration 0013 stores, per row, the "<section>/<component>" pairs a chunk needs readable (NULL when
its contributors are malformed); the push-down checks them with array operators. Rows here are
written through the store's real upsert (so the generated columns are computed as in production)
and cover well-formed, cross-section, empty, missing and every kind of malformed contributor list.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import asyncpg
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.acl import gate, pushdown
from gateway.access.auth import Principal
from index.search.dense_leg import dense_search
from index.store.hits import ChunkHit, Scope
from index.store.partitions import ModelPartition, ensure_partition
from index.store.store import EmbeddingRow, upsert_rows

SECTIONS = ["oh1", "rsc1", "fill1"]
COMPONENTS = ["oh22", "oh23", "rag:card", "rag:bio"]
CONTRIBUTORS: list[object] = [
    ["oh22"],
    ["oh22", "oh23"],
    ["rsc1/rsc140"],
    ["fill1/f1", "oh22"],
    ["rsc1/oh22", "oh1/oh22"],
    [],
    None,  # no contributors key at all
    "oh22",  # not a list
    ["a/b/c"],
    [""],
    ["/x"],
    ["x/"],
    [3],
    ["oh22", None],
    [["oh22"]],
]
PERM_KEYS = [*SECTIONS, "oh1/oh22", "oh1/oh23", "rsc1/rsc140", "fill1/f1", "rsc1/oh22", "oh1/rag:card"]
DIM = 4


@pytest.fixture
async def acl_rows(
    db_pool: asyncpg.Pool,
) -> AsyncIterator[tuple[asyncpg.Pool, ModelPartition, list[ChunkHit]]]:
    partition = await ensure_partition(db_pool, "acl-arrays-4", DIM)
    rng = np.random.default_rng(11)
    record = 0
    for section, component, contributors in itertools.product(SECTIONS, COMPONENTS, CONTRIBUTORS):
        if not component.startswith("rag:") and contributors != ["oh22"]:
            continue  # contributors only matter for group chunks
        record += 1
        meta = {} if contributors is None else {"contributors": contributors}
        row = EmbeddingRow("text", section, record, component, "lg-spa", 0, f"h{record}", "t", "t",
                           rng.standard_normal(DIM), projects=[record % 3 + 1], chunk_meta=meta)  # fmt: skip
        async with db_pool.acquire() as conn, conn.transaction():
            await upsert_rows(conn, partition, [row])
    async with db_pool.acquire() as conn:
        everything = await dense_search(conn, partition, np.ones(DIM, np.float32), Scope(), 1000, exact=True)
    assert len(everything) == record
    yield db_pool, partition, everything


principals = st.builds(
    Principal,
    sub=st.just("p"),
    projects=st.one_of(st.none(), st.frozensets(st.sampled_from([1, 2, 3]), max_size=3)),
    perms=st.dictionaries(st.sampled_from(PERM_KEYS), st.integers(0, 2), max_size=7),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals)
async def test_array_pushdown_matches_the_gate_exactly(acl_rows, principal: Principal) -> None:
    pool, partition, everything = acl_rows
    async with pool.acquire() as conn:
        pushed = await dense_search(
            conn, partition, np.ones(DIM, np.float32), Scope(acl=pushdown(principal)), 1000, exact=True
        )
    assert {c.key for c in pushed} == {c.key for c in gate(principal, everything)}


async def test_malformed_contributors_store_no_pairs(acl_rows) -> None:
    pool, partition, _ = acl_rows
    rows = await pool.fetch(
        f"SELECT component_tipo, chunk_meta, acl_pairs, acl_sections FROM {partition.table} WHERE section_tipo = 'oh1'"
    )
    by_meta = {(r["component_tipo"], r["chunk_meta"]): (r["acl_pairs"], r["acl_sections"]) for r in rows}
    assert by_meta[("oh22", '{"contributors": ["oh22"]}')] == (["oh1/oh22"], ["oh1"])
    assert by_meta[("rag:card", '{"contributors": ["fill1/f1", "oh22"]}')] == (
        ["fill1/f1", "oh1/oh22"],
        ["fill1", "oh1"],
    )
    for meta in ("{}", '{"contributors": []}', '{"contributors": ["a/b/c"]}', '{"contributors": [3]}'):
        assert by_meta[("rag:card", meta)] == (None, None)
