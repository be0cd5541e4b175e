"""The outermost middleware: request-id context for logs, one access-log line, request metrics."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from gateway.base.errors import CLIENT_ABORT, CLIENT_CLOSED_STATUS, Handler, request_id
from gateway.base.logs import REQUEST_ID
from gateway.base.resources import ACTION_KEY, ERROR_CODE_KEY, METRICS_KEY

access_log = logging.getLogger("gateway.access")


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def observe_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = request_id(request)
    token = REQUEST_ID.set(rid)
    start = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except asyncio.CancelledError:
        # aiohttp cancels the handler when the client disconnects (handler_cancellation): the work
        # stopped because nobody waits for it; this is not an internal error.
        status = CLIENT_CLOSED_STATUS
        request[ERROR_CODE_KEY] = CLIENT_ABORT
        raise
    finally:
        elapsed = time.perf_counter() - start
        action = request.get(ACTION_KEY) or _route_name(request)
        outcome = request.get(ERROR_CODE_KEY) or ("ok" if status < 400 else f"http_{status}")
        metrics = request.app.get(METRICS_KEY)
        if metrics is not None:
            metrics.observe_request(action, outcome, elapsed)
        access_log.info(
            "%s %s %s",
            request.method,
            request.path,
            status,
            extra={
                "method": request.method,
                "path": request.path,
                "status": status,
                "action": action,
                "outcome": outcome,
                "ms": round(elapsed * 1000, 2),
            },
        )
        REQUEST_ID.reset(token)
