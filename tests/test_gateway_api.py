"""dd_rag_api over real HTTP: every action's success shape and every error code."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from tests.fixtures.gateway import ADMIN, Gateway, running_gateway, token

pytestmark = pytest.mark.ray

HIT_KEYS = {"section_tipo", "section_id", "component_tipo", "lang", "snippet", "score"}
PASSAGE_KEYS = HIT_KEYS | {
    "chunk_index",
    "text",
    "title",
    "heading_path",
    "page",
    "tc_in",
    "tc_out",
    "group",
    "parent_key",
    "chunk_id",  # what read_chunk takes
}


def _error(status_body: tuple[int, dict], status: int, code: str) -> dict:
    got_status, body = status_body
    assert got_status == status and body["ok"] is False, body
    assert body["error"]["code"] == code, body
    return body["error"]


async def test_semantic_search_shape_and_ranking(corpus_gateway: Gateway) -> None:
    hits = await corpus_gateway.ok(
        "semantic_search", {"query": "families displaced when the reservoir flooded the valley", "limit": 5}
    )
    assert 0 < len(hits) <= 5 and all(set(h) == HIT_KEYS for h in hits)
    assert len({(h["section_tipo"], h["section_id"]) for h in hits}) == len(hits)  # one hit per record
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert (hits[0]["section_tipo"], hits[0]["section_id"]) in {("oh1", 2), ("oh1", 7), ("oh1", 6)}


async def test_retrieve_and_agent_context_return_passages(corpus_gateway: Gateway) -> None:
    options = {"query": "a long report on the dam", "section_tipo": "oh1", "limit": 3}
    status, body = await corpus_gateway.call("retrieve", options)
    assert status == 200 and body["msg"] == "ok"
    passages = body["data"]
    assert passages and all(set(p) == PASSAGE_KEYS for p in passages)
    top = passages[0]
    assert (top["section_id"], top["chunk_index"], top["page"]) == (8, 3, 7)
    assert top["heading_path"] == ["Report", "Part 2"] and top["group"] == "card"
    assert top["text"] == "A long report on the dam."
    assert top["chunk_id"] == "oh1-8/rag:card/lg-eng/3"
    status, body = await corpus_gateway.call("get_agent_context", options)
    assert status == 200 and body["msg"] == "agent_context" and body["data"] == passages


async def test_similar_to_excludes_the_seed_and_collapses(corpus_gateway: Gateway) -> None:
    hits = await corpus_gateway.ok("similar_to", {"section_tipo": "fill1", "section_id": 100, "limit": 10})
    records = [(h["section_tipo"], h["section_id"]) for h in hits]
    assert len(hits) == 10 and ("fill1", 100) not in records and len(set(records)) == 10
    assert all(set(h) == HIT_KEYS | {"similarity"} and 0 < h["similarity"] <= 1 for h in hits)
    by_text = await corpus_gateway.ok("similar_to", {"section_tipo": "oh1", "section_id": "2", "limit": 3})
    assert by_text and ("oh1", 2) not in [(h["section_tipo"], h["section_id"]) for h in by_text]


async def test_similar_to_with_group_narrows_both_sides(corpus_gateway: Gateway) -> None:
    hits = await corpus_gateway.ok(
        "similar_to", {"section_tipo": "oh1", "section_id": 1, "group": "transcript", "limit": 10}
    )
    assert hits == []  # the only transcript chunk is the seed's own
    cards = await corpus_gateway.ok("similar_to", {"section_tipo": "oh1", "section_id": 1, "group": "card"})
    assert cards and all(h["component_tipo"] == "rag:card" for h in cards)


async def test_embed_groups_lists_the_descriptor_groups(corpus_gateway: Gateway) -> None:
    assert await corpus_gateway.ok("embed_groups", {"section_tipo": "oh1"}) == {
        "groups": ["card", "transcript"]
    }


async def test_limit_is_clamped_and_scope_accepts_string_or_array(corpus_gateway: Gateway) -> None:
    many = await corpus_gateway.ok("semantic_search", {"query": "Roman bronze coin", "limit": 500})
    assert len(many) == 50
    one = await corpus_gateway.ok("semantic_search", {"query": "Roman bronze coin", "limit": 0})
    assert len(one) == 1
    for scope in ("rsc1", ["rsc1"], ["rsc1", "rsc1"]):
        hits = await corpus_gateway.ok("semantic_search", {"query": "reservoir", "section_tipo": scope})
        assert [(h["section_tipo"], h["section_id"]) for h in hits] == [("rsc1", 1)]
    both = await corpus_gateway.ok(
        "semantic_search", {"query": "reservoir dam", "section_tipo": ["rsc1", "oh1"]}
    )
    assert {h["section_tipo"] for h in both} == {"rsc1", "oh1"}


async def test_group_filters_passages(corpus_gateway: Gateway) -> None:
    passages = await corpus_gateway.ok("retrieve", {"query": "agua pantano", "group": "transcript"})
    assert passages and all(p["group"] == "transcript" for p in passages)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "Missing query"),
        ({"query": "   "}, "Missing query"),
        ({"query": 3}, "query must be a string"),
        ({"query": "x", "limit": "10"}, "limit must be an integer"),
        ({"query": "x", "limit": True}, "limit must be an integer"),
        ({"query": "x", "section_tipo": "oh1; DROP TABLE rag_models"}, "section_tipo is not a valid tipo"),
        ({"query": "x", "section_tipo": []}, "section_tipo must be"),
        ({"query": "x", "group": "card' OR '1'='1"}, "group is not a valid embed-group id"),
        ({"query": "x", "group": "card\n"}, "group is not a valid embed-group id"),
    ],
)
async def test_invalid_options_are_coded(corpus_gateway: Gateway, options: dict, message: str) -> None:
    error = _error(await corpus_gateway.call("semantic_search", options), 400, "request.invalid_options")
    assert message in error["message"]


async def test_request_shape_errors(corpus_gateway: Gateway) -> None:
    gw = corpus_gateway
    _error(await gw.call("semantic_search", raw=b"{not json"), 400, "request.invalid_json")
    _error(await gw.call("semantic_search", raw=b"[1, 2]"), 400, "request.invalid_request")
    _error(await gw.call("semantic_search", {"query": "x"}, dd_api="dd_core_api"), 400, "request.unknown_api")
    _error(await gw.call("drop_everything", {}), 400, "request.unknown_action")
    _error(await gw.call("semantic_search", ["query"]), 400, "request.invalid_options")
    _error(await gw.call("similar_to", {"section_tipo": "oh1"}), 400, "request.invalid_options")
    _error(
        await gw.call("similar_to", {"section_tipo": "oh1", "section_id": -1}), 400, "request.invalid_options"
    )


async def test_auth_errors(corpus_gateway: Gateway) -> None:
    gw = corpus_gateway
    _error(await gw.call("semantic_search", {"query": "x"}, bearer=None), 401, "auth.not_logged")
    _error(await gw.call("embed_groups", {"section_tipo": "oh1"}, bearer=None), 401, "auth.not_logged")
    _error(await gw.call("semantic_search", {"query": "x"}, bearer="garbage"), 401, "auth.invalid_token")
    forged = token("eve", admin=True)[:-4] + "AAAA"
    _error(await gw.call("semantic_search", {"query": "x"}, bearer=forged), 401, "auth.invalid_token")


async def test_media_switch(corpus_gateway: Gateway) -> None:
    for action in ("similar_objects", "search_by_text_image", "characterize_object"):
        _error(await corpus_gateway.call(action, {"query": "x"}), 503, "rag.media_disabled")


async def test_kill_switch(corpus_database_url: str, sidecar_url: str) -> None:
    async with running_gateway(corpus_database_url, sidecar_url, RAG_ENABLED="false") as gw:
        for action in (
            "semantic_search",
            "retrieve",
            "get_agent_context",
            "similar_to",
            "ask",
            "similar_objects",
        ):
            error = _error(await gw.call(action, {"query": "x"}), 503, "rag.disabled")
            assert error["message"] == "RAG is disabled" and error["retryable"] is False
        assert await gw.ok("embed_groups", {"section_tipo": "oh1"}) == {"groups": []}
        # The OpenAI-shaped embeddings route is behind the same switch (it spends the sidecar too).
        body = {"model": "minilm", "input": ["x"]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                gw.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {ADMIN}"}
            ) as r,
        ):
            _error((r.status, await r.json()), 503, "rag.disabled")
    async with running_gateway(corpus_database_url, sidecar_url, RAG_MEDIA_ENABLED="true") as gw:
        # Media on: the action runs; a record with text but no image rows is no seed for it.
        error = _error(
            await gw.call("similar_objects", {"section_tipo": "oh1", "section_id": 1}),
            400,
            "request.invalid_options",
        )
        assert error["message"] == "Unknown seed record"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_sidecar_down_is_embedding_unavailable(corpus_database_url: str) -> None:
    async with running_gateway(corpus_database_url, f"http://127.0.0.1:{_closed_port()}") as gw:
        for action in ("semantic_search", "retrieve", "get_agent_context"):
            error = _error(await gw.call(action, {"query": "reservoir"}), 503, "rag.embedding_unavailable")
            assert error["retryable"] is True
            assert error["message"] == "The embedding service did not return a query vector"
        # similar_to needs no query vector, only the model's name: still a clean 503, never a ranking.
        _error(
            await gw.call("similar_to", {"section_tipo": "oh1", "section_id": 2}),
            503,
            "rag.embedding_unavailable",
        )
        _error(await gw.call("semantic_search", {}), 400, "request.invalid_options")


async def test_unknown_text_model_is_embedding_unavailable(
    corpus_database_url: str, sidecar_url: str
) -> None:
    async with running_gateway(corpus_database_url, sidecar_url, RAG_TEXT_MODEL="no-such-model") as gw:
        _error(await gw.call("semantic_search", {"query": "x"}), 503, "rag.embedding_unavailable")


async def test_admin_token_constant_is_an_admin(corpus_gateway: Gateway) -> None:
    assert ADMIN and await corpus_gateway.ok("embed_groups", {"section_tipo": "rsc1"}) == {"groups": ["card"]}
