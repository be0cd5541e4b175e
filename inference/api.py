"""The sidecar's HTTP contract, Ray-free: route a request, check its headers and body, answer it.

:class:`SidecarAPI` maps ``(method, path, headers, body)`` to an :class:`HttpResponse`. Servers wrap it:
the Ray Serve ingress (``inference.serve_app``) and a plain aiohttp app (``inference.local_server``) for
in-process use. The routes and their request fields are declared once, in :mod:`inference.routes`:
the validation here, the OpenAPI document and the client's requests all come from there; what each
route does is :data:`inference.handlers.HANDLERS`. Every failure is a
:class:`~inference.errors.SidecarApiError` answered as ``{"error": {"code", "message"}}`` with its
status, never a raw exception string.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any

from .backends import Backend, LocalBackend
from .config import SidecarConfig
from .contract import Args, Route
from .errors import (
    BadRequest,
    ErrorCode,
    MethodNotAllowed,
    ModelFailed,
    NotReady,
    PayloadTooLarge,
    RouteNotFound,
    SidecarApiError,
    Unauthorized,
    UnsupportedMediaType,
)
from .handlers import HANDLERS, Handler
from .metrics import SidecarMetrics
from .responses import HttpResponse, error_response
from .routes import OPEN_ROUTES, ROUTES
from .strict_json import JsonRejected, loads_strict

# Backend, LocalBackend, HttpResponse and OPEN_ROUTES are defined in their own modules; named here
# too because the servers, tests and benchmarks build the API from this one.
__all__ = ["OPEN_ROUTES", "Backend", "HttpResponse", "LocalBackend", "SidecarAPI", "read_body"]

log = logging.getLogger(__name__)


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


class SidecarAPI:
    """Routing, authorization and request checks for every sidecar endpoint of ``routes``."""

    def __init__(
        self,
        config: SidecarConfig,
        backends: Mapping[str, Backend],
        *,
        api_key: str | None = None,
        backend_timeout_s: float = 5.0,
        routes: Sequence[Route] = ROUTES,
        handlers: Mapping[tuple[str, str], Handler] = HANDLERS,
    ) -> None:
        self.config = config
        self.backends = dict(backends)
        self.api_key = api_key or None
        self.backend_timeout_s = backend_timeout_s
        self.metrics = SidecarMetrics()
        self._infos: dict[str, dict[str, Any]] = {}
        self._routes = {(route.method, route.path): route for route in routes}
        if len(self._routes) != len(routes):
            raise ValueError("a (method, path) is declared twice in the route table")
        unhandled = [f"{method} {path}" for method, path in self._routes if (method, path) not in handlers]
        if unhandled:
            raise ValueError(f"no handler for {', '.join(unhandled)}")
        self._handlers = {key: handlers[key] for key in self._routes}

    @property
    def routes(self) -> Sequence[Route]:
        """The declarations this API serves (``GET /openapi.json`` describes exactly these)."""
        return tuple(self._routes.values())

    @property
    def max_body_bytes(self) -> int:
        return self.config.limits.max_body_bytes

    async def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | SidecarApiError
    ) -> HttpResponse:
        """Answer one request. ``body`` is the raw body, or the error met while reading it (e.g. 413)."""
        path = "/" + path.strip("/") if path not in ("", "/") else "/"
        started = time.perf_counter()
        label = path if any(p == path for _, p in self._routes) else "other"
        model = "-"
        self.metrics.in_flight.inc()
        try:
            route = self._routes.get((method.upper(), path))
            if route is None:
                if label != "other":
                    raise MethodNotAllowed(f"{method} is not allowed on {path}")
                raise RouteNotFound(f"no route {path}")
            if not route.open:
                self._authorize(headers)
            if isinstance(body, SidecarApiError):
                raise body
            args: Args = {}
            if route.method == "POST":
                _check_media_type(headers)
                payload = self._parse(body)
                model = payload.get("model") if isinstance(payload.get("model"), str) else "-"
                args = route.read(payload, self.config, self.backends)
            response = await self._handlers[(route.method, route.path)](self, args)
        except SidecarApiError as exc:
            response = error_response(exc)
        except Exception:  # a bug or a backend crash: coded 500, details in the log only
            log.exception("unhandled error on %s %s", method, path)
            response = error_response(SidecarApiError("internal error", code=ErrorCode.INTERNAL_ERROR))
        finally:
            self.metrics.in_flight.dec()
        known = model if model in self.backends else "-"
        self.metrics.observe_request(label, known, response.status, time.perf_counter() - started)
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

    # -- what handlers use (inference.handlers.Sidecar) ------------------------------------------

    async def call(self, coro: Awaitable[Any]) -> Any:
        """Await a backend call, turning anything that is not a coded error into a 500 model error."""
        try:
            return await coro
        except SidecarApiError:
            raise
        except Exception as exc:
            log.error("model call failed: %r", exc)
            raise ModelFailed(f"the model failed on this batch ({type(exc).__name__}); retry") from exc

    async def ready_map(self) -> dict[str, bool]:
        """Model -> ready, each asked within ``backend_timeout_s`` (no answer reads as not ready)."""

        async def one(backend: Backend) -> bool:
            try:
                return bool(await asyncio.wait_for(backend.is_ready(), self.backend_timeout_s))
            except Exception:
                return False

        results = await asyncio.gather(*(one(b) for b in self.backends.values()))
        return dict(zip(self.backends, results, strict=True))

    async def info(self, model: str) -> dict[str, Any]:
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
