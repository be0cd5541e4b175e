"""``GET /openapi.json``: an OpenAPI 3.1 description of every route the app serves.

Built from the router at request time, so a route added anywhere (intake
included) is described: its summary is the handler's docstring. The dd_rag_api
endpoint gets full schemas: the request per action (generated from its
declaration in :mod:`gateway.actions.specs`), both envelopes, the codes.
"""

from __future__ import annotations

import inspect
from typing import Any

from aiohttp import web

from gateway.actions.specs import ACTIONS
from gateway.base.errors import ERRORS, json_response
from gateway.web import embeddings
from index.ingest.intake import RECORD_SCHEMA

_HIT = {
    "type": "object",
    "properties": {
        "section_tipo": {"type": "string"},
        "section_id": {"type": "integer"},
        "component_tipo": {"type": "string"},
        "lang": {"type": "string"},
        "snippet": {"type": "string"},
        "score": {"type": "number"},
        "similarity": {"type": ["number", "null"], "description": "similar_to only"},
    },
}
_PASSAGE = {
    "allOf": [
        _HIT,
        {
            "type": "object",
            "properties": {
                "chunk_index": {"type": "integer"},
                "text": {"type": "string"},
                "title": {"type": ["string", "null"]},
                "heading_path": {"type": "array", "items": {"type": "string"}},
                "page": {"type": ["integer", "string", "null"]},
                "tc_in": {"type": ["string", "number", "null"]},
                "tc_out": {"type": ["string", "number", "null"]},
                "group": {"type": ["string", "null"]},
                "parent_key": {"type": ["string", "null"]},
            },
        },
    ]
}
_ERROR_ENVELOPE = {
    "type": "object",
    "required": ["ok", "request_id", "error"],
    "properties": {
        "ok": {"const": False},
        "request_id": {"type": "string"},
        "error": {
            "type": "object",
            "required": ["code", "category", "message", "label_key", "retryable"],
            "properties": {
                "code": {"type": "string", "enum": sorted(ERRORS)},
                "category": {"type": "string"},
                "message": {"type": "string"},
                "label_key": {"type": "string"},
                "retryable": {"type": "boolean"},
                # budget_exhausted and rate_limited (gateway.budgets.ledger): the wait, and what was spent
                "retry_after": {"type": "integer"},
                "meter": {"type": "string"},
                "used": {"type": "integer"},
                "limit": {"type": ["integer", "null"]},
                "reset_at": {"type": "string", "format": "date-time"},
            },
        },
    },
}
_OK_ENVELOPE = {
    "type": "object",
    "required": ["ok", "request_id", "msg", "data"],
    "properties": {
        "ok": {"const": True},
        "request_id": {"type": "string"},
        "msg": {"type": "string", "examples": ["ok", "agent_context", "no_grounded_context"]},
        "data": {
            "oneOf": [
                {"type": "array", "items": _PASSAGE},
                {"type": "object", "properties": {"groups": {"type": "array", "items": {"type": "string"}}}},
                {"type": "object"},
            ]
        },
    },
}


def _json_api_operation() -> dict[str, Any]:
    variants = [
        {
            "type": "object",
            "title": action,
            "description": spec.summary,
            "required": ["dd_api", "action"],
            "properties": {
                "dd_api": {"const": "dd_rag_api"},
                "action": {"const": action},
                "options": spec.json_schema(),
            },
        }
        for action, spec in ACTIONS.items()
    ]
    errors = sorted({spec.status for spec in ERRORS.values()})
    return {
        "summary": "dd_rag_api dispatch: semantic search, passages, similar records, embed groups.",
        "security": [{"bearer": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"oneOf": variants}}}},
        "responses": {
            "200": {"description": "success", "content": {"application/json": {"schema": _OK_ENVELOPE}}},
            **{
                str(status): _error_response([c for c, s in sorted(ERRORS.items()) if s.status == status])
                for status in errors
            },
        },
    }


# Request bodies of the intake routes (the dispatch endpoint's is built per action above): without
# them a client generated from this document, or the reliability fuzzer, sends no body at all.
_REQUEST_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/records", "post"): {
        "oneOf": [RECORD_SCHEMA, {"type": "array", "items": RECORD_SCHEMA, "minItems": 1}]
    },
    ("/v1/sections/{section_tipo}", "put"): {"type": "object", "description": "the section's descriptor"},
    ("/v1/queue/retry", "post"): {"type": "object"},
    ("/v1/budgets/limit", "post"): {
        "type": "object",
        "required": ["principal", "meter"],
        "properties": {
            "principal": {"type": "string"},
            "meter": {"type": "string"},
            "limit": {"type": ["integer", "null"], "minimum": 0},
            "default": {"type": "boolean"},
        },
    },
    ("/v1/budgets/reset", "post"): {
        "type": "object",
        "required": ["principal"],
        "properties": {"principal": {"type": "string"}, "meter": {"type": "string"}},
    },
    ("/v1/sections/{section_tipo}/reconcile", "post"): {"type": "object"},
    ("/v1/embeddings", "post"): embeddings.REQUEST_SCHEMA,
}
# Routes whose success is not the v2 envelope: OpenAI's shape, for OpenAI-compatible clients.
_SUCCESS_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/embeddings", "post"): embeddings.RESPONSE_SCHEMA,
    ("/v1/models", "get"): embeddings.MODELS_SCHEMA,
}


# The 5xx codes every route may answer (it is stopping; the database did not answer; an unexpected
# failure), and those some add.
_ANY_ROUTE_5XX = ("internal", "service.stopping", "service.unavailable")
_ROUTE_5XX: dict[tuple[str, str], tuple[str, ...]] = {
    ("/readyz", "get"): ("service.unavailable",),
    ("/v1/embeddings", "post"): ("rag.embedding_unavailable",),
    ("/v1/models", "get"): ("rag.embedding_unavailable",),
}


def _error_response(codes: list[str]) -> dict[str, Any]:
    """A documented error status: its codes, readable and as ``x-error-codes`` for tools (the fuzzer)."""
    return {**_json_content(", ".join(codes), _ERROR_ENVELOPE), "x-error-codes": codes}


def _json_content(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _server_errors(path: str, method: str) -> dict[str, Any]:
    codes = sorted({*_ANY_ROUTE_5XX, *_ROUTE_5XX.get((path, method), ())})
    statuses = sorted({ERRORS[c].status for c in codes})
    return {str(s): _error_response([c for c in codes if ERRORS[c].status == s]) for s in statuses}


def _summary(handler: Any) -> str:
    doc = inspect.getdoc(handler) or ""
    return doc.strip().splitlines()[0] if doc.strip() else handler.__name__.replace("_", " ")


def build_spec(app: web.Application) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for route in app.router.routes():
        if route.method == "HEAD" or route.resource is None:
            continue
        path = route.resource.canonical
        method = route.method.lower()
        if path == "/api/v1/json" and method == "post":
            operation = _json_api_operation()
        else:
            success = _SUCCESS_BODIES.get((path, method))
            default = _ERROR_ENVELOPE if success else {"oneOf": [_OK_ENVELOPE, _ERROR_ENVELOPE]}
            operation = {
                "summary": _summary(route.handler),
                "responses": {
                    **({} if success is None else {"200": _json_content("success", success)}),
                    **_server_errors(path, method),
                    "default": _json_content("v2 envelope", default),
                },
            }
            body = _REQUEST_BODIES.get((path, method))
            if body is not None:
                operation["requestBody"] = {"content": {"application/json": {"schema": body}}}
            params = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
            if params:
                operation["parameters"] = [
                    {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
                ]
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Mnemo gateway",
            "version": "1",
            "description": "dd_rag_api over hybrid retrieval.",
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}
        },
        # Every route accepts the bearer token (the open ones ignore it): /docs' "try it" sends it.
        "security": [{"bearer": []}],
    }


async def openapi(request: web.Request) -> web.Response:
    """This document: an OpenAPI 3.1 description of every route."""
    return json_response(request, build_spec(request.app))
