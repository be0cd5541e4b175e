"""``GET /openapi.json`` for the sidecar: an OpenAPI 3.1 description built from its route declarations.

Every route of :data:`inference.routes.ROUTES` (or the table an API was built with) is listed, its
request schema generated from the same :class:`~inference.contract.Field` declarations that validate
the body, so the document cannot drift from what the sidecar accepts, and the reliability fuzzer
(``benchmarks/fuzz.py``) reaches every route. Every error answer is ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .contract import Route
from .errors import ErrorCode
from .routes import READYZ

__all__ = ["ERROR_SCHEMA", "build_spec"]

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "enum": [code.value for code in ErrorCode]},
                "message": {"type": "string"},
            },
        }
    },
}


def _operation(route: Route) -> dict[str, Any]:
    json_error = {"description": "coded error", "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    post = route.method == "POST"
    responses: dict[str, Any] = {"200": {"description": "success"}}
    if post or route.path == READYZ.path:  # a model still loading or unreachable (NotReady)
        responses["503"] = {**json_error, "description": "not_ready", "x-error-codes": ["not_ready"]}
    if post:  # a model failing on an input (ModelFailed): documented, still a server error
        responses["500"] = {**json_error, "description": "model_error", "x-error-codes": ["model_error"]}
    operation: dict[str, Any] = {"summary": route.summary, "responses": {**responses, "default": json_error}}
    if not route.open:
        operation["security"] = [{"bearer": []}]
    if post:
        content = {"application/json": {"schema": route.request_schema()}}
        operation["requestBody"] = {"required": True, "content": content}
    return operation


def build_spec(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI document for ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in sorted(routes, key=lambda r: (r.path, r.method)):
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Mnemo inference sidecar", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
