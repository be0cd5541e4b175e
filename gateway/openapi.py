"""``GET /openapi.json``: an OpenAPI 3.1 description of every route the app serves.

Built from the router at request time, so a route added anywhere (intake
included) is described: its summary is the handler's docstring. The dd_rag_api
endpoint gets full schemas: the request per action, both envelopes, the codes.
"""

from __future__ import annotations

import inspect
from typing import Any

from aiohttp import web

from index.intake import RECORD_SCHEMA

from .actions import ACTIONS
from .errors import ERRORS, json_response

_STRING_OR_LIST = {
    "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
}
_LIMIT = {"type": "integer", "description": "clamped to [1, 50]", "default": 10}
_GROUP = {"type": "string", "description": "embed-group id (slug)"}
_QUERY_OPTIONS = {
    "type": "object",
    "required": ["query"],
    "properties": {
        "query": {"type": "string"},
        "section_tipo": _STRING_OR_LIST,
        "limit": _LIMIT,
        "group": _GROUP,
    },
}
_SEED_OPTIONS = {
    "type": "object",
    "required": ["section_tipo", "section_id"],
    "properties": {
        "section_tipo": {"type": "string"},
        "section_id": {"type": "integer", "minimum": 0},
        "limit": _LIMIT,
        "group": _GROUP,
    },
}
_MODE = {"enum": ["hybrid", "visual"], "default": "hybrid", "description": "visual skips the context leg"}
_OBJECT_OPTIONS = {
    "type": "object",
    "required": ["section_tipo", "section_id"],
    "properties": {
        "section_tipo": {"type": "string", "description": "the seed's section"},
        "section_id": {"type": "integer", "minimum": 0},
        "similarity_mode": _MODE,
        "view": {"type": "string", "description": "one face (obverse, reverse)"},
        "near_duplicate": {"type": "boolean", "description": "floor at RAG_NEAR_DUPLICATE_SIMILARITY"},
        "scope": {**_STRING_OR_LIST, "description": "sections compared; default the compare_scope"},
        "limit": _LIMIT,
    },
}
_CHARACTERIZE_OPTIONS = {
    "type": "object",
    "required": ["section_tipo", "section_id"],
    "properties": {
        "section_tipo": {"type": "string"},
        "section_id": {"type": "integer", "minimum": 0},
        "similarity_mode": _MODE,
    },
}
_TEXT_IMAGE_OPTIONS = {
    "type": "object",
    "required": ["query"],
    "properties": {"query": {"type": "string"}, "section_tipo": _STRING_OR_LIST, "limit": _LIMIT},
}
_RERANK = {"type": "boolean", "description": "cross-encoder reorder (default: off; on in ask)"}
_EXPAND = {"enum": ["neighbours", "parent"], "description": "small-to-big expansion"}
_EXPLAIN = {"type": "boolean", "description": "each item carries legs: its rank in each retrieval leg"}


def _with(base: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**base, "properties": {**base["properties"], **extra}}


_PASSAGE_OPTIONS = _with(_QUERY_OPTIONS, rerank=_RERANK, expand=_EXPAND)
_EXPLAINED_PASSAGE_OPTIONS = _with(_PASSAGE_OPTIONS, explain=_EXPLAIN)
_READ_CHUNK_OPTIONS = {
    "type": "object",
    "required": ["chunk_id"],
    "properties": {
        "chunk_id": {
            "type": "string",
            "description": "section-id/component/lang/index, as passages carry it",
        },
        "before": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
        "after": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
    },
}
OPTION_SCHEMAS: dict[str, dict[str, Any]] = {
    "semantic_search": _with(_QUERY_OPTIONS, rerank=_RERANK, explain=_EXPLAIN),
    "retrieve": _EXPLAINED_PASSAGE_OPTIONS,
    "get_agent_context": _PASSAGE_OPTIONS,
    "read_chunk": _READ_CHUNK_OPTIONS,
    "ask": _with(_PASSAGE_OPTIONS, stream={"type": "boolean", "description": "server-sent events"}),
    "search_by_text_image": _TEXT_IMAGE_OPTIONS,
    "similar_to": _SEED_OPTIONS,
    "similar_objects": _OBJECT_OPTIONS,
    "characterize_object": _CHARACTERIZE_OPTIONS,
    "embed_groups": {"type": "object", "properties": {"section_tipo": {"type": "string"}}},
}

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
                "options": OPTION_SCHEMAS[action],
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
    ("/v1/sections/{section_tipo}/reconcile", "post"): {"type": "object"},
}


# The 5xx codes every route may answer (it is stopping; an unexpected failure), and those some add.
_ANY_ROUTE_5XX = ("internal", "service.stopping")
_ROUTE_5XX: dict[tuple[str, str], tuple[str, ...]] = {("/readyz", "get"): ("service.unavailable",)}


def _error_response(codes: list[str]) -> dict[str, Any]:
    """A documented error status: its codes, readable and as ``x-error-codes`` for tools (the fuzzer)."""
    return {
        "description": ", ".join(codes),
        "x-error-codes": codes,
        "content": {"application/json": {"schema": _ERROR_ENVELOPE}},
    }


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
            operation = {
                "summary": _summary(route.handler),
                "responses": {
                    **_server_errors(path, method),
                    "default": {
                        "description": "v2 envelope",
                        "content": {
                            "application/json": {"schema": {"oneOf": [_OK_ENVELOPE, _ERROR_ENVELOPE]}}
                        },
                    },
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
