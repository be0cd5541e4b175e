"""The gateway with the FAISS cache on: the dense leg is exact under the caller's ACL, similar_to and
semantic_search answer like the cache-off gateway, and /readyz and /metrics show the cache."""

from __future__ import annotations

import json

import aiohttp
import pytest

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from gateway.actions.context import RETRIEVER_KEY
from gateway.base.resources import VECTOR_CACHE_KEY
from index.search.dense_leg import dense_search
from index.store.hits import Scope
from index.vectors.faiss_backend import gpu_available
from tests.fixtures.gateway import Gateway, running_gateway, token
from tests.waiting import until

pytestmark = pytest.mark.ray

RESEARCHER = Principal("r", frozenset({9}), {"fill1": 1, "oh1": 1})
QUERIES = ["Roman bronze coin of Emerita", "reservoir flooded the valley", "village submerged by the dam"]


async def _readyz(gw: Gateway) -> dict:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/readyz") as r:
        return json.loads(await r.text())["data"]


async def _wait_ready(gw: Gateway, part: str = "faiss") -> dict:
    """The /readyz detail ``part`` (an in-process index) once every partition is loaded."""

    async def loaded() -> dict | None:
        held = (await _readyz(gw))[part]
        ready = held["partitions"] and all(p["state"] == "ready" for p in held["partitions"].values())
        return held if ready else None

    return await until(f"{part} to load every partition", loaded, every_s=0.1)


async def test_cache_serves_the_dense_leg_exactly(corpus_database_url: str, sidecar_url: str) -> None:
    async with (
        running_gateway(corpus_database_url, sidecar_url, RAG_FAISS_CACHE="cpu") as on,
        running_gateway(corpus_database_url, sidecar_url) as off,
        running_gateway(corpus_database_url, sidecar_url, RAG_FAISS_CACHE="auto") as auto,
    ):
        faiss = await _wait_ready(on)
        assert faiss["mode"] == "cpu" and faiss["device"] == "cpu" and faiss["listening"] and faiss["running"]
        assert (await _readyz(off))["faiss"] == {"mode": "off", "running": False}
        # auto caches on a GPU only (on CPU the flat scan was slower than HNSW at every size measured)
        if not gpu_available():
            assert (await _readyz(auto))["faiss"] == {"mode": "auto", "running": False}
            assert auto.app[RETRIEVER_KEY].legs.vector_cache is None
        retriever = on.app[RETRIEVER_KEY]
        assert retriever.legs.vector_cache is on.app[VECTOR_CACHE_KEY]  # built with the app's cache
        for query in QUERIES:
            for principal in (RESEARCHER, Principal("root", None, {}, admin=True)):
                scope = Scope(acl=pushdown(principal))
                legs = await retriever.query_legs(principal, query, scope, 20, legs=("dense",))
                model_id, vector = await retriever.queries.embed_query(principal, query)
                partition = await retriever.partitions.of(model_id)
                async with retriever.legs.pool.acquire() as conn:
                    exact = await dense_search(conn, partition, vector.dense, scope, 20, exact=True)
                assert [(h.key, h.score) for h in legs.lists["dense"]] == [(h.key, h.score) for h in exact]
                assert set(legs.exact) >= {h.key for h in exact}  # every candidate re-scored
        researcher = token("r", projects=[9], fill1=1, oh1=1)
        for query in QUERIES:
            got = await on.ok("semantic_search", {"query": query, "limit": 10}, bearer=researcher)
            want = await off.ok("semantic_search", {"query": query, "limit": 10}, bearer=researcher)
            assert {h["section_id"] for h in got} == {h["section_id"] for h in want}
            assert all(h["section_tipo"] == "fill1" and 100 <= h["section_id"] < 130 for h in got)
        seed = {"section_tipo": "oh1", "section_id": 2, "limit": 5}
        got, want = await on.ok("similar_to", seed), await off.ok("similar_to", seed)
        assert {(h["section_tipo"], h["section_id"]) for h in got} == {
            (h["section_tipo"], h["section_id"]) for h in want
        }
        assert all(h["similarity"] is not None for h in got)
        async with aiohttp.ClientSession() as s, s.get(on.url + "/metrics") as r:
            text = await r.text()
        assert 'mnemo_faiss_searches_total{result="hit"}' in text
        assert 'mnemo_faiss_partitions{state="ready"} 1.0' in text
        for family in ("mnemo_faiss_bytes", "mnemo_faiss_sync_lag_seconds", "mnemo_faiss_vectors"):
            assert family in text
