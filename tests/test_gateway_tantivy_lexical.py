"""The gateway with its default RAG_LEXICAL_INDEX=auto: before any index exists the SQL leg serves
(counted, shown in /readyz); once a writer started after the gateway builds the index, the gateway
opens it read-only without a restart, and its lexical leg answers with the SQL leg's scores and
order under the caller's ACL."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.actions.context import RETRIEVER_KEY
from index.lexical.writer import LexicalWriter
from index.store.partitions import list_partitions
from tests.fixtures.gateway import running_gateway
from tests.test_gateway_lexical_index import assert_lexical_leg_is_the_sql_legs
from tests.test_gateway_vector_cache import QUERIES, _readyz

pytestmark = pytest.mark.ray


async def _searches(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        return await r.text()


async def test_the_default_gateway_serves_the_lexical_leg_from_tantivy_once_built(
    corpus_database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    root = tmp_path / "lexical"  # not there yet: the writer creates it
    pool = await asyncpg.create_pool(corpus_database_url, min_size=1, max_size=2)
    writer = LexicalWriter(pool, corpus_database_url, root)
    try:
        async with running_gateway(corpus_database_url, sidecar_url, RAG_LEXICAL_DIR=str(root)) as on:
            retriever = on.app[RETRIEVER_KEY]
            await assert_lexical_leg_is_the_sql_legs(retriever)  # no index: the SQL leg itself
            lexical = (await _readyz(on))["lexical_index"]
            assert lexical["mode"] == "auto" and lexical["root"] == str(root)
            assert {p["state"] for p in lexical["partitions"].values()} == {"missing"}
            assert 'mnemo_lexical_searches_total{result="cold"}' in await _searches(on.url)

            for partition in await list_partitions(pool):
                await writer.rebuild(partition)
            # The demo corpus is small: 4 x 20 candidates hold every match, so the top is exact.
            await assert_lexical_leg_is_the_sql_legs(retriever)
            lexical = (await _readyz(on))["lexical_index"]
            assert all(p["state"] == "ready" and p["behind"] == 0 for p in lexical["partitions"].values())
            assert 'mnemo_lexical_searches_total{result="hit"}' in await _searches(on.url)
    finally:
        await writer.stop()
        await pool.close()


def _hits(metrics: str) -> int:
    """The lexical engine's answered searches (``mnemo_lexical_searches_total{result="hit"}``)."""
    found = re.search(r'^mnemo_lexical_searches_total\{result="hit"\} (\S+)$', metrics, re.M)
    return 0 if found is None else int(float(found.group(1)))


async def test_searches_beyond_the_read_pools_wait_for_a_connection_and_answer_as_alone(
    corpus_database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    """``RAG_DB_READ_POOL_SIZE`` sizes both read pools of a worker (the legs' and the lexical
    engine's re-reads): at 1, a dozen concurrent searches (each wanting two reads at once, then a
    re-read) queue for the connections and each answers exactly what it answers alone."""
    root = tmp_path / "lexical"
    pool = await asyncpg.create_pool(corpus_database_url, min_size=1, max_size=2)
    writer = LexicalWriter(pool, corpus_database_url, root)
    try:
        for partition in await list_partitions(pool):
            await writer.rebuild(partition)
        env = {"RAG_LEXICAL_DIR": str(root), "RAG_DB_READ_POOL_SIZE": "1"}
        async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
            legs = gw.app[RETRIEVER_KEY].legs
            assert legs.pool.primary.get_max_size() == 1 and legs.reread_pool.primary.get_max_size() == 1
            queries = [QUERIES[i % len(QUERIES)] for i in range(12)]
            alone = {q: await gw.ok("semantic_search", {"query": q, "limit": 10}) for q in set(queries)}
            before = _hits(await _searches(gw.url))
            together = await asyncio.gather(
                *(gw.ok("semantic_search", {"query": q, "limit": 10}) for q in queries)
            )
            assert together == [alone[q] for q in queries]
            assert _hits(await _searches(gw.url)) - before == len(queries)  # the engine answered each
    finally:
        await writer.stop()
        await pool.close()
