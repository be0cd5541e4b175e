"""One declaration per sidecar route (inference/routes.py): validation and the OpenAPI document agree.

``GET /openapi.json`` publishes, for every declared route, the request schema its declaration
produces; a declaration changed (a field made required, a limit narrowed) changes both what the
sidecar refuses and what it publishes; and for every field, over a fixed set of probe values, the
published JSON Schema accepts exactly what the validation accepts. The client speaks the same
declarations: every public call of ``SidecarClient`` sends requests pinned to the byte (the wire
format the archive speaks), to declared routes only, with declared fields only, that the route's own
:meth:`Route.read` accepts. In process, on the real model code (the real all-MiniLM-L6-v2 and the
tiny test models), behind a real aiohttp server, without Ray.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import io
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import jsonschema
import pytest
from aiohttp.test_utils import TestServer
from PIL import Image

from inference.api import LocalBackend, SidecarAPI
from inference.client import SidecarClient
from inference.config import SidecarConfig
from inference.contract import Field, FieldType, Route
from inference.encoders import load_encoder
from inference.errors import SidecarApiError
from inference.local_server import create_app
from inference.routes import EMBED, ROUTES
from inference.service import ModelService

MINILM = "all-minilm-l6-v2"
JSON = {"Content-Type": "application/json"}

# A valid value for each required field (any route's field of that name accepts it).
REQUIRED_SAMPLES: dict[str, Any] = {
    "input": ["a red-figure amphora"],
    "images": ["iVBORw0KGgo="],
    "query": "amphora",
    "documents": ["a red-figure amphora", "a coin"],
}
# What the schema cannot say and the validation checks against the configuration is probed elsewhere
# (test_inference_http): which models are served and their kind, a model's input count per request,
# each image's base64 (answered as images[i]). A null reads as absent; JSON Schema counts 5.0 as an
# integer while the validation refuses it (stricter). Neither is probed here.
PROBES: list[Any] = [
    "",
    "x",
    "float",
    "base64",
    "hex",
    0,
    1,
    -1,
    2**63,
    1.5,
    True,
    False,
    [],
    ["a"],
    ["a", "b"],
    ["a", 2],
    [1],
    [[]],
    {},
    {"a": 1},
]


@pytest.fixture(scope="module")
async def minilm(sidecar_config: SidecarConfig) -> AsyncIterator[LocalBackend]:
    """MiniLM served in process, warmed up by a real forward pass."""
    spec = sidecar_config.model(MINILM)
    service = ModelService(spec, sidecar_config.limits, load_encoder(spec))
    service.warm_up()
    try:
        yield LocalBackend(service)
    finally:
        await service.close()


def _api(config: SidecarConfig, backend: LocalBackend, routes: Sequence[Route] = ROUTES) -> SidecarAPI:
    only = dataclasses.replace(config, models=(config.model(MINILM),))
    return SidecarAPI(only, {MINILM: backend}, routes=routes)


async def _post(api: SidecarAPI, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    answer = await api.handle("POST", path, JSON, json.dumps(body).encode())
    return answer.status, json.loads(answer.body)


async def _request_schemas(api: SidecarAPI) -> dict[str, dict[str, Any]]:
    """POST path -> its request schema, as ``GET /openapi.json`` publishes it."""
    answer = await api.handle("GET", "/openapi.json", {}, b"")
    assert answer.status == 200
    paths = json.loads(answer.body)["paths"]
    return {
        path: ops["post"]["requestBody"]["content"]["application/json"]["schema"]
        for path, ops in paths.items()
        if "post" in ops
    }


def _with_field(routes: Sequence[Route], path: str, name: str, **changes: Any) -> tuple[Route, ...]:
    """A copy of the table with one field of one POST route redeclared."""

    def change(route: Route) -> Route:
        if route.path != path or route.method != "POST":
            return route
        fields = tuple(dataclasses.replace(f, **changes) if f.name == name else f for f in route.fields)
        assert fields != route.fields, f"{path} declares no field {name!r}"
        return dataclasses.replace(route, fields=fields)

    return tuple(change(route) for route in routes)


async def test_the_document_publishes_what_the_declarations_produce(
    sidecar_config: SidecarConfig, minilm: LocalBackend
) -> None:
    api = _api(sidecar_config, minilm)
    answer = await api.handle("GET", "/openapi.json", {}, b"")
    paths = json.loads(answer.body)["paths"]
    assert {(m.upper(), p) for p, ops in paths.items() for m in ops} == {(r.method, r.path) for r in ROUTES}
    for route in ROUTES:
        operation = paths[route.path][route.method.lower()]
        assert operation["summary"] == route.summary
        assert ("security" in operation) is not route.open, route.path
        if route.method == "POST":
            assert operation["requestBody"]["content"]["application/json"]["schema"] == route.request_schema()
        else:
            assert "requestBody" not in operation
    # What the declarations say, spelled out once: the routes' required fields and the limits.
    schemas = await _request_schemas(api)
    assert {p: s["required"] for p, s in schemas.items()} == {
        "/embed": ["model", "input"],
        "/v1/embeddings": ["model", "input"],
        "/text": ["model", "input"],
        "/image": ["model", "images"],
        "/rerank": ["model", "query", "documents"],
        "/tokenize": ["model", "input"],
    }
    assert schemas["/embed"]["properties"]["encoding_format"]["enum"] == ["float", "base64"]
    assert schemas["/rerank"]["properties"]["truncate"]["default"] is True
    assert schemas["/embed"]["properties"]["truncate"]["default"] is False
    assert schemas["/image"]["properties"]["images"]["minItems"] == 1
    assert schemas["/rerank"]["properties"]["model"]["x-model-kinds"] == ["rerank"]
    assert "max_client_batch" in schemas["/embed"]["properties"]["input"]["description"]


async def test_a_changed_declaration_changes_the_validation_and_the_document(
    sidecar_config: SidecarConfig, minilm: LocalBackend
) -> None:
    body = {"model": MINILM, "input": ["a coin"], "encoding_format": "base64"}
    declared = _api(sidecar_config, minilm)
    assert (await _post(declared, "/embed", body))[0] == 200

    required = _api(
        sidecar_config, minilm, _with_field(ROUTES, "/embed", "truncate", required=True, default=None)
    )
    status, answer = await _post(required, "/embed", body)
    assert (status, answer["error"]) == (400, {"code": "missing_field", "message": "'truncate' is required"})
    assert (await _post(required, "/embed", {**body, "truncate": False}))[0] == 200
    assert (await _request_schemas(required))["/embed"]["required"] == ["model", "input", "truncate"]
    assert "default" not in (await _request_schemas(required))["/embed"]["properties"]["truncate"]

    narrowed = _api(
        sidecar_config, minilm, _with_field(ROUTES, "/embed", "encoding_format", choices=("float",))
    )
    status, answer = await _post(narrowed, "/embed", body)
    assert (status, answer["error"]) == (
        400,
        {"code": "invalid_encoding_format", "message": "'encoding_format' must be 'float'"},
    )
    assert (await _request_schemas(narrowed))["/embed"]["properties"]["encoding_format"]["enum"] == ["float"]
    # Only the changed route moved: /v1/embeddings declares its own encoding_format field.
    assert (await _post(narrowed, "/v1/embeddings", body))[0] == 200
    assert (await _request_schemas(narrowed))["/v1/embeddings"] == (await _request_schemas(declared))[
        "/v1/embeddings"
    ]


def _accepted_by_declaration(route: Route, body: dict[str, Any], config: SidecarConfig) -> bool:
    try:
        route.read(body, config, [spec.id for spec in config.models])
    except SidecarApiError as exc:
        assert 400 <= exc.status < 500, (route.path, body, exc.code)
        return False
    return True


def _probed(field: Field, probe: Any) -> bool:
    if field.type is FieldType.MODEL:  # served models and their kinds: the configuration's, not the schema's
        return False
    # Each image is checked as it is decoded, its errors naming images[i]; the list itself is probed.
    return not (field.type is FieldType.IMAGES and isinstance(probe, list) and probe)


@pytest.mark.parametrize("route", [r for r in ROUTES if r.method == "POST"], ids=lambda r: r.path)
def test_the_schema_accepts_what_the_validation_accepts(route: Route, sidecar_config: SidecarConfig) -> None:
    model = next(spec.id for spec in sidecar_config.models if spec.kind in route.model_kinds)
    schema = jsonschema.Draft202012Validator(route.request_schema())
    base = {
        "model": model,
        **{f.name: REQUIRED_SAMPLES[f.name] for f in route.fields if f.required and f.name != "model"},
    }
    assert _accepted_by_declaration(route, base, sidecar_config) and schema.is_valid(base), base
    disagreements = []
    for field in route.fields:
        if field.required:  # leaving it out is refused by both
            without = {k: v for k, v in base.items() if k != field.name}
            assert not _accepted_by_declaration(route, without, sidecar_config) and not schema.is_valid(
                without
            )
        for probe in (p for p in PROBES if _probed(field, p)):
            body = {**base, field.name: probe}
            declared, published = _accepted_by_declaration(route, body, sidecar_config), schema.is_valid(body)
            if declared != published:
                disagreements.append((field.name, probe, f"declaration {declared}, schema {published}"))
    assert not disagreements, disagreements


@pytest.mark.parametrize("route", [r for r in ROUTES if r.method == "POST"], ids=lambda r: r.path)
def test_a_published_default_is_what_the_handler_gets(route: Route, sidecar_config: SidecarConfig) -> None:
    model = next(spec.id for spec in sidecar_config.models if spec.kind in route.model_kinds)
    body = {
        "model": model,
        **{f.name: REQUIRED_SAMPLES[f.name] for f in route.fields if f.required and f.name != "model"},
    }
    args = route.read(body, sidecar_config, [model])
    for field in route.fields:
        published = field.json_schema()
        assert published["description"], (route.path, field.name)
        if not field.required:  # absent: the handler gets the published default (None when there is none)
            assert args[field.name] == published.get("default"), (route.path, field.name)


def test_a_declaration_that_cannot_be_enforced_is_refused() -> None:
    with pytest.raises(ValueError, match="no default"):
        Field("truncate", FieldType.BOOLEAN, "d", required=True, default=False)
    with pytest.raises(ValueError, match="include the default"):
        Field("encoding_format", FieldType.STRING, "d", default="hex", choices=("float",))
    with pytest.raises(ValueError, match="only a list"):
        Field("query", FieldType.STRING, "d", counted=True)
    counted = Field("input", FieldType.TEXTS, "d", required=True, counted=True)
    model = Field("model", FieldType.MODEL, "d", required=True, model_kinds=("text",))
    with pytest.raises(ValueError, match="before the inputs"):
        Route("POST", "/x", "s", (counted, model))
    with pytest.raises(ValueError, match="one required model"):
        Route("POST", "/x", "s", (counted,))
    with pytest.raises(ValueError, match="twice"):
        Route("POST", "/x", "s", (model, counted, counted))


# -- the client speaks the declarations ------------------------------------------------------------

SIGLIP, BGE_M3, RERANKER = "tiny-siglip-random", "tiny-bge-m3-random", "tiny-reranker-random"


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 40, 10)).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = _png()
PNG_BASE64 = base64.b64encode(PNG).decode("ascii")

ClientCall = Callable[[SidecarClient], Awaitable[Any]]
# Every public call of the client, with the requests it sends, to the byte: the wire format the
# archive speaks (DESIGN 4) is pinned here, so a client built differently must still send these.
CLIENT_CALLS: list[tuple[str, ClientCall, list[tuple[str, str, bytes]]]] = [
    ("models", lambda c: c.models(), [("GET", "/models", b"")]),
    ("ready", lambda c: c.ready(), [("GET", "/readyz", b"")]),
    (
        "embed",
        lambda c: c.embed(MINILM, ["a red-figure amphora"]),
        [
            (
                "POST",
                "/embed",
                b'{"model":"all-minilm-l6-v2","input":["a red-figure amphora"],"truncate":false,'
                b'"return_sparse":false,"encoding_format":"base64"}',
            )
        ],
    ),
    (
        "embed",
        lambda c: c.embed(BGE_M3, ["amphora", "coin", "dam"], truncate=True, return_sparse=True),
        [
            (
                "POST",
                "/embed",
                b'{"model":"tiny-bge-m3-random","input":["amphora","coin"],"truncate":true,'
                b'"return_sparse":true,"encoding_format":"base64"}',
            ),
            (
                "POST",
                "/embed",
                b'{"model":"tiny-bge-m3-random","input":["dam"],"truncate":true,'
                b'"return_sparse":true,"encoding_format":"base64"}',
            ),
        ],
    ),
    (
        "openai_embeddings",
        lambda c: c.openai_embeddings(MINILM, "amphora"),
        [
            (
                "POST",
                "/v1/embeddings",
                b'{"model":"all-minilm-l6-v2","input":"amphora","encoding_format":"float"}',
            )
        ],
    ),
    (
        "openai_embeddings",
        lambda c: c.openai_embeddings(MINILM, ["amphora"], encoding_format="base64", dimensions=384),
        [
            (
                "POST",
                "/v1/embeddings",
                b'{"model":"all-minilm-l6-v2","input":["amphora"],"encoding_format":"base64","dimensions":384}',
            )
        ],
    ),
    (
        "tokenize",
        lambda c: c.tokenize(MINILM, ["amphora", "coin"]),
        [("POST", "/tokenize", b'{"model":"all-minilm-l6-v2","input":["amphora","coin"]}')],
    ),
    (
        "embed_images",
        lambda c: c.embed_images(SIGLIP, [PNG]),
        [
            (
                "POST",
                "/image",
                b'{"model":"tiny-siglip-random","images":["%s"],"encoding_format":"base64"}'
                % PNG_BASE64.encode(),
            )
        ],
    ),
    (
        "embed_image_texts",
        lambda c: c.embed_image_texts(SIGLIP, ["a red-figure amphora"]),
        [
            (
                "POST",
                "/text",
                b'{"model":"tiny-siglip-random","input":["a red-figure amphora"],"encoding_format":"base64"}',
            )
        ],
    ),
    (
        "rerank",
        lambda c: c.rerank(RERANKER, "amphora", ["a red-figure amphora", "a coin"]),
        [
            (
                "POST",
                "/rerank",
                b'{"model":"tiny-reranker-random","query":"amphora","documents":["a red-figure amphora","a coin"]}',
            )
        ],
    ),
]


class _Recording(SidecarAPI):
    """The real API, keeping each request it answers as (method, path, body) for the test to read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str, bytes]] = []

    async def handle(self, method: str, path: str, headers: Any, body: bytes | SidecarApiError) -> Any:
        self.requests.append((method, path, body if isinstance(body, bytes) else b"<unread>"))
        return await super().handle(method, path, headers, body)


@pytest.fixture(scope="module")
async def every_model(
    sidecar_config: SidecarConfig, inference_encoders: dict[str, Any]
) -> AsyncIterator[tuple[_Recording, str]]:
    """Every test model served in process behind a real aiohttp server on 127.0.0.1."""
    services = [
        ModelService(spec, sidecar_config.limits, inference_encoders[spec.id])
        for spec in sidecar_config.models
    ]
    for service in services:
        service.warm_up()
    api = _Recording(sidecar_config, {s.spec.id: LocalBackend(s) for s in services})
    server = TestServer(create_app(api), host="127.0.0.1")
    await server.start_server()
    try:
        yield api, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
        for service in services:
            await service.close()


def test_a_body_its_declaration_does_not_allow_is_refused_before_it_is_sent() -> None:
    with pytest.raises(ValueError, match=r"POST /embed declares no field \['inputs'\]"):
        EMBED.body(model=MINILM, inputs=["x"])
    with pytest.raises(ValueError, match=r"POST /embed requires \['model'\]"):
        EMBED.body(input=["x"])
    # Declaration order, whatever the caller's; a None is left out, as the server reads it absent.
    assert EMBED.body(truncate=None, input=["x"], model=MINILM) == {"model": MINILM, "input": ["x"]}
    assert list(EMBED.body(encoding_format="base64", input=["x"], model=MINILM)) == [
        "model",
        "input",
        "encoding_format",
    ]


def test_every_public_client_call_is_pinned() -> None:
    public = {
        name
        for name, member in inspect.getmembers(SidecarClient, inspect.iscoroutinefunction)
        if not name.startswith("_") and name != "close"
    }
    assert public == {name for name, _, _ in CLIENT_CALLS}


@pytest.mark.parametrize(("name", "call", "sent"), CLIENT_CALLS, ids=[c[0] for c in CLIENT_CALLS])
async def test_the_client_sends_what_the_declarations_read(
    name: str,
    call: ClientCall,
    sent: list[tuple[str, str, bytes]],
    every_model: tuple[_Recording, str],
    sidecar_config: SidecarConfig,
) -> None:
    api, url = every_model
    api.requests.clear()
    async with SidecarClient(url, max_batch=2, max_retries=0) as client:
        assert await call(client)  # answered 2xx and read back (ready: True)
    assert api.requests == sent
    routes = {(route.method, route.path): route for route in ROUTES}
    for method, path, body in api.requests:
        route = routes[(method, path)]  # a declared route
        if method == "GET":
            continue
        payload = json.loads(body)
        assert set(payload) <= {f.name for f in route.fields}, (path, payload)  # none the server ignores
        route.read(payload, sidecar_config, [spec.id for spec in sidecar_config.models])
