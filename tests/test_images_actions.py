"""The bulk image job on the coins collection, then the three image actions and thumbnails over HTTP,
with the ACL on every path (real PostgreSQL, the real Ray Serve sidecar, the real gateway).

The tiny SigLIP's vectors are random: these tests check shapes, fusion arithmetic, floors and the
ACL, never whether a neighbour "looks" right.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client

from gateway.base.resources import SETTINGS_KEY
from gateway.web.mcp import build_mcp_server, principal_from_token
from index.bulk.image_jobs import JobOptions, run_image_job
from index.settings import MediaSettings
from index.store.partitions import get_partition
from index.store.sections import SectionStore
from inference.client import SidecarClient
from schema import create_pool
from tests.conftest import REPO_ROOT
from tests.fixtures.gateway import ADMIN, Gateway, running_gateway, token
from tests.image_support import COIN_SECTION, COINS, IMAGE_MODEL

MEDIA = MediaSettings(media_root=str(COINS), image_max_px=64, thumbnail_px=24)
MANIFEST = COINS / "manifest.jsonl"
LINES = [json.loads(line) for line in MANIFEST.read_text().splitlines() if line.strip()]
# The same lines with absolute paths, for manifests written elsewhere (paths are relative to the manifest).
ABSOLUTE = [{**line, "path": str(COINS / line["path"])} for line in LINES]
# Three photographs reused below: coin 1 filed twice, two faces for the multi-view records.
A, B, C, E = (str(COINS / LINES[i]["path"]) for i in (0, 40, 70, 90))

MULTI_SECTION = {
    "embed": [{"id": "card", "contributors": ["numd1"]}],
    "context": {
        "images": [{"tipo": "numd5", "view": "obverse"}, {"tipo": "numd6", "view": "reverse"}],
        "metadata": {"denomination": "numd10"},
        "compare_scope": ["multi1"],
    },
}


def _manifest(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def two_faces(section_id: int, obverse: str, reverse: str) -> list[dict[str, Any]]:
    return [
        {"section_id": section_id, "path": obverse, "tipo": "numd5", "denomination": f"d{section_id}"},
        {"section_id": section_id, "path": reverse, "tipo": "numd6", "denomination": f"d{section_id}"},
    ]


@pytest.fixture(scope="session")
async def coins_database(
    pg_server: Any, template_db: str, sidecar_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A session database with the coins collection (records 1..96, project 1) ingested by the bulk
    job, coin 1's photograph filed again as record 1001, copies in project 2 (2001..2003), and a
    multi-view section. Yields the URL and the first job's report."""
    from tests.conftest import _create_database, _drop_database

    name = await _create_database(pg_server, template_db)
    url = pg_server.url_for(name)
    tmp = tmp_path_factory.mktemp("coins-job")
    pool = await create_pool(url, max_size=4)
    try:
        await SectionStore(pool).put("coins1", COIN_SECTION)
        await SectionStore(pool).put("multi1", MULTI_SECTION)
        async with SidecarClient(sidecar_url) as client:
            options = JobOptions("coins1", projects=(1,), workers=2, batch_size=16, media=MEDIA)
            report = await run_image_job(pool, client, MANIFEST, options)
            extra = _manifest(
                tmp / "extra.jsonl",
                [
                    {"section_id": 1001, "path": A, "denomination": "1c", "projects": [1]},
                    *({"section_id": 2000 + i, "path": A, "projects": [2]} for i in (1, 2, 3)),
                ],
            )
            await run_image_job(pool, client, extra, options)
            multi = _manifest(
                tmp / "multi.jsonl",
                [*two_faces(1, A, B), *two_faces(2, A, C), *two_faces(3, A, B), *two_faces(4, E, B)],
            )
            await run_image_job(pool, client, multi, JobOptions("multi1", projects=(1,), media=MEDIA))
    finally:
        await pool.close()
    try:
        yield url, report.as_dict()
    finally:
        await _drop_database(pg_server, name)


@pytest.fixture(scope="session")
async def coins(coins_database: tuple[str, dict[str, Any]], sidecar_url: str) -> AsyncIterator[Gateway]:
    url, _ = coins_database
    async with running_gateway(url, sidecar_url, RAG_MEDIA_ENABLED="true", RAG_IMAGE_MODEL=IMAGE_MODEL) as gw:
        yield gw


READER = token("reader", projects=[1], coins1=1, multi1=1)


def _same_answer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "request_id"} == {
        k: v for k, v in b.items() if k != "request_id"
    }


# -- the bulk job ------------------------------------------------------------------------------------


async def test_bulk_job_ingests_the_coins_and_resumes(
    coins_database: tuple[str, dict[str, Any]], sidecar_url: str, tmp_path: Path
) -> None:
    url, first = coins_database
    assert (first["total"], first["embedded"], first["rejected"], first["rows_written"]) == (96, 96, 0, 96)
    assert first["model"] == IMAGE_MODEL and math.isfinite(first["images_per_s"])
    pool = await create_pool(url, max_size=2)
    try:
        partition = await get_partition(pool, IMAGE_MODEL)
        assert partition is not None
        row = await pool.fetchrow(
            f"""SELECT view, source_text, projects, chunk_meta FROM {partition.table}
                WHERE section_tipo = 'coins1' AND section_id = 1 AND modality = 'image'"""
        )
        assert row["view"] == "obverse" and row["projects"] == [1]
        assert (
            row["source_text"]
            == f"denomination: {LINES[0]['denomination']} · material: {LINES[0]['material']}"
        )
        # A re-run (an interrupted job resumed) decodes and embeds nothing; bad lines go to the report.
        bad = _manifest(
            tmp_path / "again.jsonl",
            [
                *ABSOLUTE[:5],
                {"path": str(COINS / "missing.jpg")},
                {"path": str(COINS / "SOURCE.txt")},
                {"path": LINES[0]["path"], "colour": "red"},
            ],
        )
        rejects = tmp_path / "rejects.jsonl"
        async with SidecarClient(sidecar_url) as client:
            base = JobOptions("coins1", projects=(1,), workers=1, media=MEDIA, rejects=rejects)
            again = await run_image_job(pool, client, bad, base)
        assert (again.embedded, again.unchanged, again.rejected, again.rows_written) == (0, 5, 3, 0)
        reasons = [json.loads(line) for line in rejects.read_text().splitlines()]
        assert [(r["line"], r["reason"]) for r in reasons] == [
            (6, "not_found"),
            (7, "not_an_image"),
            (8, "bad_line"),
        ]
        assert "colour" in reasons[2]["message"]
    finally:
        await pool.close()


# -- similar_objects ---------------------------------------------------------------------------------


async def test_similar_objects_answers_in_the_contract_shape(coins: Gateway) -> None:
    data = await coins.ok("similar_objects", {"section_tipo": "coins1", "section_id": 5, "limit": 7})
    assert len(data) == 7
    for hit in data:
        assert {"section_tipo", "section_id", "similarity", "score", "view", "thumb_url", "context"} <= set(
            hit
        )
        assert hit["section_tipo"] == "coins1" and hit["section_id"] != 5  # compare_scope, seed excluded
        assert hit["thumb_url"] == f"/v1/thumbnails/coins1/{hit['section_id']}/numd5/0"
        assert set(hit["context"]) == {"denomination", "material"} or hit["section_id"] > 2000
    scores = [h["score"] for h in data]
    assert scores == sorted(scores, reverse=True)
    visual = await coins.ok(
        "similar_objects", {"section_tipo": "coins1", "section_id": 5, "similarity_mode": "visual"}
    )
    sims = [h["similarity"] for h in visual]
    assert sims == sorted(sims, reverse=True)  # one view: the ranking is the cosine order


async def test_the_same_photo_under_two_records_is_a_near_duplicate(coins: Gateway) -> None:
    data = await coins.ok(
        "similar_objects", {"section_tipo": "coins1", "section_id": 1001, "near_duplicate": True}
    )
    assert data and data[0]["section_id"] == 1 and data[0]["similarity"] >= 0.99
    assert all(h["similarity"] >= 0.93 for h in data)
    assert {h["section_id"] for h in data} >= {1, 2001, 2002, 2003}  # admin: every copy


async def test_an_object_close_on_both_faces_outranks_one_close_on_one(coins: Gateway) -> None:
    options = {"section_tipo": "multi1", "section_id": 1, "similarity_mode": "visual"}
    fused = await coins.ok("similar_objects", options)
    obverse_only = await coins.ok("similar_objects", {**options, "view": "obverse"})
    # On the obverse alone records 2 and 3 tie (the same photograph); the lower id comes first.
    assert [h["section_id"] for h in obverse_only[:2]] == [2, 3]
    assert {h["view"] for h in obverse_only} == {"obverse"}
    # Fused over both faces, record 3 (both faces identical to the seed's) comes first.
    assert fused[0]["section_id"] == 3 and fused[0]["similarity"] >= 0.99
    assert fused[0]["score"] > next(h["score"] for h in fused if h["section_id"] == 2)


@pytest.mark.parametrize(
    "options",
    [
        {"section_tipo": "coins1", "section_id": 5, "similarity_mode": "pixels"},
        {"section_tipo": "coins1", "section_id": 5, "near_duplicate": "yes"},
        {"section_tipo": "coins1", "section_id": 5, "view": "two words"},
        {"section_tipo": "coins1", "section_id": 5, "scope": ["bad tipo"]},
        {"section_tipo": "coins1"},
        {"section_id": 5},
    ],
)
async def test_bad_options_are_coded_400s(coins: Gateway, options: dict[str, Any]) -> None:
    status, body = await coins.call("similar_objects", options)
    assert status == 400 and body["error"]["code"] == "request.invalid_options", body


# -- search_by_text_image and characterize_object ----------------------------------------------------


async def test_search_by_text_image_uses_the_image_space(coins: Gateway) -> None:
    data = await coins.ok("search_by_text_image", {"query": "a bimetallic two euro coin", "limit": 5})
    # The text model's vectors (384-d) could not even be compared with the 32-d image rows.
    assert len(data) == 5 and all(-1 <= h["similarity"] <= 1 for h in data)
    assert all(h["score"] == pytest.approx(1 / (2 - h["similarity"]), abs=1e-5) for h in data)
    scoped = await coins.ok("search_by_text_image", {"query": "coin", "section_tipo": "multi1"})
    assert {h["section_tipo"] for h in scoped} == {"multi1"}
    status, body = await coins.call("search_by_text_image", {"limit": 5})
    assert status == 400 and body["error"]["code"] == "request.invalid_options"


async def test_characterize_object_proposes_with_evidence(coins: Gateway) -> None:
    data = await coins.ok("characterize_object", {"section_tipo": "coins1", "section_id": 1001})
    assert data["model"] == IMAGE_MODEL and data["neighbours"] == 20  # RAG_CHARACTERIZE_TOP_K
    proposals = data["proposals"]
    assert set(proposals) == {"denomination", "material", "period"}
    for role in ("denomination", "material"):
        p = proposals[role]
        assert p["kind"] == "categorical" and 0 <= p["confidence"] <= 1
        assert p["value"] == p["distribution"][0]["value"]
        assert sum(d["share"] for d in p["distribution"]) == pytest.approx(1, abs=1e-4)
        assert 1 <= len(p["evidence"]) <= 8 and all(e["thumb_url"] for e in p["evidence"])
        assert all(e["context"][role] == p["value"] for e in p["evidence"])
    assert proposals["period"] == {
        "kind": "date",
        "earliest": None,
        "latest": None,
        "central": None,
        "confidence": 0.0,
        "evidence": [],
    }


async def test_the_image_tools_take_every_option_their_actions_read(coins: Gateway) -> None:
    """Over MCP the image actions list the options their handlers read (``scope`` and
    ``similarity_mode`` were missing from the hand-written tool schemas) and answer like HTTP."""
    server = build_mcp_server(coins.app, principal_from_token(coins.app[SETTINGS_KEY], ADMIN))
    calls = [
        ("similar_objects", {"section_tipo": "coins1", "section_id": 1, "scope": "multi1", "limit": 3}),
        ("characterize_object", {"section_tipo": "coins1", "section_id": 1001, "similarity_mode": "visual"}),
        ("search_by_text_image", {"query": "a silver coin", "section_tipo": "coins1", "limit": 3}),
    ]
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        for name, arguments in calls:
            assert set(arguments) <= set(tools[name].input_schema["properties"]), name
            status, body = await coins.call(name, arguments, bearer=ADMIN)
            result = await client.call_tool(name, arguments)
            assert status == 200 and not result.is_error, (name, result.content)
            assert json.loads(result.content[0].text) == {"msg": body["msg"], "data": body["data"]}, name
        scoped = json.loads((await client.call_tool(*calls[0])).content[0].text)["data"]
        assert scoped and {h["section_tipo"] for h in scoped} == {"multi1"}


# -- the ACL on every image path ---------------------------------------------------------------------


async def test_forbidden_seeds_answer_like_missing_ones(coins: Gateway) -> None:
    for action in ("similar_objects", "characterize_object"):
        _, missing = await coins.call(action, {"section_tipo": "coins1", "section_id": 99999}, bearer=READER)
        _, other_project = await coins.call(
            action, {"section_tipo": "coins1", "section_id": 2001}, bearer=READER
        )
        no_section = token("nobody", projects=[1])
        _, no_grant = await coins.call(action, {"section_tipo": "coins1", "section_id": 5}, bearer=no_section)
        no_image = token("no-obverse", projects=[1], coins1=1, coins1__numd5=0)
        _, no_component = await coins.call(
            action, {"section_tipo": "coins1", "section_id": 5}, bearer=no_image
        )
        assert missing["error"]["code"] == "request.invalid_options"
        assert _same_answer(missing, other_project) and _same_answer(missing, no_grant)
        assert _same_answer(missing, no_component)


async def test_neighbours_pass_the_acl(coins: Gateway) -> None:
    options = {"section_tipo": "coins1", "section_id": 1001, "near_duplicate": True}
    admin = {h["section_id"] for h in await coins.ok("similar_objects", options)}
    reader = [h["section_id"] for h in await coins.ok("similar_objects", options, bearer=READER)]
    assert {2001, 2002, 2003} <= admin and not {2001, 2002, 2003} & set(reader) and 1 in reader
    text = await coins.ok("search_by_text_image", {"query": "coin", "limit": 50}, bearer=READER)
    assert all(h["section_id"] < 2000 for h in text) and len(text) == 50
    assert (
        await coins.ok("search_by_text_image", {"query": "coin"}, bearer=token("nobody", projects=[1])) == []
    )


async def test_role_values_need_their_component(coins: Gateway) -> None:
    hidden = token("no-denomination", projects=[1], coins1=1, coins1__numd10=0)
    hits = await coins.ok("similar_objects", {"section_tipo": "coins1", "section_id": 5}, bearer=hidden)
    assert hits and all(set(h["context"]) == {"material"} for h in hits)
    data = await coins.ok("characterize_object", {"section_tipo": "coins1", "section_id": 5}, bearer=hidden)
    assert data["proposals"]["denomination"]["value"] is None
    assert data["proposals"]["material"]["value"] is not None


async def _get(url: str, bearer: str | None) -> tuple[int, str, bytes]:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


async def test_thumbnails_are_served_behind_the_acl(coins: Gateway) -> None:
    status, kind, body = await _get(coins.url + "/v1/thumbnails/coins1/5/numd5/0", READER)
    assert (status, kind) == (200, "image/jpeg") and body[:2] == b"\xff\xd8"
    status, _, missing = await _get(coins.url + "/v1/thumbnails/coins1/99999/numd5/0", READER)
    assert status == 404
    for url, bearer in [
        ("/v1/thumbnails/coins1/2001/numd5/0", READER),  # another project
        ("/v1/thumbnails/coins1/5/numd5/0", token("nobody", projects=[1])),  # no section grant
        ("/v1/thumbnails/coins1/5/numd5/0", token("x", projects=[1], coins1=1, coins1__numd5=0)),
    ]:
        status, _, forbidden = await _get(coins.url + url, bearer)
        assert status == 404
        assert _same_answer(json.loads(forbidden), json.loads(missing))
    # Ids are ASCII digits only: "٥" (Arabic-Indic five) must not serve record 5, and "²", a
    # 5,000-digit id, signs, spaces and an index past int4 are the same 404 as a missing one.
    for section_id, index in [("٥", "0"), ("²", "0"), ("9" * 5000, "0"), ("+5", "0"), ("%205", "0"),
                              ("5", "٠"), ("5", "2147483648"), ("5", "-1")]:  # fmt: skip
        status, _, hostile = await _get(
            coins.url + f"/v1/thumbnails/coins1/{section_id}/numd5/{index}", READER
        )
        assert status == 404, (section_id, index, status)
        assert _same_answer(json.loads(hostile), json.loads(missing))
    status, _, _ = await _get(coins.url + "/v1/thumbnails/coins1/5/numd5/0", None)
    assert status == 401
    status, _, _ = await _get(coins.url + "/v1/thumbnails/coins1/2001/numd5/0", ADMIN)
    assert status == 200


async def test_media_switch_and_a_missing_image_model(
    coins_database: tuple[str, dict[str, Any]], sidecar_url: str
) -> None:
    url, _ = coins_database
    async with running_gateway(url, sidecar_url) as off:
        for action in ("similar_objects", "search_by_text_image", "characterize_object"):
            status, body = await off.call(action, {"section_tipo": "coins1", "section_id": 5, "query": "x"})
            assert status == 503 and body["error"]["code"] == "rag.media_disabled"
    async with running_gateway(
        url, sidecar_url, RAG_MEDIA_ENABLED="true", RAG_IMAGE_MODEL="siglip-absent"
    ) as gw:
        status, body = await gw.call("search_by_text_image", {"query": "coin"})
        assert status == 503 and body["error"]["code"] == "rag.embedding_unavailable"


# -- the Ray Data variant ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_ray_data_job_writes_the_same_rows_as_the_single_machine_job(
    database_url: str, sidecar_url: str, sidecar_config: Any, tmp_path: Path
) -> None:
    """On a local two-node Ray cluster with the offline tiny SigLIP: the rows (hashes, summaries, meta,
    thumbnails) equal the sidecar job's, the vectors to float tolerance (same encoder code)."""
    import asyncio
    import sys

    import numpy as np
    import yaml

    from index.store.image_store import get_thumbnail

    spec = sidecar_config.model(IMAGE_MODEL)
    config = tmp_path / "models.yaml"
    config.write_text(
        yaml.safe_dump({"models": [{"id": spec.id, "kind": spec.kind, "weights": spec.weights}]})
    )
    manifest = _manifest(tmp_path / "six.jsonl", [*ABSOLUTE[:5], {"path": str(COINS / "missing.jpg")}])
    pool = await create_pool(database_url, max_size=2)
    try:
        for section in ("single1", "ray1"):
            await SectionStore(pool).put(
                section, {**COIN_SECTION, "context": {**COIN_SECTION["context"], "compare_scope": []}}
            )
        async with SidecarClient(sidecar_url) as client:
            single = await run_image_job(
                pool,
                client,
                manifest,
                JobOptions("single1", projects=(1,), batch_size=4, media=MEDIA, rejects=tmp_path / "a.jsonl"),
            )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.ray_image_job",
            database_url,
            str(manifest),
            "ray1",
            str(config),
            stdout=asyncio.subprocess.PIPE,
            cwd=str(REPO_ROOT),
        )
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        report = json.loads(out.decode().strip().splitlines()[-1])
        assert report["nodes"] == 2
        # The first job, asking for a GPU per embedder on a CPU-only cluster, stopped before any row.
        assert "did not start 2 embedder(s) of 1 GPU(s) each within 2 s" in report["unplaceable"], report
        assert (report["embedded"], report["rejected"], report["rows_written"]) == (5, 1, 5)
        assert (single.embedded, single.rejected) == (5, 1)
        partition = await get_partition(pool, IMAGE_MODEL)
        assert partition is not None
        rows = {
            section: await pool.fetch(
                f"""SELECT section_id, component_tipo, view, chunk_index, source_hash, source_text, projects,
                           chunk_meta, embedding FROM {partition.table}
                    WHERE section_tipo = $1 ORDER BY section_id""",
                section,
            )
            for section in ("single1", "ray1")
        }
        assert len(rows["single1"]) == len(rows["ray1"]) == 5
        for a, b in zip(rows["single1"], rows["ray1"], strict=True):
            same = (
                "section_id",
                "component_tipo",
                "view",
                "chunk_index",
                "source_hash",
                "source_text",
                "projects",
            )
            assert [a[k] for k in same] == [b[k] for k in same]
            meta_a, meta_b = json.loads(a["chunk_meta"]), json.loads(b["chunk_meta"])
            assert meta_a["roles"] == meta_b["roles"] and meta_a["view"] == meta_b["view"]
            assert np.allclose(a["embedding"].to_numpy(), b["embedding"].to_numpy(), atol=1e-5)
            assert await get_thumbnail(pool, "single1", a["section_id"], "numd5", 0) == await get_thumbnail(
                pool, "ray1", b["section_id"], "numd5", 0
            )
    finally:
        await pool.close()
