"""The sidecar API on a plain aiohttp server, without Ray: one process, models in-process.

For machines where Ray is not wanted (a bare CUDA box running the in-process benchmark, a debugging
session) and for tests that need to hold a model in a given state (not yet warm, queue full).
Same :class:`~inference.api.SidecarAPI`, same contract, same errors as the Serve ingress.
"""

from __future__ import annotations

from aiohttp import web

from .api import SidecarAPI, read_body
from .errors import SidecarApiError

__all__ = ["create_app"]


def create_app(api: SidecarAPI) -> web.Application:
    """An aiohttp application answering every path through ``api``."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        body: bytes | SidecarApiError
        try:
            body = await read_body(
                request.content.iter_any(), request.headers.get("Content-Length"), api.max_body_bytes
            )
        except SidecarApiError as exc:
            body = exc
        answer = await api.handle(request.method, request.path, request.headers, body)
        headers = {"Content-Type": answer.content_type, **answer.headers}
        return web.Response(body=answer.body, status=answer.status, headers=headers)

    # aiohttp's own body limit would answer 413 in plain text before the API sees the request.
    app = web.Application(client_max_size=api.max_body_bytes + 1)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app
