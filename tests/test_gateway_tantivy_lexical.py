"""The gateway with RAG_LEXICAL_INDEX=tantivy: it opens the writer's index read-only, its lexical leg
answers with the SQL leg's scores and order under the caller's ACL, and /readyz and /metrics show it."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.context import RETRIEVER_KEY
from index.partitions import list_partitions
from index.tantivy_writer import LexicalWriter
from tests.fixtures.gateway import running_gateway
from tests.test_gateway_lexical_index import assert_lexical_leg_is_the_sql_legs
from tests.test_gateway_vector_cache import _readyz

pytestmark = pytest.mark.ray


async def test_the_gateway_serves_the_lexical_leg_from_tantivy(
    corpus_database_url: str, sidecar_url: str, tmp_path: Path
) -> None:
    pool = await asyncpg.create_pool(corpus_database_url, min_size=1, max_size=2)
    writer = LexicalWriter(pool, corpus_database_url, tmp_path)
    try:
        for partition in await list_partitions(pool):
            await writer.rebuild(partition)
        async with running_gateway(
            corpus_database_url, sidecar_url, RAG_LEXICAL_INDEX="tantivy", RAG_LEXICAL_DIR=str(tmp_path)
        ) as on:
            # The demo corpus is small: 4 x 20 candidates hold every match, so the top is exact.
            await assert_lexical_leg_is_the_sql_legs(on.app[RETRIEVER_KEY])
            lexical = (await _readyz(on))["lexical_index"]
            assert lexical["mode"] == "tantivy" and lexical["root"] == str(tmp_path)
            assert all(p["state"] == "ready" and p["behind"] == 0 for p in lexical["partitions"].values())
            async with aiohttp.ClientSession() as s, s.get(on.url + "/metrics") as r:
                text = await r.text()
            assert 'mnemo_lexical_searches_total{result="hit"}' in text
    finally:
        await writer.stop()
        await pool.close()
