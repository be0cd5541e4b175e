"""``ask`` end to end on the real gateway, Postgres and Ray sidecar; an OpenAI-compatible server on loopback.

Every outcome (ok, no_grounded_context, external_generation_restricted,
rag.generation_failed), the ACL on answers, egress, citation validation,
reranking and its fallback, and streaming.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.fixtures.chat_server import ChatServer, running_chat_server
from tests.fixtures.gateway import Gateway, running_gateway, token

pytestmark = pytest.mark.ray

DAM = "What happened when the reservoir flooded the valley?"
# Reads oh1 and rsc1 in project 1, but neither project 2 (oh1-3) nor dd810 (a contributor of oh1-4).
RESEARCHER = token("researcher", projects=[1], oh1=1, rsc1=1)
NOBODY = token("nobody", projects=[1])


def _records(items: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(p["section_tipo"], p["section_id"]) for p in items}


def _error(result: tuple[int, dict], status: int, code: str) -> dict:
    got_status, body = result
    assert (got_status, body["ok"], body["error"]["code"]) == (status, False, code), body
    return body["error"]


async def _sse(
    gw: Gateway, options: dict[str, Any], bearer: str | None = None
) -> tuple[int, list[tuple[str, Any]]]:
    from tests.fixtures.gateway import ADMIN

    body = {"dd_api": "dd_rag_api", "action": "ask", "options": {**options, "stream": True}}
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            gw.url + "/api/v1/json", json=body, headers={"Authorization": f"Bearer {bearer or ADMIN}"}
        ) as r,
    ):
        assert r.headers["Content-Type"].startswith("text/event-stream"), await r.text()
        text = await r.text()
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return r.status, events


async def _metrics(gw: Gateway) -> str:
    async with aiohttp.ClientSession() as s, s.get(gw.url + "/metrics") as r:
        return await r.text()


# -- the extractive default -----------------------------------------------------------------------------


async def test_grounded_answer_with_valid_citations(corpus_gateway: Gateway) -> None:
    status, body = await corpus_gateway.call("ask", {"query": DAM, "section_tipo": ["oh1", "rsc1"]})
    assert status == 200 and body["msg"] == "ok", body
    data = body["data"]
    assert data["grounded"] is True and data["restricted"] is False
    assert data["used_provider"] == "extractive" and data["model"] == "extractive (all-minilm-l6-v2)"
    assert data["reranked"] is True  # the offline cross-encoder is served
    assert data["citations"] and data["removed_citations"] == 0
    by_n = {p["n"]: p for p in data["provenance"]}
    for c in data["citations"]:
        cited = by_n[c["n"]]
        assert c["chunkId"] == cited["chunk_id"] and c["citedText"] == cited["text"]
        assert c["locator"] == f"{cited['section_tipo']}-{cited['section_id']}"
        assert f"[{c['n']}]" in data["answer"]
    # Extractive answers are sentences of the cited passages, not a template.
    first = data["answer"].split(" [")[0]
    assert any(first in p["text"] for p in data["provenance"])
    assert ("oh1", 2) in {(c["sectionTipo"], c["sectionId"]) for c in data["citations"]}


async def test_refusal_is_the_same_for_a_denied_caller_and_an_empty_scope(corpus_gateway: Gateway) -> None:
    denied = await corpus_gateway.call("ask", {"query": DAM}, bearer=NOBODY)
    empty = await corpus_gateway.call("ask", {"query": DAM, "section_tipo": "zz9"})
    for status, body in (denied, empty):
        assert status == 200 and body["msg"] == "no_grounded_context"
        assert body["data"]["citations"] == [] and body["data"]["provenance"] == []
        assert body["data"]["grounded"] is False and body["data"]["used_provider"] == ""
    assert denied[1]["data"] == empty[1]["data"]


async def test_an_answer_cites_only_what_the_caller_may_read(corpus_gateway: Gateway) -> None:
    for query in ("Silver coins from the third century near the old mill", "Amphora inventory INV-2024/0173"):
        data = await corpus_gateway.ok("ask", {"query": query, "limit": 20}, bearer=RESEARCHER)
        seen = _records(data["provenance"]) | {(c["sectionTipo"], c["sectionId"]) for c in data["citations"]}
        assert not seen & {("oh1", 3), ("oh1", 4), ("oh1", 6), ("oh1", 7)}, seen
        assert "INV-2024/0173" not in data["answer"] and "Silver coins" not in data["answer"]
    admin = await corpus_gateway.ok("ask", {"query": "Amphora inventory INV-2024/0173"})
    assert ("oh1", 4) in _records(admin["provenance"])


async def test_budget_keeps_one_passage(corpus_database_url: str, sidecar_url: str) -> None:
    async with running_gateway(corpus_database_url, sidecar_url, RAG_CONTEXT_TOKEN_BUDGET="1") as gw:
        data = await gw.ok("ask", {"query": DAM})
    assert len(data["provenance"]) == 1 and data["citations"][0]["n"] == 1


async def test_bad_options_are_coded(corpus_gateway: Gateway) -> None:
    for options in ({}, {"query": 3}, {"query": DAM, "rerank": "yes"}, {"query": DAM, "expand": "all"}):
        _error(await corpus_gateway.call("ask", options), 400, "request.invalid_options")
    _error(await corpus_gateway.call("ask", {"query": DAM, "stream": 1}), 400, "request.invalid_options")
    _error(await corpus_gateway.call("ask", {"query": DAM}, bearer=None), 401, "auth.not_logged")


async def test_extractive_stream(corpus_gateway: Gateway) -> None:
    status, events = await _sse(corpus_gateway, {"query": DAM})
    assert status == 200 and [e for e, _ in events][-1] == "done"
    done = events[-1][1]
    assert done["ok"] is True and done["msg"] == "ok"
    assert "".join(d["text"] for e, d in events if e == "delta") == done["data"]["answer"]
    status, events = await _sse(corpus_gateway, {"query": DAM}, bearer=NOBODY)
    assert [e for e, _ in events] == ["done"] and events[0][1]["msg"] == "no_grounded_context"


# -- reranking ------------------------------------------------------------------------------------------


async def test_rerank_reorders_the_same_candidates(corpus_gateway: Gateway) -> None:
    options = {"query": DAM, "limit": 20}
    fused = await corpus_gateway.ok("retrieve", options)
    reranked = await corpus_gateway.ok("retrieve", {**options, "rerank": True})
    assert {p["chunk_id"] for p in fused} == {p["chunk_id"] for p in reranked}
    assert all(p["reranked"] is True for p in reranked) and "reranked" not in fused[0]
    scores = [p["rerank_score"] for p in reranked]
    assert scores == sorted(scores, reverse=True)
    hits = await corpus_gateway.ok("semantic_search", {**options, "rerank": True})
    assert hits and all(h["reranked"] is True for h in hits)
    ctx = await corpus_gateway.ok("get_agent_context", {**options, "rerank": True})
    assert [p["chunk_id"] for p in ctx] == [p["chunk_id"] for p in reranked]


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"RAG_RERANK_MODEL": "no-such-reranker"}, "ModelNotServed"),
        ({"RAG_RERANK_TIMEOUT": "1e-6"}, "timeout"),
    ],
)
async def test_reranker_down_or_slow_keeps_the_fused_order(
    corpus_database_url: str, sidecar_url: str, env: dict[str, str], reason: str
) -> None:
    async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
        fused = await gw.ok("retrieve", {"query": DAM})
        fallback = await gw.ok("retrieve", {"query": DAM, "rerank": True})
        assert [p["chunk_id"] for p in fallback] == [p["chunk_id"] for p in fused]
        assert all(p["reranked"] is False and p["rerank_score"] is None for p in fallback)
        answer = await gw.ok("ask", {"query": DAM})
        assert answer["reranked"] is False and answer["grounded"] is True
        assert f'mnemo_rerank_fallbacks_total{{reason="{reason}"}} 2.0' in await _metrics(gw)


async def test_ask_without_rerank(corpus_gateway: Gateway) -> None:
    data = await corpus_gateway.ok("ask", {"query": DAM, "rerank": False})
    assert data["reranked"] is False and data["grounded"] is True


# -- the openai provider and egress -----------------------------------------------------------------------


def _openai(chat: ChatServer, **env: str) -> dict[str, str]:
    return {
        "RAG_LLM_PROVIDER": "openai",
        "RAG_LLM_ENDPOINT": chat.url,
        "RAG_LLM_MODEL": "test-chat-model",
        "RAG_LLM_API_KEY": "sk-test",
        "RAG_LLM_TIMEOUT": "1",
        **env,
    }


async def test_openai_answer_and_citation_validation(corpus_database_url: str, sidecar_url: str) -> None:
    async with (
        running_chat_server() as chat,
        running_gateway(corpus_database_url, sidecar_url, **_openai(chat)) as gw,
    ):
        chat.reply = (
            "The families left when the water came [1]. The valley was flooded [1, 40]. Made up [99]."
        )
        data = await gw.ok("ask", {"query": DAM, "section_tipo": "oh1"})
        assert data["used_provider"] == "openai" and data["model"] == "test-chat-model"
        assert (
            data["answer"]
            == "The families left when the water came [1]. The valley was flooded [1]. Made up."
        )
        assert data["removed_citations"] == 2 and [c["n"] for c in data["citations"]] == [1]
        assert data["usage"]["total_tokens"] == 120
        sent = chat.requests[-1]
        assert sent["authorization"] == "Bearer sk-test"
        body = sent["body"]
        assert body["model"] == "test-chat-model" and body["stream"] is False and body["max_tokens"] == 512
        system, user = body["messages"]
        assert "[2]" in system["content"] and DAM in user["content"]
        assert "[1] " in user["content"] and data["provenance"][0]["text"] in user["content"]
        assert "mnemo_ask_citations_removed_total 2.0" in await _metrics(gw)
        # An answer without a valid marker is not grounded.
        chat.reply = "I cannot tell from these passages."
        data = await gw.ok("ask", {"query": DAM})
        assert data["grounded"] is False and data["citations"] == []


@pytest.mark.parametrize("mode", ["error", "malformed", "slow"])
async def test_generation_failure_is_coded_never_an_answer(
    corpus_database_url: str, sidecar_url: str, mode: str
) -> None:
    async with (
        running_chat_server() as chat,
        running_gateway(corpus_database_url, sidecar_url, **_openai(chat)) as gw,
    ):
        chat.mode = mode
        error = _error(await gw.call("ask", {"query": DAM}), 503, "rag.generation_failed")
        assert error["retryable"] is True and error["message"] == "The grounded answer could not be generated"
        assert len(chat.requests) == 1


async def test_openai_stream(corpus_database_url: str, sidecar_url: str) -> None:
    async with (
        running_chat_server() as chat,
        running_gateway(corpus_database_url, sidecar_url, **_openai(chat)) as gw,
    ):
        chat.reply = "The water came [1] and flooded everything [70]."
        status, events = await _sse(gw, {"query": DAM})
        deltas = [d["text"] for e, d in events if e == "delta"]
        assert status == 200 and len(deltas) == len(chat.reply.split(" "))
        assert "".join(deltas) == chat.reply and chat.requests[-1]["body"]["stream"] is True
        done = events[-1]
        assert done[0] == "done" and done[1]["data"]["answer"] == "The water came [1] and flooded everything."
        assert done[1]["data"]["removed_citations"] == 1
        chat.mode = "cut"
        status, events = await _sse(gw, {"query": DAM})
        assert events[-1][0] == "error" and events[-1][1]["error"]["code"] == "rag.generation_failed"
        chat.mode = "error"
        status, events = await _sse(gw, {"query": DAM})
        assert [e for e, _ in events] == ["error"]


async def test_external_generation_is_off_by_default(corpus_database_url: str, sidecar_url: str) -> None:
    async with (
        running_chat_server() as chat,
        running_gateway(corpus_database_url, sidecar_url, **_openai(chat, RAG_LLM_LOCALITY="external")) as gw,
    ):
        status, body = await gw.call("ask", {"query": DAM})
        assert status == 200 and body["msg"] == "external_generation_restricted"
        data = body["data"]
        assert data["restricted"] is True and data["grounded"] is False and data["citations"] == []
        assert data["provenance"] and data["answer"] == "" and data["used_provider"] == ""
        assert chat.requests == []  # nothing left the host


async def test_forbidden_contributing_section_is_withheld(corpus_database_url: str, sidecar_url: str) -> None:
    query = "Amphora inventory INV-2024/0173"
    async with running_chat_server() as chat:
        env = _openai(
            chat,
            RAG_LLM_LOCALITY="external",
            RAG_ALLOW_EXTERNAL_PROVIDER_DEFAULT="true",
            RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS="dd810",
        )
        async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
            # Only oh1-4 grounds this query, and dd810 contributes to it: nothing may leave.
            status, body = await gw.call("ask", {"query": query})
            assert status == 200 and body["msg"] == "external_generation_restricted"
            assert _records(body["data"]["provenance"]) == {("oh1", 4)} and chat.requests == []
        # With every passage grounding (floor -1), oh1-4 is withheld and the rest is sent.
        async with running_gateway(
            corpus_database_url, sidecar_url, **env, RAG_GROUNDING_MIN_SIMILARITY="-1"
        ) as gw:
            data = await gw.ok("ask", {"query": query, "limit": 20})
        assert _records(data["withheld"]) == {("oh1", 4)} and ("oh1", 4) not in _records(data["provenance"])
        assert len(chat.requests) == 1 and len(data["provenance"]) == 19
        assert "Amphora catalogued" not in json.dumps(chat.requests[0]["body"])  # oh1-4 stayed home
        # A forbidden host section: everything in scope is withheld.
        forbidden = {**env, "RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS": "oh1"}
        async with running_gateway(corpus_database_url, sidecar_url, **forbidden) as gw:
            status, body = await gw.call("ask", {"query": DAM, "section_tipo": "oh1"})
        assert status == 200 and body["msg"] == "external_generation_restricted" and len(chat.requests) == 1
        assert body["data"]["provenance"] and _records(body["data"]["provenance"]) <= {
            ("oh1", i) for i in range(9)
        }


async def test_a_local_endpoint_may_receive_everything(corpus_database_url: str, sidecar_url: str) -> None:
    async with running_chat_server() as chat:
        env = _openai(chat, RAG_EXTERNAL_PROVIDER_FORBIDDEN_SECTIONS="oh1")  # loopback: local, auto
        async with running_gateway(corpus_database_url, sidecar_url, **env) as gw:
            data = await gw.ok("ask", {"query": DAM, "section_tipo": "oh1"})
        assert data["withheld"] == [] and len(chat.requests) == 1 and data["grounded"] is True
