"""Budgets on the real gateway (PostgreSQL, the Ray sidecar, a local OpenAI-compatible server):
exactly the budget served under 64 concurrent callers, the ledger equal to the answers that succeeded
when the model fails half the calls, the ask grant, a flood shed as its own principal's 429s, the
ledger across a gateway restart and a real PostgreSQL restart (the MCP tool error: tests/test_mcp.py),
and the gateway's own POST /v1/embeddings metered on embedding_input_tokens."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import numpy as np
import pytest

from gateway.base.resources import POOL_KEY
from gateway.budgets import admin as budget_admin
from gateway.budgets.ledger import BUDGETS_KEY
from gateway.web.embeddings import token_bound
from schema import EmbeddedPostgres, create_pool
from tests.fixtures.chat_server import ChatServer, running_chat_server
from tests.fixtures.gateway import (
    ADMIN,
    CORPUS,
    DESCRIPTORS,
    TEXT_MODEL,
    Gateway,
    index_docs,
    ledger_used,
    put_sections,
    running_gateway,
    token,
)

pytestmark = pytest.mark.ray

DAM = "What happened when the reservoir flooded the valley?"
CHUNK = "oh1-1/rag:card/lg-eng/0"  # CORPUS[1]
CROWD = {"RAG_FAIR_RATE": "0", "RAG_FAIR_CONCURRENCY": "0", "RAG_ASK_RERANK": "false"}


def _reader(sub: str, **kw: Any) -> str:
    return token(sub, projects=[1], oh1=1, rsc1=1, **kw)


async def _post(
    http: aiohttp.ClientSession, gw: Gateway, bearer: str, action: str, options: dict[str, Any]
) -> tuple[int, dict[str, Any], Any]:
    body = {"dd_api": "dd_rag_api", "action": action, "options": options}
    async with http.post(
        gw.url + "/api/v1/json", json=body, headers={"Authorization": f"Bearer {bearer}"}
    ) as r:
        return r.status, await r.json(), r.headers


async def _crowd(gw: Gateway, bearer: str, callers: int, calls: int) -> list[tuple[int, dict, Any]]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as http:

        async def caller() -> list[tuple[int, dict, Any]]:
            return [await _post(http, gw, bearer, "ask", {"query": DAM}) for _ in range(calls)]

        return [r for rs in await asyncio.gather(*(caller() for _ in range(callers))) for r in rs]


async def _crowd_until_spent(gw: Gateway, bearer: str, callers: int) -> list[tuple[int, dict, Any]]:
    """``callers`` concurrent loops of ``ask``, each until the budget refuses it. A call that failed
    for the service's reason (the shared sidecar shedding the extractive provider's sentence embeddings
    at this concurrency: 503 ``rag.generation_failed``, retryable) is refunded, so its caller asks
    again; the bound only guards against a loop that never ends."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=callers)) as http:

        async def caller() -> list[tuple[int, dict, Any]]:
            results = []
            for _ in range(200):
                results.append(await _post(http, gw, bearer, "ask", {"query": DAM}))
                if results[-1][0] == 429:
                    break
            return results

        return [r for rs in await asyncio.gather(*(caller() for _ in range(callers))) for r in rs]


async def test_64_concurrent_callers_with_100_ask_runs_get_exactly_100(
    corpus_database_url: str, sidecar_url: str
) -> None:
    sub = "crowd-100"
    # The local chat server answers (the extractive provider's sentence embeddings made 64 callers
    # a load test of the shared sidecar, which shed some: refunded failures, whose refunds moved the
    # count a refusal reports), and an admin's call caches the query's vector first.
    async with running_chat_server() as chat:
        env = {**CROWD, "RAG_BUDGET_LIMITS": "user.ask=100", **_openai(chat), "RAG_LLM_LOCALITY": "local"}
        async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
            assert (await gw.call("ask", {"query": DAM}, bearer=ADMIN))[0] == 200
            results = await _crowd_until_spent(gw, _reader(sub), callers=64)
    served = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    failed = [r for r in results if r[0] not in (200, 429)]
    assert all((s, b["error"]["code"], b["error"]["retryable"]) == (503, "rag.generation_failed", True)
               for s, b, _ in failed), [b for _, b, _ in failed][:3]  # fmt: skip
    assert len(served) == 100, [r[1] for r in failed][:3]
    assert len(refused) == 64, "every caller asked until the budget refused it"
    for status, body, headers in refused:
        assert (status, body["error"]["code"]) == (429, "budget_exhausted"), body
        error = body["error"]
        assert (error["meter"], error["used"], error["limit"]) == ("ask", 100, 100)
        reset_at = datetime.fromisoformat(error["reset_at"])
        assert (reset_at.hour, reset_at.minute, reset_at.utcoffset().total_seconds()) == (
            0,
            0,
            0,
        )  # UTC midnight
        assert int(headers["Retry-After"]) == error["retry_after"] >= 1
    policy, state = served[0][2]["RateLimit-Policy"], served[0][2]["RateLimit"]
    assert '"ask";q=100;w=86400' in policy and '"ask";r=' in state
    remaining = sorted(int(h["RateLimit"].split("r=")[1].split(";")[0]) for _, _, h in served)
    if not failed:  # a refund between two reservations can show one remaining count twice
        assert remaining == list(range(100))
    assert set(remaining) <= set(range(100)) and remaining[0] == 0
    used = await ledger_used(corpus_database_url, sub)
    assert used["ask"] == 100 and used["query_embeddings"] == 100
    # the chat server reports 100 prompt and 20 completion tokens per answer: settled to its usage
    assert used["llm_prompt_tokens"] == 100 * 100 and used["llm_completion_tokens"] == 20 * 100


async def test_with_the_model_failing_half_the_calls_the_ledger_counts_the_successes(
    corpus_database_url: str, sidecar_url: str
) -> None:
    sub = "crowd-half"
    async with running_chat_server() as chat:
        chat.mode = "alternate"
        env = {
            **CROWD,
            "RAG_BUDGET_LIMITS": "user.ask=100",
            **_openai(chat),
            "RAG_LLM_LOCALITY": "local",
        }
        async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
            results = await _crowd(gw, _reader(sub), callers=64, calls=2)
    codes = [r[1]["error"]["code"] if r[0] != 200 else "ok" for r in results]
    succeeded = codes.count("ok")
    assert codes.count("rag.generation_failed") > 0 and succeeded > 0
    assert set(codes) <= {"ok", "rag.generation_failed", "budget_exhausted"}
    used = await ledger_used(corpus_database_url, sub)
    assert used["ask"] == succeeded
    # the chat server reports 100 prompt and 20 completion tokens per answer: settled to its usage
    assert used["llm_prompt_tokens"] == 100 * succeeded and used["llm_completion_tokens"] == 20 * succeeded


def _openai(chat: ChatServer) -> dict[str, str]:
    return {
        "RAG_LLM_PROVIDER": "openai",
        "RAG_LLM_ENDPOINT": chat.url,
        "RAG_LLM_MODEL": "test-chat-model",
        "RAG_LLM_TIMEOUT": "5",
    }


async def test_ask_needs_its_grant_before_any_retrieval(corpus_database_url: str, sidecar_url: str) -> None:
    sub = "no-grant"
    bare = _reader(sub, grants=())
    async with running_gateway(corpus_database_url, sidecar_url) as gw:
        status, body = await gw.call("ask", {"query": DAM}, bearer=bare)
        assert (status, body["error"]["code"]) == (403, "auth.ask_not_granted"), body
        assert await ledger_used(corpus_database_url, sub) == {}  # nothing reserved, nothing retrieved
        assert (await gw.call("semantic_search", {"query": DAM}, bearer=bare))[0] == 200
        assert await ledger_used(corpus_database_url, sub) == {"query_embeddings": 1}
        status, body = await gw.call("read_chunk", {"chunk_id": CHUNK}, bearer=bare)
        assert await ledger_used(corpus_database_url, sub) == {"query_embeddings": 1}  # unmetered
    async with running_gateway(corpus_database_url, sidecar_url, RAG_ASK_GRANT="open") as gw:
        assert (await gw.call("ask", {"query": DAM}, bearer=bare))[0] == 200


async def test_the_ledger_commits_without_a_disk_flush_unless_told(
    corpus_database_url: str, sidecar_url: str
) -> None:
    """The ledger's own pool: its sessions skip the flush (RAG_BUDGET_DURABLE_COMMIT off, the
    default) while the main pool's writes keep it; told, the ledger flushes too."""
    for durable, expected in (("false", "off"), ("true", "on")):
        async with running_gateway(corpus_database_url, sidecar_url, RAG_BUDGET_DURABLE_COMMIT=durable) as gw:
            assert await gw.app[BUDGETS_KEY].ledger.pool.fetchval("SHOW synchronous_commit") == expected
            assert await gw.app[POOL_KEY].fetchval("SHOW synchronous_commit") == "on"
            assert (await gw.call("semantic_search", {"query": DAM}, bearer=_reader("flush")))[0] == 200
    assert await ledger_used(corpus_database_url, "flush") == {"query_embeddings": 2}


async def test_an_admins_searches_are_counted_exactly_once_the_gateways_leases_go_back(
    corpus_database_url: str, sidecar_url: str
) -> None:
    """An admin (no limit) is counted by lease (RAG_BUDGET_LEASE): while the gateway runs the ledger
    counts at least every search served and at most a lease ahead; stopped, it holds exactly them."""
    sub = f"lease-{uuid.uuid4().hex[:6]}"
    admin = token(sub, admin=True, projects=None)
    async with running_gateway(corpus_database_url, sidecar_url, RAG_BUDGET_LEASE="8") as gw:
        for served in range(1, 21):
            assert (await gw.call("semantic_search", {"query": DAM}, bearer=admin))[0] == 200
            counted = (await ledger_used(corpus_database_url, sub))["query_embeddings"]
            assert served <= counted < served + 8, (served, counted)
    assert await ledger_used(corpus_database_url, sub) == {"query_embeddings": 20}


async def test_a_flood_is_shed_as_its_own_429s_while_another_principal_is_served(
    corpus_database_url: str, sidecar_url: str
) -> None:
    """The flooder is shed; a principal named in RAG_FAIR_EXEMPT (a load test's) flooding the same way
    beside it is not, and its budget still counts every call."""
    env = {"RAG_FAIR_RATE": "5", "RAG_FAIR_BURST": "5", "RAG_FAIR_CONCURRENCY": "2"}
    flood, steady, load_test = _reader("flooder"), _reader("steady"), _reader("load-tester")
    async with (
        running_gateway(corpus_database_url, sidecar_url, RAG_FAIR_EXEMPT="load-tester", **env) as gw,
        aiohttp.ClientSession() as http,
    ):
        search = {"query": DAM, "rerank": False}
        flooding = asyncio.gather(*(_post(http, gw, flood, "semantic_search", search) for _ in range(40)))
        testing = asyncio.gather(*(_post(http, gw, load_test, "semantic_search", search) for _ in range(40)))
        steady_results = [await _post(http, gw, steady, "semantic_search", search) for _ in range(3)]
        flood_results = await flooding
        assert [r[0] for r in await testing] == [200] * 40
        assert await ledger_used(corpus_database_url, "load-tester") == {"query_embeddings": 40}
        assert [r[0] for r in steady_results] == [200, 200, 200]
        shed = [r for r in flood_results if r[0] == 429]
        assert shed and all(r[1]["error"]["code"] == "rate_limited" for r in shed)
        assert all(int(r[2]["Retry-After"]) >= 1 for r in shed)
        assert any(r[0] == 200 for r in flood_results)
        async with http.get(gw.url + "/metrics") as r:
            metrics = await r.text()
        assert f'mnemo_budget_rate_limited_total{{role="user"}} {float(len(shed))}' in metrics
        assert "flooder" not in metrics  # labelled by meter and role, never by principal


async def _get(gw: Gateway, path: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(gw.url + path) as r:
        return r.status, await r.json()


async def _ask_until_served(gw: Gateway, bearer: str, attempts: int) -> None:
    """Ask until one is served; each refusal before must be the coded, retryable 503 of a database
    not (yet) answering, never a 500."""
    for _ in range(attempts):
        status, body = await gw.call("ask", {"query": DAM}, bearer=bearer)
        if status == 200:
            return
        assert (status, body["error"]["code"], body["error"]["retryable"]) == (
            503,
            "service.unavailable",
            True,
        ), body
        await asyncio.sleep(0.1)
    raise AssertionError(f"ask was not served again in {attempts} attempts after PostgreSQL restarted")


async def test_the_ledger_survives_a_gateway_restart_and_a_real_postgresql_restart(
    sidecar_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 45's bar on a PostgreSQL server of this test's own (the session's is shared): the
    gateway migrates an empty database, a second gateway reads the first one's ledger, then the
    server really stops (``pg_ctl stop``, fast mode; the data folder kept) and starts again on the
    same socket while the second gateway keeps running and recovers without being touched."""
    sub = "restart"
    bearer = _reader(sub)
    # Not under pytest's basetemp, which another session on this machine may prune (tests/conftest.py).
    root = Path(tempfile.mkdtemp(prefix="mnemo-test-pg-restart-"))
    server = EmbeddedPostgres(root / "pg")
    await asyncio.to_thread(server.start)
    try:
        conn = await asyncpg.connect(server.url)
        try:
            await conn.execute("CREATE DATABASE ledger")  # empty: the first gateway migrates it
        finally:
            await conn.close()
        url = server.url_for("ledger")
        async with running_chat_server() as chat:
            env = {**CROWD, "RAG_BUDGET_LIMITS": "user.ask=3", **_openai(chat), "RAG_LLM_LOCALITY": "local"}
            async with running_gateway(url, sidecar_url, **env) as gw:
                pool = await create_pool(url, max_size=2)
                try:
                    await index_docs(pool, sidecar_url, CORPUS[1:3])
                    await put_sections(pool, DESCRIPTORS)
                finally:
                    await pool.close()
                assert (await gw.call("ask", {"query": DAM}, bearer=bearer))[0] == 200
            async with running_gateway(url, sidecar_url, **env) as gw:  # the ledger is in PostgreSQL
                assert (await gw.call("ask", {"query": DAM}, bearer=bearer))[0] == 200
                assert (await ledger_used(url, sub))["ask"] == 2

                caplog.clear()
                await asyncio.to_thread(server.stop)
                status, body = await gw.call("ask", {"query": DAM}, bearer=bearer)
                assert (status, body["error"]["code"], body["error"]["retryable"]) == (
                    503,
                    "service.unavailable",
                    True,
                ), body
                # unmetered reads: one that needs the database is the same coded 503, one that does
                # not (a section the caller may not read has no groups) still answers
                status, body = await gw.call("read_chunk", {"chunk_id": CHUNK}, bearer=bearer)
                assert (status, body["error"]["code"]) == (503, "service.unavailable"), body
                status, body = await gw.call("embed_groups", {"section_tipo": "fill1"}, bearer=bearer)
                assert (status, body["data"]) == (200, {"groups": []}), body
                assert (await gw.http("GET", "/healthz"))["status"] == "ok"  # the process stays up
                status, body = await _get(gw, "/readyz")
                assert (status, body["error"]["code"]) == (503, "service.unavailable"), body
                assert "database" in body["error"]["message"]

                await asyncio.to_thread(server.start)  # same data folder, same socket: the same URL
                assert server.url_for("ledger") == url
                await _ask_until_served(gw, bearer, attempts=100)
                status, body = await gw.call("read_chunk", {"chunk_id": CHUNK}, bearer=bearer)
                assert status == 200, body
                status, body = await gw.call("ask", {"query": DAM}, bearer=bearer)
                assert (status, body["error"]["code"], body["error"]["used"]) == (429, "budget_exhausted", 3)
        outage = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("gateway")]
        assert not outage, "the outage is not logged as a bug on the request path"
        # every served ask counted once, every refused one not at all; tokens settled to the chat
        # server's usage (100 prompt and 20 completion tokens per answer)
        used = await ledger_used(url, sub)
        assert used == {
            "ask": 3,
            "query_embeddings": 3,
            "llm_prompt_tokens": 300,
            "llm_completion_tokens": 60,
        }, used
    finally:
        await asyncio.to_thread(server.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_the_admin_budget_routes_refuse_bad_input_with_coded_400s(
    corpus_database_url: str, sidecar_url: str
) -> None:
    async with running_gateway(corpus_database_url, sidecar_url) as gw, aiohttp.ClientSession() as http:

        async def post(path: str, body: Any, bearer: str = ADMIN) -> tuple[int, dict[str, Any]]:
            async with http.post(
                gw.url + path, json=body, headers={"Authorization": f"Bearer {bearer}"}
            ) as r:
                return r.status, await r.json()

        for body in (
            {"principal": "a\u0000b", "meter": "ask", "limit": 1},
            {
                "principal": "a\ud800b",
                "meter": "ask",
                "limit": 1,
            },  # a lone surrogate: no text for the database
            {"principal": "x" * 300, "meter": "ask", "limit": 1},
            {"principal": "x", "meter": "gpu_hours", "limit": 1},
            {"principal": "x", "meter": "ask", "limit": True},
            {"principal": "x", "meter": "ask", "limit": -1},
            {"principal": "x", "meter": "ask", "limit": 2**63},
            {"principal": "x", "meter": "ask"},
            {"principal": 7, "meter": "ask", "limit": 1},
        ):
            status, answer = await post("/v1/budgets/limit", body)
            # a NUL is refused by the body reader already (request.invalid_text), the rest by the route
            assert status == 400, (body, answer)
            assert answer["error"]["code"] in ("request.invalid_options", "request.invalid_text"), answer
        raw = (
            '{"principal": "x", "meter": "ask", "limit": ' + "9" * 5000 + "}"
        )  # past Python's int-string limit
        async with http.post(
            gw.url + "/v1/budgets/limit",
            data=raw,
            headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"},
        ) as r:
            assert r.status == 400, await r.text()
        status, answer = await post("/v1/budgets/reset", {"principal": "x", "meter": 3})
        assert (status, answer["error"]["code"]) == (400, "request.invalid_options")
        status, answer = await post(
            "/v1/budgets/limit", {"principal": "x", "meter": "ask", "limit": 1}, _reader("r")
        )
        assert (status, answer["error"]["code"]) == (403, "auth.forbidden")
        assert (await post("/v1/budgets/limit", {"principal": "x", "meter": "ask", "limit": None}))[0] == 200
        shown = await gw.http("GET", "/v1/budgets?principal=x")
        assert shown["rows"] == [
            {**shown["rows"][0], "principal": "x", "meter": "ask", "used": 0, "limit": None, "override": True}
        ]


async def test_the_gateways_v1_embeddings_is_the_sidecars_answer_metered_per_principal(
    database_url: str, sidecar_url: str
) -> None:
    """Served with the sidecar's answer and charged exactly its usage.prompt_tokens; refused whole
    (429, nothing charged) when the input's bound passes the limit; a bad body and a missing token are
    coded before anything is reserved; with budgets off, served and not counted."""
    texts = ["A mill on the river", "Élan — a façade"]
    body = {"model": TEXT_MODEL, "input": texts, "user": "an OpenAI client's field, ignored"}
    async with (
        running_gateway(database_url, sidecar_url, RAG_FAIR_RATE="0") as gw,
        aiohttp.ClientSession() as http,
    ):

        async def post(payload: Any, bearer: str | None) -> tuple[int, Any, Any]:
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            async with http.post(gw.url + "/v1/embeddings", json=payload, headers=headers) as r:
                return r.status, await r.json(), r.headers

        status, answer, headers = await post(body, _reader("embedder"))
        async with http.post(sidecar_url + "/v1/embeddings", json=body) as r:
            direct = await r.json()
        assert status == 200, answer
        assert {**answer, "data": None} == {**direct, "data": None}  # object, model and usage exact
        assert [(d["object"], d["index"]) for d in answer["data"]] == [("embedding", 0), ("embedding", 1)]
        assert np.allclose([d["embedding"] for d in answer["data"]], [d["embedding"] for d in direct["data"]])
        tokens = answer["usage"]["prompt_tokens"]
        assert await ledger_used(database_url, "embedder") == {"embedding_input_tokens": tokens}
        limit = 1_000_000  # the role's default (RAG_BUDGET_LIMITS)
        assert '"embedding_input_tokens";q=1000000' in headers["RateLimit-Policy"]
        assert f'"embedding_input_tokens";r={limit - tokens};' in headers["RateLimit"]

        # a limit below the bound of the request (its bytes and specials), above its real cost: refused
        bound = token_bound(texts)
        assert tokens < bound
        await budget_admin.set_limit(gw.app[BUDGETS_KEY].ledger, "tight", "embedding_input_tokens", bound - 1)
        status, answer, headers = await post(body, _reader("tight"))
        assert (status, answer["error"]["code"]) == (429, "budget_exhausted"), answer
        assert (answer["error"]["meter"], answer["error"]["used"]) == ("embedding_input_tokens", 0)
        assert int(headers["Retry-After"]) >= 1
        assert await ledger_used(database_url, "tight") == {}

        for bad in ([], {"input": texts}, {"model": TEXT_MODEL, "input": []}, {**body, "input": [1]},
                    {**body, "encoding_format": "int8"}, {**body, "dimensions": True}):  # fmt: skip
            status, answer, _ = await post(bad, _reader("careless"))
            assert (status, answer["error"]["code"]) == (400, "request.invalid_request"), (bad, answer)
        assert await ledger_used(database_url, "careless") == {}  # nothing reserved for a refused body
        status, answer, _ = await post({**body, "model": "no-such-model"}, _reader("careless"))
        assert (status, answer["error"]["code"]) == (404, "embeddings.model_not_found"), answer
        assert await ledger_used(database_url, "careless") == {"embedding_input_tokens": 0}  # refunded whole
        status, answer, _ = await post(body, None)
        assert (status, answer["error"]["code"]) == (401, "auth.not_logged"), answer
    async with (
        running_gateway(database_url, sidecar_url, RAG_BUDGETS="false") as gw,
        aiohttp.ClientSession() as http,
    ):
        headers = {"Authorization": f"Bearer {_reader('embedder')}"}
        async with http.post(gw.url + "/v1/embeddings", json=body, headers=headers) as r:
            assert r.status == 200 and "RateLimit" not in r.headers  # served, unmetered
            assert (await r.json())["usage"]["prompt_tokens"] == tokens
        assert await ledger_used(database_url, "embedder") == {"embedding_input_tokens": tokens}


async def test_the_official_openai_sdk_lists_and_embeds_through_the_gateway_with_a_users_token(
    database_url: str, sidecar_url: str
) -> None:
    """What a new user does: the OpenAI SDK pointed at the gateway with their own token lists the
    models (what any caller reads of them, not where they run) and embeds, metered; a token whose
    budget is spent gets the coded 429 through the SDK's own error."""
    from openai import AsyncOpenAI, RateLimitError

    async with running_gateway(database_url, sidecar_url, RAG_FAIR_RATE="0") as gw:
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key=_reader("newcomer"), max_retries=0) as sdk:
            listed = {model.id: model async for model in sdk.models.list()}
            answer = await sdk.embeddings.create(model=TEXT_MODEL, input=["a coin", "an amphora"])
        await budget_admin.set_limit(gw.app[BUDGETS_KEY].ledger, "spent", "embedding_input_tokens", 0)
        async with AsyncOpenAI(base_url=gw.url + "/v1", api_key=_reader("spent"), max_retries=0) as sdk:
            with pytest.raises(RateLimitError) as refused:
                await sdk.embeddings.create(model=TEXT_MODEL, input="a coin")
    assert TEXT_MODEL in listed
    seen = listed[TEXT_MODEL].model_dump()
    assert (seen["object"], seen["owned_by"], seen["kind"], seen["dimension"]) == (
        "model",
        "mnemo",
        "text",
        384,
    )
    assert "device" not in seen and "dtype" not in seen  # an admin's detail
    assert [d.index for d in answer.data] == [0, 1] and len(answer.data[0].embedding) == 384
    assert await ledger_used(database_url, "newcomer") == {
        "embedding_input_tokens": answer.usage.prompt_tokens
    }
    error = refused.value.body
    assert isinstance(error, dict) and (error["code"], error["meter"]) == (
        "budget_exhausted",
        "embedding_input_tokens",
    )
    assert await ledger_used(database_url, "spent") == {}
