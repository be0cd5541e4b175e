"""The gateway's HTTP server settings against hostile clients: timeouts, cancellation, a concurrency bound.

- **Slow or idle connections.** aiohttp's keep-alive timer starts when a
  connection opens and again after each response, and closes the connection
  when no complete request head has arrived by then. ``RAG_GATEWAY_IDLE_TIMEOUT``
  sets it, so it bounds both an idle keep-alive connection and a client that
  sends its request line and headers one byte at a time (aiohttp has no
  separate header timeout). The body has its own deadline in
  :func:`gateway.body.read_json` (``RAG_GATEWAY_BODY_TIMEOUT``).
- **Clients that hang up.** :class:`GatewayRunner` turns on aiohttp's handler
  cancellation: when the connection drops, the handler task is cancelled, so a
  pending sidecar call or query stops instead of running for nobody. The
  access log records it as ``client_abort`` (:mod:`gateway.observe`).
- **Protocol errors.** A request aiohttp cannot parse (a header line over the
  limit, a malformed request line) is answered in envelope v2 like every
  other failure, not aiohttp's plain text.
- **Load.** :func:`concurrency_middleware` answers 429 ``service.overloaded``
  with ``Retry-After`` beyond ``RAG_GATEWAY_MAX_CONCURRENCY`` requests in
  flight, rather than queueing without bound.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from .errors import REQUEST_ID_HEADER, ApiError, Handler
from .settings import GatewaySettings

__all__ = ["UNBOUNDED_PATHS", "GatewayRunner", "concurrency_middleware", "handler_args"]

log = logging.getLogger(__name__)

# Probes and scrapes must answer while the gateway is saturated: they are never refused.
UNBOUNDED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def handler_args(settings: GatewaySettings) -> dict[str, Any]:
    """Per-connection options (``web.Application(handler_args=...)``)."""
    return {
        "keepalive_timeout": settings.idle_timeout,
        # After an answer sent before the body was read (a 408, 413 or 415), aiohttp reads and drops the
        # rest for up to this long so the client sees the answer, not a reset; 10 s by default would
        # hand a slow-loris body that much more time.
        "lingering_time": min(2.0, settings.body_timeout),
        # The body reader inflates gzip itself, within the byte limit and with a coded error;
        # aiohttp's decoder would drop the connection on a body that is not gzip.
        "auto_decompress": False,
    }


class _EnvelopeProtocol(RequestHandler):
    """aiohttp's connection handler, answering its own protocol errors in envelope v2."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # a response already started: nothing sensible to send
            raise ConnectionError("response already sent; cannot send an error")
        if status >= 500:
            self.log_exception("error handling request from %s", request.remote, exc_info=exc)
            error = ApiError.internal()
        else:  # the client's bytes are at fault: one line, no traceback
            log.warning("malformed request from %s: %s", request.remote, message or exc)
            code = {413: "request.payload_too_large", 408: "request.timeout"}.get(
                status, "request.invalid_request"
            )
            error = ApiError(code, f"The HTTP request is malformed ({status}: {_reason(exc, message)})")
        rid = uuid.uuid4().hex
        body = json.dumps(error.body(rid), separators=(",", ":"))
        response = web.Response(status=error.status, text=body, content_type="application/json")
        response.headers[REQUEST_ID_HEADER] = rid
        response.force_close()
        return response


def _reason(exc: BaseException | None, message: str | None) -> str:
    """A short reason for a parse failure; aiohttp's messages quote the client's bytes, so cut them."""
    text = getattr(exc, "message", None) or message or type(exc).__name__
    text = str(text).splitlines()[0] if str(text) else "bad request"
    return text[:120]


class _EnvelopeServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _EnvelopeProtocol(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` with handler cancellation on and envelope-v2 protocol errors.

    Serve the gateway with it (``serve()`` and the test fixture do), not a bare ``AppRunner``.
    """

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("handler_cancellation", True)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()
        # Same handler, factory and options; only the per-connection protocol class differs.
        return _EnvelopeServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **base._kwargs,
        )


def concurrency_middleware(limit: int) -> Any:
    """Refuse (429) beyond ``limit`` requests in flight, probes and metrics excepted."""
    in_flight = 0

    @web.middleware
    async def bound(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal in_flight
        if request.path in UNBOUNDED_PATHS:
            return await handler(request)
        if in_flight >= limit:
            raise ApiError("service.overloaded", f"More than {limit} requests in flight; retry shortly")
        in_flight += 1
        try:
            return await handler(request)
        finally:
            in_flight -= 1

    return bound
