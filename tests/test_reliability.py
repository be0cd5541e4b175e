"""The reliability suite's fuzzers and attacks, with small budgets, against the session's real services.

``mnemo bench --suite reliability`` runs the same functions with larger budgets; here they keep CI
exercising them: every route of both ``/openapi.json`` documents fuzzed (no 5xx, no dropped
connection, every answer in the service's error shape), forged tokens refused, no row leaked to a
restricted principal, forbidden and missing records answered alike, hostile images coded.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import urllib.request
from typing import Any

import pytest

from benchmarks.attacks import AclProbe, bad_images, forged_tokens, image_attacks, leak_check, token_attacks
from benchmarks.fuzz import (
    CLASSES,
    Case,
    _mutated,
    documented_errors,
    fuzz_service,
    gateway_contract,
    judge,
    send,
    sidecar_contract,
)
from gateway.base.resources import SETTINGS_KEY
from inference.api import OPEN_ROUTES, SidecarAPI
from inference.config import SidecarConfig
from tests.fixtures.gateway import ADMIN, CORPUS, SECRET, Gateway, running_gateway, token

CASES_PER_ROUTE = 12  # small: CI exercises every class a few times per service; the suite goes wider


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)


def _png() -> str:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


def test_sidecar_openapi_lists_every_route(sidecar_url: str, sidecar_config: SidecarConfig) -> None:
    spec = _get(sidecar_url + "/openapi.json")
    listed = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    assert listed == set(SidecarAPI(sidecar_config, {})._routes)
    assert spec["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "required"
    ] == [
        "model",
        "input",
    ]
    assert all("security" not in spec["paths"][p]["get"] for p in OPEN_ROUTES)


async def test_fuzzing_the_sidecar_from_its_openapi(sidecar_url: str, sidecar_config: SidecarConfig) -> None:
    spec = await asyncio.to_thread(_get, sidecar_url + "/openapi.json")
    models = [m.id for m in sidecar_config.models]
    report = await asyncio.to_thread(
        fuzz_service,
        sidecar_url,
        spec,
        service="sidecar",
        contract=sidecar_contract,
        headers={},
        hints={"model": [*models, "no-such-model"], "images": [[_png()]]},
        cases_per_route=CASES_PER_ROUTE,
        seconds=240,
        oversize=sidecar_config.limits.max_body_bytes + 1,
    )
    assert set(report.cases) == {f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops}
    assert report.server_errors == 0 and not report.problems, report.as_dict()
    assert (await asyncio.to_thread(_get, sidecar_url + "/healthz"))["status"] == "ok"


async def test_fuzzing_the_gateway_from_its_openapi(database_url: str, sidecar_url: str) -> None:
    # A fresh database: valid intake cases write records and sections.
    async with running_gateway(database_url, sidecar_url) as gw:
        spec = await asyncio.to_thread(_get, gw.url + "/openapi.json")
        report = await asyncio.to_thread(
            fuzz_service,
            gw.url,
            spec,
            service="gateway",
            contract=gateway_contract,
            headers={"Authorization": f"Bearer {ADMIN}"},
            hints={
                "section_tipo": ["oh1", "rsc1", "zz9"],
                "section_id": [1, 2, 0],
                "query": ["water", "silver coins", "x"],
                "projects": [[1], []],
                "groups": [{"card": {"lg-eng": "A short card about a mill."}}],
            },
            cases_per_route=CASES_PER_ROUTE,
            seconds=240,
            oversize=gw.app[SETTINGS_KEY].max_body_bytes + 1,
        )
        assert len(report.cases) == sum(len(ops) for ops in spec["paths"].values())
        assert report.server_errors == 0 and not report.problems, report.as_dict()
        status, _ = await gw.call("embed_groups", {"section_tipo": "oh1"})
        assert status == 200


async def test_documented_coded_5xx_are_counted_apart_from_server_errors(
    database_url: str, sidecar_url: str
) -> None:
    """The kill switch's 503 ``rag.media_disabled`` is an answer the contract promises, not a server
    error; a 500, an uncoded 5xx or a code the route does not list for its status is one."""
    async with running_gateway(database_url, sidecar_url) as gw:
        spec = await asyncio.to_thread(_get, gw.url + "/openapi.json")
        body = json.dumps(
            {
                "dd_api": "dd_rag_api",
                "action": "similar_objects",
                "options": {"section_tipo": "oh1", "section_id": 1},
            }
        ).encode()
        headers = (("Content-Type", "application/json"), ("Authorization", f"Bearer {ADMIN}"))
        case = Case("valid", "POST /api/v1/json", "POST", "/api/v1/json", headers, body)
        status, answer_headers, answer = await asyncio.to_thread(send, gw.url, case, 60)
    assert status == 503 and json.loads(answer)["error"]["code"] == "rag.media_disabled", answer
    dispatch = documented_errors(spec["paths"]["/api/v1/json"]["post"])
    readyz = documented_errors(spec["paths"]["/readyz"]["get"])
    assert "rag.media_disabled" in dispatch[503] and "service.stopping" in readyz[503]
    assert judge(status, answer_headers, answer, "/api/v1/json", dispatch, gateway_contract) == (
        "documented_unavailable",
        None,
    )
    # The same answer from a route that does not list that code, a 500, an uncoded 502: server errors.
    assert judge(status, answer_headers, answer, "/readyz", readyz, gateway_contract)[0] == "server_error"
    internal = answer.replace(b"rag.media_disabled", b"internal")
    assert (
        judge(500, answer_headers, internal, "/api/v1/json", dispatch, gateway_contract)[0] == "server_error"
    )
    assert judge(502, {}, b"Bad Gateway", "/api/v1/json", dispatch, gateway_contract)[0] == "server_error"
    assert judge(0, {}, b"", "/api/v1/json", dispatch, gateway_contract)[0] == "server_error"
    # Retryable 503s carry Retry-After; a documented one without it breaks the contract.
    stopping = answer.replace(b"rag.media_disabled", b"service.stopping").replace(
        b'"retryable":false', b'"retryable":true'
    )
    assert judge(503, {}, stopping, "/readyz", readyz, gateway_contract)[0] == "server_error"
    assert judge(503, {"retry-after": "1"}, stopping, "/readyz", readyz, gateway_contract)[0] == (
        "documented_unavailable"
    )


def _readable(doc: Any) -> bool:
    """The oracle for RESTRICTED, written from the corpus, not from the gate: oh1 in project 1, and
    every contributor an oh1 component other than oh23 (a dd810/... contributor is another section)."""
    contributors = doc.contributors
    return (
        doc.section_tipo == "oh1"
        and 1 in doc.projects
        and bool(contributors)
        and all("/" not in c and c != "oh23" for c in contributors)
    )


RESTRICTED = token("alice", projects=[1], oh1=1, oh1__oh23=0)


def _allowed(row: dict[str, Any]) -> bool:
    group = str(row.get("component_tipo") or "").removeprefix("rag:") or None
    docs = [
        d
        for d in CORPUS
        if d.section_tipo == row.get("section_tipo")
        and d.section_id == row.get("section_id")
        and (group is None or d.group == group)
    ]
    return bool(docs) and any(_readable(d) for d in docs)


def _probe() -> AclProbe:
    scopes: list[Any] = [["oh1", "rsc1", "fill1"], "oh1", "rsc1", ["fill1", "oh1"]]
    requests = [
        {"dd_api": "dd_rag_api", "action": action, "options": {"query": q, "section_tipo": s, "limit": 50}}
        for action in ("semantic_search", "retrieve", "get_agent_context", "ask")
        for q in ("water village reservoir", "silver coins mill", "Roman bronze coin")
        for s in scopes
    ]
    requests += [
        {
            "dd_api": "dd_rag_api",
            "action": "similar_to",
            "options": {"section_tipo": t, "section_id": i, "limit": 50},
        }
        for t, i in (("oh1", 1), ("oh1", 2), ("rsc1", 1), ("fill1", 1000))
    ]
    twins = [
        (
            {
                "dd_api": "dd_rag_api",
                "action": action,
                "options": {"section_tipo": tipo, "section_id": forbidden},
            },
            {
                "dd_api": "dd_rag_api",
                "action": action,
                "options": {"section_tipo": tipo, "section_id": 999_999},
            },
        )
        for action in ("similar_to", "similar_objects", "characterize_object")
        for tipo, forbidden in (("oh1", 3), ("fill1", 1000))
    ]
    return AclProbe(admin=ADMIN, restricted=RESTRICTED, allowed=_allowed, requests=requests, twins=twins)


async def test_no_row_leaks_and_forged_tokens_are_refused(corpus_gateway: Gateway) -> None:
    result = await asyncio.to_thread(leak_check, corpus_gateway.url, _probe())
    assert result["restricted_rows"] > 0, result  # the oracle has something to judge
    assert result["admin_rows"] > result["restricted_rows"], result  # and the admin sees more
    assert result["rows_leaked"] == 0, result["leaks"]
    assert not result["twins_differing"], result
    search = {"dd_api": "dd_rag_api", "action": "semantic_search", "options": {"query": "water"}}
    refused = await asyncio.to_thread(token_attacks, corpus_gateway.url, forged_tokens(SECRET), search)
    assert refused["not_refused"] == [], refused


async def test_hostile_images_are_coded_4xx_or_embedded(sidecar_url: str) -> None:
    dimension = next(
        m["dimension"] for m in _get(sidecar_url + "/models")["models"] if m["id"] == "tiny-siglip-random"
    )
    result = await asyncio.to_thread(
        image_attacks, sidecar_url, "tiny-siglip-random", bad_images(), dimension
    )
    assert result["server_errors"] == 0 and not result["problems"], result
    assert result["embedded"] > 0 and result["refused_4xx"] > 0, result
    assert (await asyncio.to_thread(_get, sidecar_url + "/healthz"))["status"] == "ok"


@pytest.mark.parametrize("klass", [c for c in CLASSES if c not in ("path_params", "query_junk")])
def test_every_mutation_applies_to_objects_batches_and_scalars(klass: str) -> None:
    """Regression: a record batch (a JSON list) crashed the generator ('list indices must be integers')."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    bodies = st.sampled_from([{"a": {"b": [1, "x"]}}, [{"section_id": 1, "groups": {}}, {"x": [2]}], 5, []])

    @settings(
        max_examples=25, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(_mutated(bodies, klass, 64))
    def check(body: bytes) -> None:
        assert isinstance(body, bytes)

    check()
