"""The gateway with its default RAG_LEXICAL_INDEX=auto: before any index exists the SQL leg serves
(counted, shown in /readyz); once a writer started after the gateway builds the index, the gateway
opens it read-only without a restart, and its lexical leg answers with the SQL leg's scores and
order under the caller's ACL."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.actions.context import RETRIEVER_KEY
from index.lexical.writer import LexicalWriter
from index.store.partitions import list_partitions
from tests.fixtures.gateway import running_gateway
from tests.test_gateway_lexical_index import assert_lexical_leg_is_the_sql_legs
from tests.test_gateway_vector_cache import _readyz

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
