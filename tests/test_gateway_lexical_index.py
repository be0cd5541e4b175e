"""The gateway with the in-memory lexical index on: the lexical leg answers exactly as the SQL leg
under the caller's ACL, semantic_search answers like the index-off gateway, and /readyz and /metrics
show the index."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.acl import pushdown
from gateway.auth import Principal
from gateway.context import RETRIEVER_KEY
from gateway.resources import LEXICAL_INDEX_KEY
from gateway.retrieval import Retriever
from index.bm25 import CorpusStats
from index.hits import Scope
from index.lexical_leg import lexical_search
from tests.fixtures.gateway import running_gateway, token
from tests.test_gateway_vector_cache import QUERIES, RESEARCHER, _readyz, _wait_ready

pytestmark = pytest.mark.ray


async def assert_lexical_leg_is_the_sql_legs(retriever: Retriever, k: int = 20) -> None:
    """The gateway's lexical leg (whichever engine serves it) answers every test query with the SQL
    leg's rows, scores and order, for a researcher and an administrator."""
    for query in QUERIES:
        for principal in (RESEARCHER, Principal("root", None, {}, admin=True)):
            scope = Scope(acl=pushdown(principal))
            legs = await retriever.query_legs(principal, query, scope, k, legs=("lexical",))
            model_id, _ = await retriever.queries.embed_query(principal, query)
            partition = await retriever.partition(model_id)
            sql = await lexical_search(retriever.pool, partition, query, scope, k, stats=CorpusStats(ttl=0))
            assert [h.key for h in legs.lists["lexical"]] == [h.key for h in sql]
            assert [h.score for h in legs.lists["lexical"]] == pytest.approx([h.score for h in sql], rel=1e-9)


async def test_the_index_serves_the_lexical_leg_exactly(corpus_database_url: str, sidecar_url: str) -> None:
    async with (
        running_gateway(corpus_database_url, sidecar_url, RAG_LEXICAL_INDEX="memory") as on,
        running_gateway(corpus_database_url, sidecar_url, RAG_LEXICAL_INDEX="off") as off,
    ):
        lexical = await _wait_ready(on, "lexical_index")
        assert lexical["mode"] == "memory" and lexical["listening"] and lexical["running"]
        assert (await _readyz(off))["lexical_index"] == {"mode": "off", "running": False}
        assert off.app[RETRIEVER_KEY].legs.lexical_engine is None
        retriever = on.app[RETRIEVER_KEY]
        assert retriever.legs.lexical_engine is on.app[LEXICAL_INDEX_KEY]  # built with the app's engine
        await assert_lexical_leg_is_the_sql_legs(retriever)
        researcher = token("r", projects=[9], fill1=1, oh1=1)
        for query in QUERIES:
            got = await on.ok("semantic_search", {"query": query, "limit": 10}, bearer=researcher)
            want = await off.ok("semantic_search", {"query": query, "limit": 10}, bearer=researcher)
            assert [(h["section_tipo"], h["section_id"]) for h in got] == [
                (h["section_tipo"], h["section_id"]) for h in want
            ]
        async with aiohttp.ClientSession() as s, s.get(on.url + "/metrics") as r:
            text = await r.text()
        assert 'mnemo_lexical_searches_total{result="hit"}' in text
        assert 'mnemo_lexical_partitions{state="ready"} 1.0' in text
        for family in ("mnemo_lexical_bytes", "mnemo_lexical_chunks", "mnemo_lexical_load_seconds"):
            assert family in text
