"""The ACL chokepoint over real HTTP: sections, contributing components, projects, no oracles."""

from __future__ import annotations

import pytest

from tests.fixtures.gateway import Gateway, running_gateway, token

pytestmark = pytest.mark.ray

QUERY = {"query": "the reservoir flooded the valley and families left", "limit": 50}
RESEARCHER = token("alice", projects=[1], oh1=1)


def _records(hits: list[dict]) -> set[tuple[str, int]]:
    return {(h["section_tipo"], h["section_id"]) for h in hits}


def _without_request_id(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "request_id"}


async def test_admin_sees_hits_a_denied_principal_sees_nothing(corpus_gateway: Gateway) -> None:
    admin = _records(await corpus_gateway.ok("semantic_search", QUERY))
    assert {("oh1", 2), ("oh1", 6), ("oh1", 7), ("rsc1", 1)} <= admin
    nobody = token("mallory", projects=None)
    for action in ("semantic_search", "retrieve", "get_agent_context"):
        assert await corpus_gateway.ok(action, QUERY, bearer=nobody) == []


async def test_section_projects_and_fail_closed_contributors(corpus_gateway: Gateway) -> None:
    seen = _records(await corpus_gateway.ok("semantic_search", QUERY, bearer=RESEARCHER))
    assert ("oh1", 2) in seen and ("oh1", 5) in seen
    assert ("rsc1", 1) not in seen  # no read on rsc1
    assert ("oh1", 3) not in seen  # project 2 only
    assert ("oh1", 6) not in seen and ("oh1", 7) not in seen  # empty / missing contributors fail closed
    assert ("oh1", 4) not in seen  # a contributor from dd810, which alice cannot read
    with_dd810 = token("alice", projects=[1], oh1=1, dd810=1)
    assert ("oh1", 4) in _records(await corpus_gateway.ok("semantic_search", QUERY, bearer=with_dd810))
    with_project_2 = token("alice", projects=[1, 2], oh1=1)
    assert ("oh1", 3) in _records(await corpus_gateway.ok("semantic_search", QUERY, bearer=with_project_2))


async def test_a_denied_contributing_component_hides_its_group_chunks(corpus_gateway: Gateway) -> None:
    query = {"query": "cuando llegó el agua del pantano", "limit": 50}
    passages = await corpus_gateway.ok("retrieve", query, bearer=RESEARCHER)
    assert any(p["group"] == "transcript" for p in passages)
    denied = token("bob", projects=[1], oh1=1, oh1__oh23=0)
    passages = await corpus_gateway.ok("retrieve", query, bearer=denied)
    assert passages and all(p["group"] != "transcript" for p in passages)
    assert ("oh1", 1) in {(p["section_tipo"], p["section_id"]) for p in passages}  # its card still shows
    only_component = token("carol", projects=[1], oh1=0, oh1__oh23=1)  # no section read: nothing at all
    assert await corpus_gateway.ok("retrieve", query, bearer=only_component) == []


async def test_similar_to_a_forbidden_seed_answers_as_a_missing_one(corpus_gateway: Gateway) -> None:
    gw = corpus_gateway
    forbidden = await gw.call("similar_to", {"section_tipo": "oh1", "section_id": 3}, bearer=RESEARCHER)
    missing = await gw.call("similar_to", {"section_tipo": "oh1", "section_id": 999}, bearer=RESEARCHER)
    unknown_section = await gw.call("similar_to", {"section_tipo": "zz1", "section_id": 1}, bearer=RESEARCHER)
    assert forbidden[0] == missing[0] == unknown_section[0] == 400
    assert _without_request_id(forbidden[1]) == _without_request_id(missing[1])
    assert _without_request_id(forbidden[1]) == _without_request_id(unknown_section[1])
    assert forbidden[1]["error"]["code"] == "request.invalid_options"
    # The admin may use that seed, and alice never receives records she cannot read as neighbours.
    assert await gw.ok("similar_to", {"section_tipo": "oh1", "section_id": 3})
    hits = await gw.ok("similar_to", {"section_tipo": "oh1", "section_id": 2, "limit": 50}, bearer=RESEARCHER)
    assert hits and not _records(hits) & {("oh1", 3), ("oh1", 4), ("oh1", 6), ("oh1", 7), ("rsc1", 1)}


async def test_a_seed_chunk_with_a_forbidden_contributor_is_not_used(corpus_gateway: Gateway) -> None:
    denied = token("bob", projects=[1], oh1=1, oh1__oh23=0)
    status, body = await corpus_gateway.call(
        "similar_to", {"section_tipo": "oh1", "section_id": 1, "group": "transcript"}, bearer=denied
    )
    assert status == 400 and body["error"]["message"] == "Unknown seed record"


async def test_embed_groups_is_never_an_oracle(
    corpus_gateway: Gateway, corpus_database_url: str, sidecar_url: str
) -> None:
    gw = corpus_gateway
    answers = [
        await gw.call("embed_groups", {"section_tipo": "oh 1"}, bearer=RESEARCHER),  # malformed
        await gw.call("embed_groups", {"section_tipo": "oh1\n"}, bearer=RESEARCHER),  # malformed
        await gw.call("embed_groups", {"section_tipo": 7}, bearer=RESEARCHER),  # malformed
        await gw.call("embed_groups", {}, bearer=RESEARCHER),  # malformed (absent)
        await gw.call("embed_groups", {"section_tipo": "rsc1"}, bearer=RESEARCHER),  # unreadable
        await gw.call("embed_groups", {"section_tipo": "zz9"}, bearer=token("z", zz9=1)),  # no descriptor
    ]
    async with running_gateway(corpus_database_url, sidecar_url, RAG_ENABLED="off") as off:
        answers.append(await off.call("embed_groups", {"section_tipo": "oh1"}, bearer=RESEARCHER))
    bodies = {repr(_without_request_id(body)) for _status, body in answers}
    assert {status for status, _ in answers} == {200}
    assert bodies == {repr({"ok": True, "msg": "ok", "data": {"groups": []}})}
    assert await gw.ok("embed_groups", {"section_tipo": "oh1"}, bearer=RESEARCHER) == {
        "groups": ["card", "transcript"]
    }


async def test_filtered_queries_still_fill_the_limit(corpus_gateway: Gateway) -> None:
    # 30 readable coins among 230 near-identical ones: the HNSW scan must keep going past the others.
    coins = token("numismatist", projects=[9], fill1=1)
    hits = await corpus_gateway.ok(
        "semantic_search", {"query": "Roman bronze coin from Emerita", "limit": 25}, bearer=coins
    )
    assert len(hits) == 25 and all(100 <= h["section_id"] < 130 for h in hits)
    passages = await corpus_gateway.ok(
        "retrieve", {"query": "bronze coin of the mint", "limit": 30}, bearer=coins
    )
    assert len(passages) == 30
