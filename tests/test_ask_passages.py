"""Small-to-big expansion (``expand: neighbours | parent``) and ``read_chunk``, behind the ACL."""

from __future__ import annotations

import pytest

from tests.fixtures.gateway import Doc, Gateway, index_docs, running_gateway, token

pytestmark = pytest.mark.ray

TURNS = [
    "Interviewer: what do you remember of the last summer in the village?",
    "We threshed the wheat on the threshing floor as every year.",
    "My father said the water would never reach the church.",
    "When the water came we loaded the cart with mattresses and hens.",
    "They paid us the valuation of the Confederation for the house.",
]
# Chunk 2 also holds text of zz1/zz2, which the researcher may not read.
CONTRIBUTORS = [["oh23"], ["oh23"], ["oh23", "zz1/zz2"], ["oh23"], ["oh23"]]
PARENTS = ["av:oh25#1", "av:oh25#1", "av:oh25#1", "av:oh25#2", "av:oh25#2"]
RESEARCHER = token("researcher", projects=[1], oh1=1)


def _id(index: int) -> str:
    return f"oh1-50/rag:transcript/lg-eng/{index}"


@pytest.fixture(scope="module")
async def gw(pg_server, template_db, sidecar_url):
    from schema import create_pool
    from tests.conftest import _create_database, _drop_database

    name = await _create_database(pg_server, template_db)
    url = pg_server.url_for(name)
    pool = await create_pool(url, max_size=2)
    try:
        docs = [
            Doc("oh1", 50, text, group="transcript", contributors=c, chunk_index=i)
            for i, (text, c) in enumerate(zip(TURNS, CONTRIBUTORS, strict=True))
        ]
        docs.append(Doc("oh1", 51, "A card about wheat prices in the province.", contributors=["oh22"]))
        partition = await index_docs(pool, sidecar_url, docs)
        for i, parent in enumerate(PARENTS):
            await pool.execute(
                f"UPDATE {partition.table} SET parent_key = $1, chunk_meta = chunk_meta || $2::jsonb "
                "WHERE section_id = 50 AND chunk_index = $3",
                parent,
                f'{{"tc_in": "00:0{i}:00.000"}}',
                i,
            )
        async with running_gateway(url, sidecar_url) as gateway:
            yield gateway
    finally:
        await pool.close()
        await _drop_database(pg_server, name)


def _passage(data: list[dict], chunk_id: str) -> dict:
    return next(p for p in data if p["chunk_id"] == chunk_id)


async def test_neighbours_widen_a_passage(gw: Gateway) -> None:
    data = await gw.ok(
        "retrieve", {"query": "threshed the wheat on the threshing floor", "expand": "neighbours"}
    )
    p = _passage(data, _id(1))
    assert p["expansion"]["mode"] == "neighbours" and p["expansion"]["chunk_indexes"] == [0, 1, 2]
    assert p["expansion"]["text"] == "\n".join(TURNS[:3]) and p["text"] == TURNS[1]


async def test_parent_widens_to_the_parent_section(gw: Gateway) -> None:
    data = await gw.ok(
        "get_agent_context", {"query": "loaded the cart with mattresses and hens", "expand": "parent"}
    )
    top = data[0]
    assert top["chunk_id"] == _id(3) and top["expansion"]["chunk_indexes"] == [3, 4]


async def test_expansion_leaves_out_unreadable_neighbours(gw: Gateway) -> None:
    data = await gw.ok(
        "retrieve",
        {"query": "threshed the wheat on the threshing floor", "expand": "neighbours"},
        bearer=RESEARCHER,
    )
    assert _id(2) not in {p["chunk_id"] for p in data}
    p = _passage(data, _id(1))
    assert p["expansion"]["chunk_indexes"] == [0, 1] and TURNS[2] not in p["expansion"]["text"]


async def test_ask_with_expansion_supplies_the_wider_text(gw: Gateway) -> None:
    data = await gw.ok(
        "ask", {"query": "What did they load on the cart when the water came?", "expand": "parent"}
    )
    assert data["expand"] == "parent" and data["grounded"] is True
    first = data["provenance"][0]
    assert first["expansion"]["mode"] == "parent" and len(first["expansion"]["chunk_indexes"]) >= 1


async def test_read_chunk_with_neighbours(gw: Gateway) -> None:
    data = await gw.ok("read_chunk", {"chunk_id": _id(1), "before": 1, "after": 2})
    assert data["chunk"]["text"] == TURNS[1] and data["chunk"]["tc_in"] == "00:01:00.000"
    assert [c["chunk_index"] for c in data["before"]] == [0]
    assert [c["chunk_index"] for c in data["after"]] == [2, 3]
    alone = await gw.ok("read_chunk", {"chunk_id": _id(0), "before": 0, "after": 0})
    assert (alone["before"], alone["after"]) == ([], [])


async def test_read_chunk_forbidden_and_missing_answer_alike(gw: Gateway) -> None:
    forbidden = await gw.call("read_chunk", {"chunk_id": _id(2)}, bearer=RESEARCHER)
    missing = await gw.call("read_chunk", {"chunk_id": _id(9)}, bearer=RESEARCHER)
    other_project = await gw.call("read_chunk", {"chunk_id": _id(1)}, bearer=token("p2", projects=[2], oh1=1))
    for status, body in (forbidden, missing, other_project):
        assert status == 404 and body["error"]["code"] == "rag.chunk_not_found"
    assert forbidden[1]["error"] == missing[1]["error"] == other_project[1]["error"]
    data = await gw.ok("read_chunk", {"chunk_id": _id(1), "after": 3}, bearer=RESEARCHER)
    assert [c["chunk_index"] for c in data["after"]] == [3, 4]  # chunk 2 left out


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"chunk_id": 5},
        {"chunk_id": "oh1-50"},
        {"chunk_id": _id(1), "before": 11},
        {"chunk_id": _id(1), "after": -1},
    ],
)
async def test_read_chunk_bad_options(gw: Gateway, options: dict) -> None:
    status, body = await gw.call("read_chunk", options)
    assert status == 400 and body["error"]["code"] == "request.invalid_options"
