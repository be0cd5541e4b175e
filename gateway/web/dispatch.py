"""``POST /api/v1/json``: the dd_rag_api dispatcher.

Order of checks, each a coded error: the body is a JSON object; ``dd_api`` is
``dd_rag_api``; ``action`` is registered; ``options`` is an object; the caller
is authenticated (every action needs a session); the kill switches
(``RAG_ENABLED``, then ``RAG_MEDIA_ENABLED`` for image actions); then the
action validates its own options; a metered action then passes its grant, the
per-principal limiter and its budget reservations (:mod:`gateway.budgets.ledger`); then it runs.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.access.auth import authenticate
from gateway.actions.context import action_context
from gateway.actions.specs import ACTIONS, admit, handle
from gateway.base.body import read_json
from gateway.base.errors import ApiError, envelope_ok
from gateway.base.resources import ACTION_KEY, SETTINGS_KEY
from gateway.budgets.ledger import metered

API_NAME = "dd_rag_api"


async def _read_body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError.invalid_request("The request body must be a JSON object")
    return body


async def json_api(request: web.Request) -> web.StreamResponse:
    """Dispatch one dd_rag_api call and answer with the v2 envelope."""
    body = await _read_body(request)
    if body.get("dd_api") != API_NAME:
        raise ApiError("request.unknown_api", f"Unknown dd_api (this service serves {API_NAME!r})")
    action = body.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise ApiError("request.unknown_action")
    request[ACTION_KEY] = action
    options = body.get("options", {})
    if not isinstance(options, dict):
        raise ApiError.invalid_options("options must be an object")
    principal = authenticate(request)
    off = admit(request.app[SETTINGS_KEY], action)
    if off is not None:
        return envelope_ok(request, off[1], off[0])
    spec = ACTIONS[action]
    args = spec.read(options)
    ctx = action_context(request.app, principal)
    async with metered(ctx.metering, spec.meters) as metering:
        if spec.stream is not None and args.get("stream"):  # server-sent events instead of one body
            return await spec.stream(request, ctx, args)
        msg, data = await handle(spec, ctx, args)
    response = envelope_ok(request, data, msg)
    if metering is not None:
        response.headers.update(metering.headers())
    return response
