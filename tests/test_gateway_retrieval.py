"""Retrieval through the real intake path: accents, proper nouns, inventory numbers, learned-sparse."""

from __future__ import annotations

import pytest

from gateway.access.auth import Principal
from gateway.actions.context import RETRIEVER_KEY
from index.search.read_settings import read_session_settings
from index.store.hits import Scope
from schema import session_settings
from tests.fixtures.gateway import Gateway, running_gateway

pytestmark = pytest.mark.ray

SECTIONS = {
    "oh1": {"embed": [{"id": "summary", "contributors": ["oh23"], "mode": "short"}]},
    "mus1": {"embed": [{"id": "card", "contributors": ["mus12", "mus14"], "mode": "short"}]},
}


def _record(tipo: str, sid: int, text: str, lang: str = "lg-eng", group: str = "summary") -> dict:
    return {
        "section_tipo": tipo,
        "section_id": sid,
        "projects": [1],
        "title": f"Record {sid}",
        "groups": {group: {lang: text}},
    }


RECORDS = [
    _record("oh1", 1, "Cuando llegó el agua del pantano tuvimos que marcharnos del pueblo.", "lg-spa"),
    _record("oh1", 2, "Memories of the textile colony and the night shifts at the factory."),
    _record("oh1", 3, "A conversation about Benalúa de las Villas and the olive harvest."),
    _record("oh1", 4, "Olive harvest traditions in the villages of Andalusia and their festivals."),
    _record("oh1", 5, "Village life before the reservoir: harvests, festivals and the church."),
    _record("oh1", 6, "The dam flooded the valley and the water covered the old village."),
    _record("mus1", 1, "Red-figure amphora, inventory number MAN-1999/0042, found in a tomb.", group="card"),
    _record(
        "mus1", 2, "Amphora types of the Roman period, with inventory numbers of the museum.", group="card"
    ),
    _record(
        "mus1", 3, "Greek red-figure pottery in the museum collection: amphorae and kraters.", group="card"
    ),
]


@pytest.fixture(scope="module")
async def ingested(pg_server, template_db, sidecar_url):
    from tests.conftest import _create_database, _drop_database

    name = await _create_database(pg_server, template_db)
    try:
        async with running_gateway(pg_server.url_for(name), sidecar_url) as gw:
            await gw.ingest(SECTIONS, RECORDS)
            yield gw
    finally:
        await _drop_database(pg_server, name)


def _top(hits: list[dict]) -> tuple[str, int]:
    return hits[0]["section_tipo"], hits[0]["section_id"]


@pytest.mark.parametrize("query", ["pantáno", "PANTANO", "el agua del pantáno", "marchárnos"])
async def test_accented_and_unaccented_queries_find_the_record(ingested: Gateway, query: str) -> None:
    assert _top(await ingested.ok("semantic_search", {"query": query})) == ("oh1", 1)


@pytest.mark.parametrize("query", ["Benalua", "Benalúa", "benalúa olive"])
async def test_a_proper_noun_ranks_its_record_first(ingested: Gateway, query: str) -> None:
    assert _top(await ingested.ok("semantic_search", {"query": query})) == ("oh1", 3)


@pytest.mark.parametrize("query", ["MAN-1999/0042", "inventory MAN-1999/0042", "man-1999/0042"])
async def test_an_inventory_number_ranks_its_record_first(ingested: Gateway, query: str) -> None:
    assert _top(await ingested.ok("semantic_search", {"query": query})) == ("mus1", 1)


async def test_lexical_leg_has_or_semantics_and_idf(ingested: Gateway) -> None:
    retriever = ingested.app[RETRIEVER_KEY]
    admin = Principal("root", None, {}, admin=True)
    # "Benalúa" is rare, "village"/"harvest" are common: the rare term decides, and a query term absent
    # from the corpus ("zzyzx") does not empty the result (OR, not AND).
    legs = await retriever.query_legs(admin, "zzyzx harvest village Benalúa", Scope(), 20, ("lexical",))
    lexical = legs.lists["lexical"]
    assert lexical[0].record == ("oh1", 3)
    assert {c.record for c in lexical} >= {("oh1", 3), ("oh1", 4), ("oh1", 5)}
    assert [c.score for c in lexical] == sorted((c.score for c in lexical), reverse=True)


async def test_passages_carry_the_chunk_position(ingested: Gateway) -> None:
    passages = await ingested.ok("retrieve", {"query": "red-figure amphora", "section_tipo": "mus1"})
    top = passages[0]
    assert top["group"] == "card" and top["chunk_index"] == 0 and top["lang"] == "lg-eng"
    assert "MAN-1999/0042" in top["text"] or "red-figure" in top["text"]


async def test_query_vectors_are_cached(ingested: Gateway) -> None:
    metrics = ingested.app[RETRIEVER_KEY].metrics
    before = metrics.query_cache.labels("hit")._value.get()
    await ingested.ok("semantic_search", {"query": "the  olive   harvest"})
    await ingested.ok("semantic_search", {"query": "the olive harvest"})
    assert metrics.query_cache.labels("hit")._value.get() == before + 1


async def test_learned_sparse_leg(pg_server, template_db, sidecar_url) -> None:
    from tests.conftest import _create_database, _drop_database

    name = await _create_database(pg_server, template_db)
    try:
        async with running_gateway(
            pg_server.url_for(name), sidecar_url, RAG_TEXT_MODEL="tiny-bge-m3-random"
        ) as gw:
            await gw.ingest(SECTIONS, RECORDS)
            retriever = gw.app[RETRIEVER_KEY]
            admin = Principal("root", None, {}, admin=True)
            text = RECORDS[6]["groups"]["card"]["lg-eng"]
            legs = await retriever.query_legs(admin, text, Scope(), 20)
            assert set(legs.lists) == {"dense", "lexical", "sparse"}
            sparse = legs.lists["sparse"]
            assert sparse and ("mus1", 1) in {c.record for c in sparse}
            assert all(c.score > 0 for c in sparse)
            hits = await gw.ok("semantic_search", {"query": text})
            assert _top(hits) == ("mus1", 1)
    finally:
        await _drop_database(pg_server, name)


async def test_the_read_pool_opens_its_sessions_with_the_legs_settings(ingested: Gateway) -> None:
    """So a leg needs no SET LOCAL transaction of its own (tests/test_read_session.py)."""
    retriever = ingested.app[RETRIEVER_KEY]
    configured = retriever.settings
    session = read_session_settings(configured.hnsw_ef_search, configured.hnsw_max_scan_tuples)
    async with retriever.legs.pool.acquire() as conn:
        assert session_settings(conn) == session
        assert await conn.fetchval("SELECT current_setting('hnsw.ef_search')") == session["hnsw.ef_search"]
