"""What each sidecar route does once its request is valid: call the model, shape the answer.

Each handler takes the API serving it (:class:`Sidecar`) and the request's fields as
:meth:`Route.read <inference.contract.Route.read>` validated them; a POST route's ``model`` is a
served model of the route's kind. :data:`HANDLERS` names the handler of each route that
:data:`inference.routes.ROUTES` declares.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from . import routes
from .backends import Backend
from .config import SidecarConfig
from .contract import Args, Route
from .errors import BadRequest, ErrorCode, NotReady
from .images import decode_base64
from .metrics import SidecarMetrics
from .openapi import build_spec
from .responses import HttpResponse, encode_vectors, finite, json_response

__all__ = [
    "HANDLERS",
    "Handler",
    "Sidecar",
    "embed",
    "healthz",
    "image",
    "metrics",
    "models",
    "openai_embeddings",
    "openai_models",
    "openapi",
    "readyz",
    "rerank",
    "text",
    "tokenize",
]


class Sidecar(Protocol):
    """What a route's handler may use of the API serving it (:class:`inference.api.SidecarAPI`)."""

    config: SidecarConfig
    backends: Mapping[str, Backend]
    metrics: SidecarMetrics
    backend_timeout_s: float

    @property
    def routes(self) -> Sequence[Route]: ...
    async def call(self, coro: Awaitable[Any]) -> Any: ...
    async def ready_map(self) -> dict[str, bool]: ...
    async def info(self, model: str) -> dict[str, Any]: ...


Handler = Callable[[Sidecar, Args], Awaitable[HttpResponse]]


# -- GET routes ------------------------------------------------------------------------------------


async def healthz(api: Sidecar, args: Args) -> HttpResponse:
    return json_response(200, {"status": "ok"})


async def readyz(api: Sidecar, args: Args) -> HttpResponse:
    ready = await api.ready_map()
    if all(ready.values()):
        return json_response(200, {"status": "ready", "models": ready})
    waiting = sorted(m for m, ok in ready.items() if not ok)
    error = NotReady(f"models not ready: {', '.join(waiting)}", retry_after=5)
    return json_response(503, {**error.to_json(), "models": ready}, {"Retry-After": "5"})


async def models(api: Sidecar, args: Args) -> HttpResponse:
    infos = [await api.info(model) for model in api.backends]
    return json_response(200, {"models": infos})


async def openai_models(api: Sidecar, args: Args) -> HttpResponse:
    data = [{"id": model, "object": "model", "created": 0, "owned_by": "mnemo"} for model in api.backends]
    return json_response(200, {"object": "list", "data": data})


async def openapi(api: Sidecar, args: Args) -> HttpResponse:
    return json_response(200, build_spec(api.routes))


async def metrics(api: Sidecar, args: Args) -> HttpResponse:
    async def one(model: str, backend: Backend) -> tuple[str, dict[str, Any] | None]:
        try:
            return model, await asyncio.wait_for(backend.stats(), api.backend_timeout_s)
        except Exception:  # a replica that does not answer is left out of this scrape, not fatal to it
            return model, None

    stats = await asyncio.gather(*(one(m, b) for m, b in api.backends.items()))
    coalescing = {m: c for m, b in api.backends.items() if (c := b.coalescing()) is not None}
    body, content_type = api.metrics.render({m: s for m, s in stats if s is not None}, coalescing)
    return HttpResponse(200, body, content_type=content_type)


# -- POST routes -----------------------------------------------------------------------------------


def _vectors_answer(model: str, out: dict[str, Any], encoding: str) -> dict[str, Any]:
    """The native answer of ``/embed``, ``/text`` and ``/image``: vectors, model and dimension."""
    return {
        "embeddings": encode_vectors(out["dense"], encoding),
        "model": model,
        "dimension": int(out["dense"].shape[1]),
    }


async def embed(api: Sidecar, args: Args) -> HttpResponse:
    model, texts, sparse = args["model"], args["input"], args["return_sparse"]
    backend = api.backends[model]
    out = await api.call(backend.embed(texts, truncate=args["truncate"], return_sparse=sparse))
    api.metrics.observe_items(model, "texts", len(texts), out["tokens"])
    answer = {**_vectors_answer(model, out, args["encoding_format"]), "usage": {"tokens": out["tokens"]}}
    if sparse:
        finite([w for row in out["sparse"] for w in row.values()], "sparse weights")
        answer["sparse"] = [{str(k): v for k, v in row.items()} for row in out["sparse"]]
    return json_response(200, answer)


async def openai_embeddings(api: Sidecar, args: Args) -> HttpResponse:
    model, texts, dimensions = args["model"], args["input"], args["dimensions"]
    out = await api.call(api.backends[model].embed(texts, truncate=False, return_sparse=False))
    if dimensions is not None and dimensions != out["dense"].shape[1]:
        raise BadRequest(
            f"model {model!r} has {out['dense'].shape[1]} dimensions; 'dimensions' cannot change that",
            code=ErrorCode.UNSUPPORTED_DIMENSIONS,
        )
    api.metrics.observe_items(model, "texts", len(texts), out["tokens"])
    vectors = encode_vectors(out["dense"], args["encoding_format"])
    return json_response(
        200,
        {
            "object": "list",
            "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
            "model": model,
            "usage": {"prompt_tokens": out["tokens"], "total_tokens": out["tokens"]},
        },
    )


async def text(api: Sidecar, args: Args) -> HttpResponse:
    model, texts = args["model"], args["input"]
    out = await api.call(api.backends[model].embed_texts(texts, truncate=args["truncate"]))
    api.metrics.observe_items(model, "texts", len(texts), out["tokens"])
    answer = {**_vectors_answer(model, out, args["encoding_format"]), "usage": {"tokens": out["tokens"]}}
    return json_response(200, answer)


async def image(api: Sidecar, args: Args) -> HttpResponse:
    model = args["model"]
    limit = api.config.limits.max_image_bytes
    raw = [decode_base64(data, i, limit) for i, data in enumerate(args["images"])]
    out = await api.call(api.backends[model].embed_images(raw))
    api.metrics.observe_items(model, "images", len(raw), 0)
    return json_response(200, _vectors_answer(model, out, args["encoding_format"]))


async def rerank(api: Sidecar, args: Args) -> HttpResponse:
    model, documents = args["model"], args["documents"]
    backend = api.backends[model]
    out = await api.call(
        backend.rerank(args["query"], documents, truncate=args["truncate"], raw_scores=args["raw_scores"])
    )
    api.metrics.observe_items(model, "pairs", len(documents), out["tokens"])
    finite(out["scores"], "scores")
    return json_response(200, {"scores": out["scores"], "model": model, "usage": {"tokens": out["tokens"]}})


async def tokenize(api: Sidecar, args: Args) -> HttpResponse:
    model = args["model"]
    counts = await api.call(api.backends[model].tokenize(args["input"]))
    return json_response(200, {"tokens": counts, "model": model})


# Each declared route's handler, by (method, path): SidecarAPI refuses a route it has none for.
HANDLERS: Mapping[tuple[str, str], Handler] = {
    (route.method, route.path): handler
    for route, handler in (
        (routes.HEALTHZ, healthz),
        (routes.READYZ, readyz),
        (routes.MODELS, models),
        (routes.OPENAI_MODELS, openai_models),
        (routes.METRICS, metrics),
        (routes.OPENAPI, openapi),
        (routes.EMBED, embed),
        (routes.OPENAI_EMBEDDINGS, openai_embeddings),
        (routes.TEXT, text),
        (routes.IMAGE, image),
        (routes.RERANK, rerank),
        (routes.TOKENIZE, tokenize),
    )
}
