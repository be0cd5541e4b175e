"""The sidecar API on a plain aiohttp server: the front ``mnemo sidecar`` listens with, and a Ray-free server.

Two uses of one :func:`create_app`:

- **The sidecar's HTTP front.** :func:`start_front` runs inside the Serve ingress replica
  (:class:`inference.serve_app.Ingress`), so a request reaches the model replicas with no Serve HTTP
  proxy in between: one process parses HTTP and bundles ``/embed`` calls, where the proxy path
  costs two processes and two hops per request (``mnemo bench --full --suite sidecar``, 2 cores:
  0.80 of infinity-emb's 1-item throughput at concurrency 16 through the proxy, 1.08 with this front).
- **In-process** (``ModelService`` through :class:`~inference.backends.LocalBackend`): for machines where
  Ray is not wanted and for tests that need to hold a model in a given state.

Slow clients: aiohttp's keep-alive timer runs from the moment a connection opens and again after each
answer, and closes a connection that has not sent a complete request head by then, so
``keep_alive_timeout_s`` bounds an idle connection and a client sending its headers byte by byte
alike. ``request_timeout_s`` bounds the rest: body upload and answer (408 ``request_timeout``).
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from .api import SidecarAPI, read_body
from .errors import BadRequest, ErrorCode, PayloadTooLarge, RequestTimeout, SidecarApiError
from .eventloop import loop_name
from .http_protocol import JsonProtocolErrors, ProtocolRunner
from .json_out import dumps

__all__ = ["create_app", "start_front"]

log = logging.getLogger(__name__)


def create_app(api: SidecarAPI, *, request_timeout_s: float | None = None) -> web.Application:
    """An aiohttp application answering every path through ``api``."""

    async def answer(request: web.Request) -> web.Response:
        body: bytes | SidecarApiError
        try:
            body = await read_body(
                request.content.iter_any(), request.headers.get("Content-Length"), api.max_body_bytes
            )
        except SidecarApiError as exc:
            body = exc
        return await answer_with(request, body)

    async def answer_with(request: web.Request, body: bytes | SidecarApiError) -> web.Response:
        reply = await api.handle(request.method, request.path, request.headers, body)
        headers = {"Content-Type": reply.content_type, **reply.headers}
        return web.Response(body=reply.body, status=reply.status, headers=headers)

    async def dispatch(request: web.Request) -> web.Response:
        if request_timeout_s is None:
            return await answer(request)
        try:
            async with asyncio.timeout(request_timeout_s):
                return await answer(request)
        except TimeoutError:
            late = RequestTimeout(f"request took longer than {request_timeout_s:g} s (body upload included)")
            # Answered like a body that failed to read (metrics, auth, envelope), and the connection
            # closed: the body may be half read, so it cannot carry another request.
            response = await answer_with(request, late)
            response.force_close()
            return response

    # aiohttp's own body limit would answer 413 in plain text before the API sees the request.
    app = web.Application(client_max_size=api.max_body_bytes + 1)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


async def start_front(
    api: SidecarAPI,
    *,
    host: str,
    port: int,
    request_timeout_s: float,
    keep_alive_timeout_s: float,
) -> web.AppRunner:
    """Listen on ``host:port`` with ``api`` on the running event loop; ``await runner.cleanup()`` stops it."""
    runner = _FrontRunner(
        create_app(api, request_timeout_s=request_timeout_s),
        access_log=None,  # the API's metrics count requests; a log line per request costs a core
        keepalive_timeout=keep_alive_timeout_s,
        # After an early answer (413, 408) aiohttp drains the unread body this long so the client
        # reads the answer instead of a reset; its 10 s default would hand a slow body that much more.
        lingering_time=2.0,
        # A compressed body is refused (415) by the API; aiohttp's decoder would first fail on it
        # with a plain-text 500.
        auto_decompress=False,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError:
        await runner.cleanup()
        raise
    # Ray picks a worker's loop at its start (RAY_USE_UVLOOP, which the launcher sets from RAG_UVLOOP).
    log.info("sidecar front listening on http://%s:%s (event loop: %s)", host, port, loop_name())
    return runner


class _JsonErrorProtocol(JsonProtocolErrors):
    """Protocol errors in the sidecar's error envelope, instead of aiohttp's plain text."""

    def protocol_error_response(self, status: int, reason: str | None) -> web.Response:
        error: SidecarApiError
        if reason is None:
            error = SidecarApiError("internal error")
        else:
            text = f"malformed HTTP request ({status}: {reason})"
            kind = {408: RequestTimeout, 413: PayloadTooLarge}.get(status, BadRequest)
            error = kind(text, code=ErrorCode.BAD_HTTP_REQUEST if kind is BadRequest else None)
        return web.Response(status=error.status, body=dumps(error.to_json()), content_type="application/json")


class _FrontRunner(ProtocolRunner):
    """``web.AppRunner`` whose connections answer protocol errors in the sidecar's envelope."""

    protocol = _JsonErrorProtocol
