"""The SQL push-down of the ACL returns exactly what the gate admits (so filters never cost recall)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.acl import chunk_readable, contributors_readable, gate, pushdown
from gateway.access.auth import Principal
from index.search.dense_leg import dense_search
from index.store.hits import ChunkHit, Scope
from index.store.partitions import get_partition
from schema import create_pool
from tests.fixtures.gateway import TEXT_MODEL

pytestmark = pytest.mark.ray

TIPOS = ["oh1", "rsc1", "fill1", "dd810"]
COMPONENTS = ["oh1/oh22", "oh1/oh23", "dd810/dd812", "rsc1/rsc140", "fill1/f1"]


def _chunk(tipo: str, component: str, contributors, projects=(1,)) -> ChunkHit:
    meta = {} if contributors is None else {"contributors": contributors}
    return ChunkHit(tipo, 1, component, "lg-eng", 0, "t", meta, tuple(projects), None, 0.0)


def test_gate_rules() -> None:
    p = Principal("a", frozenset({1}), {"oh1": 1, "oh1/oh23": 0, "dd810": 0})
    assert chunk_readable(p, _chunk("oh1", "rag:card", ["oh22"]))
    assert not chunk_readable(p, _chunk("oh1", "rag:card", ["oh22", "oh23"]))
    assert not chunk_readable(p, _chunk("oh1", "rag:card", ["oh22", "dd810/dd812"]))
    assert not chunk_readable(p, _chunk("oh1", "rag:card", []))
    assert not chunk_readable(p, _chunk("oh1", "rag:card", None))
    assert not chunk_readable(p, _chunk("oh1", "rag:card", ["oh22"], projects=(2,)))
    assert chunk_readable(p, _chunk("oh1", "oh22", None))  # a per-component chunk: its own level
    assert not chunk_readable(p, _chunk("oh1", "oh23", None))
    assert not contributors_readable(p, "oh1", ["oh1/oh22/x"]) and not contributors_readable(p, "oh1", [""])
    assert not contributors_readable(p, "oh1", "oh22") and not contributors_readable(p, "oh1", [3])
    admin = Principal("root", frozenset(), {}, admin=True)
    assert chunk_readable(admin, _chunk("x", "rag:g", [])) and pushdown(admin) is None
    assert gate(p, [_chunk("oh1", "rag:card", ["oh22"])], Scope(section_tipos=("rsc1",))) == []


principals = st.builds(
    Principal,
    sub=st.just("p"),
    projects=st.one_of(st.none(), st.frozensets(st.sampled_from([1, 2, 8, 9]), max_size=3)),
    perms=st.dictionaries(st.sampled_from(TIPOS + COMPONENTS), st.integers(0, 2), max_size=6),
)


@pytest.fixture(scope="module")
async def corpus_rows(corpus_database_url: str):
    pool = await create_pool(corpus_database_url, max_size=2)
    partition = await get_partition(pool, TEXT_MODEL)
    assert partition is not None
    async with pool.acquire() as conn:
        everything = await dense_search(
            conn, partition, np.ones(partition.dimension, np.float32), Scope(), 1000
        )
    yield pool, partition, everything
    await pool.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(principal=principals)
async def test_pushdown_matches_the_gate_exactly(corpus_rows, principal: Principal) -> None:
    pool, partition, everything = corpus_rows
    assert len(everything) > 200
    async with pool.acquire() as conn:
        pushed = await dense_search(
            conn, partition, np.ones(partition.dimension, np.float32), Scope(acl=pushdown(principal)), 1000
        )
    assert {c.key for c in pushed} == {c.key for c in gate(principal, everything)}
