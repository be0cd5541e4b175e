"""The gateway's lexical engine: with ``RAG_LEXICAL_INDEX=tantivy`` over an index built before the
start, the lexical leg answers exactly as the SQL leg under the caller's ACL, semantic_search
answers like the index-off gateway, and /readyz and /metrics show the engine. The in-memory index
(``RAG_LEXICAL_INDEX=memory``) was retired: the settings, and so the gateway, refuse it by name."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from gateway.actions.context import RETRIEVER_KEY
from gateway.base.resources import LEXICAL_INDEX_KEY
from gateway.base.settings import load_gateway_settings
from gateway.cli import main
from gateway.retrieval.retriever import Retriever
from index.lexical.writer import LexicalWriter
from index.search.bm25 import CorpusStats
from index.search.lexical_leg import lexical_search
from index.store.hits import Scope
from index.store.partitions import list_partitions
from schema.settings import SettingsError
from tests.fixtures.gateway import running_gateway, token
from tests.test_gateway_vector_cache import QUERIES, RESEARCHER, _readyz

RETIRED = (
    "RAG_LEXICAL_INDEX=memory: the in-memory lexical index was retired; use auto (the default) or tantivy"
)


async def assert_lexical_leg_is_the_sql_legs(retriever: Retriever, k: int = 20) -> None:
    """The gateway's lexical leg (whichever engine serves it) answers every test query with the SQL
    leg's rows, scores and order, for a researcher and an administrator."""
    for query in QUERIES:
        for principal in (RESEARCHER, Principal("root", None, {}, admin=True)):
            scope = Scope(acl=pushdown(principal))
            legs = await retriever.query_legs(principal, query, scope, k, legs=("lexical",))
            model_id, _ = await retriever.queries.embed_query(principal, query)
            partition = await retriever.partitions.of(model_id)
            sql = await lexical_search(
                retriever.legs.pool, partition, query, scope, k, stats=CorpusStats(ttl=0)
            )
            assert [h.key for h in legs.lists["lexical"]] == [h.key for h in sql]
            assert [h.score for h in legs.lists["lexical"]] == pytest.approx([h.score for h in sql], rel=1e-9)


@pytest.mark.ray
async def test_the_engine_serves_the_lexical_leg_exactly(
    corpus_database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "lexical"
    pool = await asyncpg.create_pool(corpus_database_url, min_size=1, max_size=2)
    writer = LexicalWriter(pool, corpus_database_url, root)
    try:
        for partition in await list_partitions(pool):  # what `mnemo lexical rebuild` does
            await writer.rebuild(partition)
    finally:
        await writer.stop()
        await pool.close()
    async with (
        running_gateway(
            corpus_database_url, sidecar_url, RAG_LEXICAL_INDEX="tantivy", RAG_LEXICAL_DIR=str(root)
        ) as on,
        running_gateway(corpus_database_url, sidecar_url, RAG_LEXICAL_INDEX="off") as off,
    ):
        lexical = (await _readyz(on))["lexical_index"]
        assert lexical["mode"] == "tantivy" and lexical["running"] and lexical["root"] == str(root)
        assert (await _readyz(off))["lexical_index"] == {"mode": "off", "running": False}
        assert off.app[RETRIEVER_KEY].legs.lexical_engine is None
        retriever = on.app[RETRIEVER_KEY]
        assert retriever.legs.lexical_engine is on.app[LEXICAL_INDEX_KEY]  # built with the app's engine
        await assert_lexical_leg_is_the_sql_legs(retriever)
        lexical = (await _readyz(on))["lexical_index"]  # opened by the first searches
        assert lexical["partitions"] and all(p["state"] == "ready" for p in lexical["partitions"].values())
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
        assert 'result="cold"' not in text  # every partition had its index from the start


def test_the_retired_in_memory_index_is_refused_by_name() -> None:
    with pytest.raises(SettingsError) as refused:
        load_gateway_settings({"RAG_LEXICAL_INDEX": "memory", "RAG_AUTH": "off"})
    message = str(refused.value)
    assert message.startswith(RETIRED)
    assert "`mnemo lexical follow`" in message and "docs/scale.md" in message
    with pytest.raises(SettingsError, match=r"RAG_LEXICAL_INDEX='fast': use one of auto, tantivy, off$"):
        load_gateway_settings({"RAG_LEXICAL_INDEX": "fast", "RAG_AUTH": "off"})
    for mode in ("auto", "tantivy", "off"):
        assert load_gateway_settings({"RAG_LEXICAL_INDEX": mode, "RAG_AUTH": "off"}).lexical_index == mode


def test_a_gateway_given_the_in_memory_index_does_not_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAG_LEXICAL_INDEX", "memory")
    monkeypatch.setenv("RAG_AUTH", "off")
    assert main(["gateway", "--port", "1"]) == 2  # refused before anything binds or connects
    assert f"mnemo gateway: {RETIRED}" in capsys.readouterr().err
