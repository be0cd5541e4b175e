"""The budgets' admin routes (``GET /v1/budgets``, ``POST /v1/budgets/limit``, ``POST /v1/budgets/reset``):
what the console's operations page and scripts read and change, admins only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.access.auth import require_admin
from gateway.base.body import read_json
from gateway.base.budget_settings import METERS
from gateway.base.errors import ApiError, envelope_ok
from gateway.budgets import admin as budget_admin
from gateway.budgets.ledger import BUDGETS_KEY

__all__ = ["setup_budget_routes"]


async def budgets_show(request: web.Request) -> web.Response:
    """The current window's use per principal and meter (``?principal=`` for one), with the limits."""
    require_admin(request)
    budgets = request.app[BUDGETS_KEY]
    principal = request.query.get("principal") or None
    rows = await budget_admin.show(budgets.ledger, principal)
    return envelope_ok(
        request,
        {
            "window_s": budgets.settings.window,
            "enabled": budgets.settings.enabled,
            "meters": list(METERS),
            "limits": [
                {"role": role, "meter": meter, "limit": limit}
                for (role, meter), limit in sorted(budgets.ledger.role_limits.items())
            ],
            "rows": [r.as_dict() for r in rows],
        },
    )


async def budgets_limit(request: web.Request) -> web.Response:
    """``{"principal", "meter", "limit": N | null}`` sets that principal's own limit (null: unlimited);
    ``{"principal", "meter", "default": true}`` drops it (its role's limit applies again)."""
    require_admin(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError.invalid_request("the body must be an object")
    principal, meter = _text(body, "principal"), _text(body, "meter")
    ledger = request.app[BUDGETS_KEY].ledger
    if body.get("default") is True:
        return envelope_ok(request, {"cleared": await budget_admin.clear_limit(ledger, principal, meter)})
    if "limit" not in body:
        raise ApiError.invalid_options('limit: give a number, null (unlimited) or "default": true')
    limit = body["limit"]
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        raise ApiError.invalid_options("limit: an integer >= 0, or null for unlimited")
    await budget_admin.set_limit(ledger, principal, meter, limit)
    return envelope_ok(request, {"principal": principal, "meter": meter, "limit": limit})


async def budgets_reset(request: web.Request) -> web.Response:
    """``{"principal", "meter"?}``: zero that principal's use of the current window."""
    require_admin(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError.invalid_request("the body must be an object")
    meter = body.get("meter")
    reset = await budget_admin.reset(
        request.app[BUDGETS_KEY].ledger,
        _text(body, "principal"),
        None if meter is None else _text(body, "meter"),
    )
    return envelope_ok(request, {"reset": reset})


def _text(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise ApiError.invalid_options(f"{name}: a string")
    return value


def setup_budget_routes(app: web.Application) -> None:
    """The admin-only budget routes under ``/v1/budgets``."""
    app.router.add_get("/v1/budgets", budgets_show)
    app.router.add_post("/v1/budgets/limit", budgets_limit)
    app.router.add_post("/v1/budgets/reset", budgets_reset)
