"""The sidecar's HTTP contract, Ray-free: parse and validate requests, call model backends, shape answers.

:class:`SidecarAPI` maps ``(method, path, headers, body)`` to an :class:`HttpResponse`. Servers wrap it:
the Ray Serve ingress (``inference.serve_app``) and a plain aiohttp app (``inference.local_server``) for
in-process use. Validation lives here once; every failure is a :class:`~inference.errors.SidecarApiError`
answered as ``{"error": {"code", "message"}}`` with its status, never a raw exception string.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .config import SidecarConfig
from .errors import (
    BadRequest,
    ErrorCode,
    MethodNotAllowed,
    ModelFailed,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    RouteNotFound,
    SidecarApiError,
    Unauthorized,
    UnsupportedMediaType,
)
from .images import decode_base64
from .json_out import dumps
from .metrics import SidecarMetrics
from .strict_json import JsonRejected, loads_strict

__all__ = ["Backend", "HttpResponse", "LocalBackend", "SidecarAPI", "read_body"]

log = logging.getLogger(__name__)

OPEN_ROUTES = frozenset({"/healthz", "/readyz", "/openapi.json"})


class Backend(Protocol):
    """One model as the API sees it: a local :class:`~inference.service.ModelService` or a Serve handle."""

    async def embed(self, texts: list[str], *, truncate: bool, return_sparse: bool) -> dict[str, Any]: ...
    async def embed_texts(self, texts: list[str], *, truncate: bool) -> dict[str, Any]: ...
    async def embed_images(self, images: list[bytes]) -> dict[str, Any]: ...
    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool, raw_scores: bool
    ) -> dict[str, Any]: ...
    async def tokenize(self, texts: list[str]) -> list[int]: ...
    async def info(self) -> dict[str, Any]: ...
    async def is_ready(self) -> bool: ...
    async def stats(self) -> dict[str, Any]: ...
    def coalescing(self) -> dict[str, int] | None:
        """Calls and bundles sent to the model when the backend coalesces calls (else None)."""
        ...


class LocalBackend:
    """Adapts an in-process ``ModelService`` to :class:`Backend`."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def embed(self, texts, *, truncate, return_sparse):
        return await self.service.embed(texts, truncate=truncate, return_sparse=return_sparse)

    async def embed_texts(self, texts, *, truncate):
        return await self.service.embed_texts(texts, truncate=truncate)

    async def embed_images(self, images):
        return await self.service.embed_images(images)

    async def rerank(self, query, documents, *, truncate, raw_scores):
        return await self.service.rerank(query, documents, truncate=truncate, raw_scores=raw_scores)

    async def tokenize(self, texts):
        return await self.service.tokenize(texts)

    async def info(self):
        return self.service.info()

    async def is_ready(self):
        return self.service.is_ready()

    async def stats(self):
        return self.service.stats()

    def coalescing(self) -> None:  # in-process: every call is already a plain function call
        return None


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, limit: int) -> bytes:
    """Read a request body, refusing (413) past ``limit`` bytes without buffering more than limit + 1."""
    if content_length is not None:
        # ASCII digits only: int() would also take " 12", "1_2" and other scripts' digits.
        if not (content_length.isascii() and content_length.isdigit()):
            raise BadRequest("Content-Length is not an integer", code=ErrorCode.BAD_CONTENT_LENGTH)
        declared = (
            int(content_length[:19]) if len(content_length) <= 19 else limit + 1
        )  # no 4,300-digit int()
        if declared > limit:
            raise PayloadTooLarge(
                f"body of {declared} bytes is over the {limit}-byte limit", code=ErrorCode.BODY_TOO_LARGE
            )
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body is over the {limit}-byte limit", code=ErrorCode.BODY_TOO_LARGE)
        parts.append(chunk)
    return b"".join(parts)


# loads_strict's reasons as this service's error codes (all 400: the body is at fault).
_JSON_CODES = {
    "invalid_json": ErrorCode.INVALID_JSON,
    "too_deep": ErrorCode.JSON_TOO_DEEP,
    "number_too_long": ErrorCode.NUMBER_TOO_LONG,
    "invalid_text": ErrorCode.INVALID_TEXT,
}


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def _check_media_type(headers: Mapping[str, str]) -> None:
    """JSON bodies only: a declared non-JSON type or any content coding is a 415 (no guessing, no gzip bombs).

    A missing Content-Type is read as JSON, as TEI and OpenAI-style clients often omit it.
    """
    declared = _header(headers, "content-type").split(";", 1)[0].strip().lower()
    if declared and declared != "application/json" and not declared.endswith("+json"):
        raise UnsupportedMediaType(f"Content-Type {declared!r}: send application/json")
    coding = _header(headers, "content-encoding").strip().lower()
    if coding and coding != "identity":
        raise UnsupportedMediaType(f"Content-Encoding {coding!r} is not accepted; send the body as is")


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> HttpResponse:
    return HttpResponse(status, dumps(payload), headers=dict(headers or {}))


def _finite(values: np.ndarray | Sequence[float], what: str) -> None:
    """A model's numbers reach the caller finite or not at all: a NaN or an infinity (an fp16 overflow,
    a broken checkpoint) is a coded 500, in every encoding. The JSON encoder would write it as null,
    and base64 would carry it as bytes, both silently."""
    if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
        log.error("the model returned a non-finite value in its %s", what)
        raise ModelFailed(f"the model returned a non-finite value (NaN or infinity) in its {what}")


def _error(exc: SidecarApiError) -> HttpResponse:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return _json(exc.status, exc.to_json(), headers)


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in body or body[name] is None:
        if default is ...:
            raise BadRequest(f"'{name}' is required", code=ErrorCode.MISSING_FIELD)
        return default
    value = body[name]
    # bool is an int subclass: a boolean option must be a real bool, and a count never a bool.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise BadRequest(f"'{name}' must be of type {names}", code=ErrorCode.INVALID_TYPE)
    return value


def _strings(body: Mapping[str, Any], name: str) -> list[str]:
    """A list of strings (a bare string counts as one input, as TEI and OpenAI clients send)."""
    value = body.get(name)
    if value is None:
        raise BadRequest(f"'{name}' is required", code=ErrorCode.MISSING_FIELD)
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{name}' must be a string or a list of strings", code=ErrorCode.INVALID_TYPE)
    if not value:
        raise BadRequest(f"'{name}' is empty", code=ErrorCode.EMPTY_INPUT)
    return value


def _encode_vectors(matrix: np.ndarray, encoding: str) -> list:
    _finite(matrix, "vectors")
    if encoding == "base64":  # little-endian float32, as OpenAI's encoding_format=base64
        rows = np.ascontiguousarray(matrix, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]
    return matrix.astype(np.float32).tolist()


class SidecarAPI:
    """Routes, validation and answers for every sidecar endpoint."""

    def __init__(
        self,
        config: SidecarConfig,
        backends: Mapping[str, Backend],
        *,
        api_key: str | None = None,
        backend_timeout_s: float = 5.0,
    ) -> None:
        self.config = config
        self.backends = dict(backends)
        self.api_key = api_key or None
        self.backend_timeout_s = backend_timeout_s
        self.metrics = SidecarMetrics()
        self._infos: dict[str, dict[str, Any]] = {}
        self._routes = {
            ("GET", "/healthz"): self._healthz,
            ("GET", "/readyz"): self._readyz,
            ("GET", "/models"): self._models,
            ("GET", "/v1/models"): self._openai_models,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/openapi.json"): self._openapi,
            ("POST", "/embed"): self._embed,
            ("POST", "/v1/embeddings"): self._openai_embeddings,
            ("POST", "/text"): self._text,
            ("POST", "/image"): self._image,
            ("POST", "/rerank"): self._rerank,
            ("POST", "/tokenize"): self._tokenize,
        }

    @property
    def max_body_bytes(self) -> int:
        return self.config.limits.max_body_bytes

    async def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | SidecarApiError
    ) -> HttpResponse:
        """Answer one request. ``body`` is the raw body, or the error met while reading it (e.g. 413)."""
        path = "/" + path.strip("/") if path not in ("", "/") else "/"
        started = time.perf_counter()
        route = path if any(p == path for _, p in self._routes) else "other"
        model = "-"
        self.metrics.in_flight.inc()
        try:
            handler = self._routes.get((method.upper(), path))
            if handler is None:
                if route != "other":
                    raise MethodNotAllowed(f"{method} is not allowed on {path}")
                raise RouteNotFound(f"no route {path}")
            if path not in OPEN_ROUTES:
                self._authorize(headers)
            if isinstance(body, SidecarApiError):
                raise body
            if method.upper() == "POST":
                _check_media_type(headers)
                payload = self._parse(body)
                model = payload.get("model") if isinstance(payload.get("model"), str) else "-"
                response = await handler(payload)
            else:
                response = await handler()
        except SidecarApiError as exc:
            response = _error(exc)
        except Exception:  # a bug or a backend crash: coded 500, details in the log only
            log.exception("unhandled error on %s %s", method, path)
            response = _error(SidecarApiError("internal error", code=ErrorCode.INTERNAL_ERROR))
        finally:
            self.metrics.in_flight.dec()
        known = model if model in self.backends else "-"
        self.metrics.observe_request(route, known, response.status, time.perf_counter() - started)
        return response

    def _authorize(self, headers: Mapping[str, str]) -> None:
        if self.api_key is None:
            return
        value = _header(headers, "authorization")
        scheme, _, token = value.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            raise Unauthorized("missing or invalid API key (Authorization: Bearer <key>)")

    @staticmethod
    def _parse(body: bytes) -> dict[str, Any]:
        try:
            payload = loads_strict(body)
        except JsonRejected as exc:
            where = f"'{exc.field}': " if exc.field else ""
            raise BadRequest(where + exc.message, code=_JSON_CODES[exc.reason]) from None
        if not isinstance(payload, dict):
            raise BadRequest("body must be a JSON object", code=ErrorCode.INVALID_JSON)
        return payload

    def _backend(self, payload: Mapping[str, Any], kinds: Sequence[str]) -> tuple[str, Backend]:
        model = _field(payload, "model", str)
        if model not in self.backends:
            raise ModelNotFound(f"model {model!r} is not served (GET /models lists them)")
        spec = self.config.model(model)
        if spec.kind not in kinds:
            raise BadRequest(
                f"model {model!r} is a {spec.kind} model; this route needs {' or '.join(kinds)}",
                code=ErrorCode.WRONG_MODEL_KIND,
            )
        return model, self.backends[model]

    def _check_count(self, model: str, n: int) -> None:
        limit = self.config.model(model).max_client_batch
        if n > limit:
            raise PayloadTooLarge(
                f"{n} inputs; model {model!r} takes at most {limit} per request",
                code=ErrorCode.TOO_MANY_INPUTS,
            )

    async def _call(self, coro):
        """Await a backend call, turning anything that is not a coded error into a 500 model error."""
        try:
            return await coro
        except SidecarApiError:
            raise
        except Exception as exc:
            log.error("model call failed: %r", exc)
            raise ModelFailed(f"the model failed on this batch ({type(exc).__name__}); retry") from exc

    # -- GET routes ------------------------------------------------------------------------------

    async def _healthz(self) -> HttpResponse:
        return _json(200, {"status": "ok"})

    async def _ready_map(self) -> dict[str, bool]:
        async def one(backend: Backend) -> bool:
            try:
                return bool(await asyncio.wait_for(backend.is_ready(), self.backend_timeout_s))
            except Exception:
                return False

        results = await asyncio.gather(*(one(b) for b in self.backends.values()))
        return dict(zip(self.backends, results, strict=True))

    async def _readyz(self) -> HttpResponse:
        ready = await self._ready_map()
        if all(ready.values()):
            return _json(200, {"status": "ready", "models": ready})
        waiting = sorted(m for m, ok in ready.items() if not ok)
        error = NotReady(f"models not ready: {', '.join(waiting)}", retry_after=5)
        return _json(503, {**error.to_json(), "models": ready}, {"Retry-After": "5"})

    async def _info(self, model: str) -> dict[str, Any]:
        """The model's description, kept once it is ready (before its warm-up has run, what the
        warm-up measures, such as ``batch_overhead_tokens``, is still unknown: asked again later)."""
        if model in self._infos:
            return self._infos[model]
        backend = self.backends[model]
        try:
            info = await asyncio.wait_for(backend.info(), self.backend_timeout_s)
            ready = await asyncio.wait_for(backend.is_ready(), self.backend_timeout_s)
        except Exception as exc:
            raise NotReady(f"model {model!r} is not reachable yet", retry_after=5) from exc
        if ready:
            self._infos[model] = info
        return info

    async def _models(self) -> HttpResponse:
        infos = [await self._info(model) for model in self.backends]
        return _json(200, {"models": infos})

    async def _openai_models(self) -> HttpResponse:
        """The served models in OpenAI's list shape (the SDK's ``models.list()`` discovers them here)."""
        data = [
            {"id": model, "object": "model", "created": 0, "owned_by": "mnemo"} for model in self.backends
        ]
        return _json(200, {"object": "list", "data": data})

    async def _openapi(self) -> HttpResponse:
        """This document: an OpenAPI 3.1 description of every route, from the route table itself."""
        from .openapi import build_spec

        return _json(200, build_spec(self._routes, OPEN_ROUTES))

    async def _metrics(self) -> HttpResponse:
        async def one(model: str, backend: Backend) -> tuple[str, dict[str, Any] | None]:
            try:
                return model, await asyncio.wait_for(backend.stats(), self.backend_timeout_s)
            except Exception:
                return model, None

        stats = await asyncio.gather(*(one(m, b) for m, b in self.backends.items()))
        coalescing = {m: c for m, b in self.backends.items() if (c := b.coalescing()) is not None}
        body, content_type = self.metrics.render({m: s for m, s in stats if s is not None}, coalescing)
        return HttpResponse(200, body, content_type=content_type)

    # -- POST routes -----------------------------------------------------------------------------

    async def _embed(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("text",))
        texts = _strings(payload, "input")
        self._check_count(model, len(texts))
        truncate = _field(payload, "truncate", bool, False)
        sparse = _field(payload, "return_sparse", bool, False)
        encoding = self._encoding(payload)
        out = await self._call(backend.embed(texts, truncate=truncate, return_sparse=sparse))
        self.metrics.observe_items(model, "texts", len(texts), out["tokens"])
        answer: dict[str, Any] = {
            "embeddings": _encode_vectors(out["dense"], encoding),
            "model": model,
            "dimension": int(out["dense"].shape[1]),
            "usage": {"tokens": out["tokens"]},
        }
        if sparse:
            _finite([w for row in out["sparse"] for w in row.values()], "sparse weights")
            answer["sparse"] = [{str(k): v for k, v in row.items()} for row in out["sparse"]]
        return _json(200, answer)

    async def _openai_embeddings(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("text",))
        texts = _strings(payload, "input")
        self._check_count(model, len(texts))
        encoding = self._encoding(payload)
        out = await self._call(backend.embed(texts, truncate=False, return_sparse=False))
        dimensions = _field(payload, "dimensions", int, None)
        if dimensions is not None and dimensions != out["dense"].shape[1]:
            raise BadRequest(
                f"model {model!r} has {out['dense'].shape[1]} dimensions; 'dimensions' cannot change that",
                code=ErrorCode.UNSUPPORTED_DIMENSIONS,
            )
        self.metrics.observe_items(model, "texts", len(texts), out["tokens"])
        vectors = _encode_vectors(out["dense"], encoding)
        return _json(
            200,
            {
                "object": "list",
                "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
                "model": model,
                "usage": {"prompt_tokens": out["tokens"], "total_tokens": out["tokens"]},
            },
        )

    async def _text(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("image_text",))
        texts = _strings(payload, "input")
        self._check_count(model, len(texts))
        truncate = _field(payload, "truncate", bool, False)
        encoding = self._encoding(payload)
        out = await self._call(backend.embed_texts(texts, truncate=truncate))
        self.metrics.observe_items(model, "texts", len(texts), out["tokens"])
        return _json(
            200,
            {
                "embeddings": _encode_vectors(out["dense"], encoding),
                "model": model,
                "dimension": int(out["dense"].shape[1]),
                "usage": {"tokens": out["tokens"]},
            },
        )

    async def _image(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("image_text",))
        images = payload.get("images")
        if images is None:
            raise BadRequest("'images' is required", code=ErrorCode.MISSING_FIELD)
        if not isinstance(images, list):
            raise BadRequest("'images' must be a list of base64 strings", code=ErrorCode.INVALID_TYPE)
        if not images:
            raise BadRequest("'images' is empty", code=ErrorCode.EMPTY_INPUT)
        self._check_count(model, len(images))
        encoding = self._encoding(payload)
        limit = self.config.limits.max_image_bytes
        raw = [decode_base64(data, i, limit) for i, data in enumerate(images)]
        out = await self._call(backend.embed_images(raw))
        self.metrics.observe_items(model, "images", len(raw), 0)
        return _json(
            200,
            {
                "embeddings": _encode_vectors(out["dense"], encoding),
                "model": model,
                "dimension": int(out["dense"].shape[1]),
            },
        )

    async def _rerank(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("rerank",))
        query = _field(payload, "query", str)
        documents = _strings(payload, "documents")
        self._check_count(model, len(documents))
        truncate = _field(payload, "truncate", bool, True)
        raw_scores = _field(payload, "raw_scores", bool, False)
        out = await self._call(backend.rerank(query, documents, truncate=truncate, raw_scores=raw_scores))
        self.metrics.observe_items(model, "pairs", len(documents), out["tokens"])
        _finite(out["scores"], "scores")
        return _json(200, {"scores": out["scores"], "model": model, "usage": {"tokens": out["tokens"]}})

    async def _tokenize(self, payload: dict[str, Any]) -> HttpResponse:
        model, backend = self._backend(payload, ("text", "image_text", "rerank"))
        texts = _strings(payload, "input")
        self._check_count(model, len(texts))
        counts = await self._call(backend.tokenize(texts))
        return _json(200, {"tokens": counts, "model": model})

    @staticmethod
    def _encoding(payload: Mapping[str, Any]) -> str:
        encoding = _field(payload, "encoding_format", str, "float")
        if encoding not in ("float", "base64"):
            raise BadRequest(
                "'encoding_format' must be 'float' or 'base64'", code=ErrorCode.INVALID_ENCODING_FORMAT
            )
        return encoding
