"""``GET /openapi.json`` for the sidecar: an OpenAPI 3.1 description built from the API's real routes.

The route table in :class:`inference.api.SidecarAPI` is the source: every ``(method, path)`` it serves
is listed here, so a route added there without a schema still appears (as a bare operation) and
the reliability fuzzer (``benchmarks/fuzz.py``) still reaches it. Request schemas mirror the
validation in ``inference/api.py``; every error answer is ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .errors import ErrorCode

__all__ = ["build_spec"]

_STRINGS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]}
_ENCODING = {"type": "string", "enum": ["float", "base64"], "default": "float"}
_MODEL = {"type": "string", "description": "a model id from GET /models"}

# Request bodies per POST route, as inference/api.py validates them.
REQUEST_SCHEMAS: dict[str, dict[str, Any]] = {
    "/embed": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": _STRINGS,
            "truncate": {"type": "boolean", "default": False},
            "return_sparse": {"type": "boolean", "default": False},
            "encoding_format": _ENCODING,
        },
    },
    "/v1/embeddings": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": _STRINGS,
            "dimensions": {"type": "integer"},
            "encoding_format": _ENCODING,
        },
    },
    "/text": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {
            "model": _MODEL,
            "input": _STRINGS,
            "truncate": {"type": "boolean", "default": False},
            "encoding_format": _ENCODING,
        },
    },
    "/image": {
        "type": "object",
        "required": ["model", "images"],
        "properties": {
            "model": _MODEL,
            "images": {
                "type": "array",
                "items": {"type": "string", "contentEncoding": "base64"},
                "minItems": 1,
            },
            "encoding_format": _ENCODING,
        },
    },
    "/rerank": {
        "type": "object",
        "required": ["model", "query", "documents"],
        "properties": {
            "model": _MODEL,
            "query": {"type": "string"},
            "documents": _STRINGS,
            "truncate": {"type": "boolean", "default": True},
            "raw_scores": {"type": "boolean", "default": False},
        },
    },
    "/tokenize": {
        "type": "object",
        "required": ["model", "input"],
        "properties": {"model": _MODEL, "input": _STRINGS},
    },
}

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


def _operation(method: str, path: str, summary: str, open_routes: Iterable[str]) -> dict[str, Any]:
    json_error = {"description": "coded error", "content": {"application/json": {"schema": ERROR_SCHEMA}}}
    responses: dict[str, Any] = {"200": {"description": "success"}}
    if method == "POST" or path == "/readyz":  # a model still loading or unreachable (NotReady)
        responses["503"] = {**json_error, "description": "not_ready", "x-error-codes": ["not_ready"]}
    if method == "POST":  # a model failing on an input (ModelFailed): documented, still a server error
        responses["500"] = {**json_error, "description": "model_error", "x-error-codes": ["model_error"]}
    operation: dict[str, Any] = {"summary": summary, "responses": {**responses, "default": json_error}}
    if path not in open_routes:
        operation["security"] = [{"bearer": []}]
    if method == "POST":
        schema = REQUEST_SCHEMAS.get(path, {"type": "object"})
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return operation


def build_spec(routes: dict[tuple[str, str], Any], open_routes: Iterable[str]) -> dict[str, Any]:
    """The OpenAPI document for ``routes`` (the API's ``(method, path) -> handler`` table)."""
    opened = frozenset(open_routes)
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), handler in sorted(routes.items(), key=lambda item: (item[0][1], item[0][0])):
        doc = (handler.__doc__ or "").strip().splitlines()
        summary = doc[0] if doc else path.strip("/").replace("/", " ") or "root"
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, summary, opened)
    return {
        "openapi": "3.1.0",
        "info": {"title": "Mnemo inference sidecar", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
