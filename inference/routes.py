"""Every sidecar route, declared once: method, path, summary, handler and the body's fields.

From this table come the request validation (:meth:`Route.read <inference.contract.Route.read>`,
what handlers receive), the ``/openapi.json`` request schemas (:func:`inference.openapi.build_spec`)
and the routing itself (:class:`inference.api.SidecarAPI`). Adding a route is one entry here and its
handler in :mod:`inference.handlers`; ``tests/test_inference_contract.py`` proves the views agree.
"""

from __future__ import annotations

from . import handlers
from .contract import Field, FieldType, Route
from .errors import ErrorCode

__all__ = ["OPEN_ROUTES", "ROUTES"]


def _model(*kinds: str) -> Field:
    return Field("model", FieldType.MODEL, "A model id from GET /models.", required=True, model_kinds=kinds)


def _truncate(default: bool, over: str) -> Field:
    return Field(
        "truncate",
        FieldType.BOOLEAN,
        f"Cut {over} over the model's token limit instead of refusing it (422 input_too_long).",
        default=default,
    )


INPUT = Field(
    "input", FieldType.TEXTS, "The texts: one string, or a list of strings.", required=True, counted=True
)
ENCODING_FORMAT = Field(
    "encoding_format",
    FieldType.STRING,
    "Vectors as JSON floats, or as base64 of little-endian float32 (OpenAI's encoding_format).",
    default="float",
    choices=("float", "base64"),
    choice_code=ErrorCode.INVALID_ENCODING_FORMAT,
)
RETURN_SPARSE = Field(
    "return_sparse",
    FieldType.BOOLEAN,
    "Also return the model's learned lexical weights, {token_id: weight} per text (bge-m3 only).",
    default=False,
)
DIMENSIONS = Field(
    "dimensions",
    FieldType.INTEGER,
    "OpenAI's option; vectors are never cut, so only the model's own dimension is accepted.",
)
IMAGES = Field(
    "images",
    FieldType.IMAGES,
    "The images, base64 (a data: URL prefix is allowed), each within the byte and pixel limits.",
    required=True,
    counted=True,
)
QUERY = Field("query", FieldType.STRING, "The query each document is scored against.", required=True)
DOCUMENTS = Field(
    "documents",
    FieldType.TEXTS,
    "The documents to score: one string, or a list of strings.",
    required=True,
    counted=True,
)
RAW_SCORES = Field(
    "raw_scores", FieldType.BOOLEAN, "The cross-encoder's logits instead of sigmoid scores.", default=False
)

ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", "Liveness: the process answers.", handlers.healthz, open=True),
    Route(
        "GET",
        "/readyz",
        "Readiness: every model has loaded and run its warm-up forward pass (503 until then).",
        handlers.readyz,
        open=True,
    ),
    Route(
        "GET",
        "/models",
        "The served models: id, kind, capabilities, dimension, max input tokens, device, dtype.",
        handlers.models,
    ),
    Route(
        "GET",
        "/v1/models",
        "The served models in OpenAI's list shape (the SDK's models.list() discovers them here).",
        handlers.openai_models,
    ),
    Route(
        "GET",
        "/metrics",
        "Prometheus metrics: requests, batch sizes, queue depth, latency, throughput.",
        handlers.metrics,
    ),
    Route(
        "GET",
        "/openapi.json",
        "This document: an OpenAPI 3.1 description of every route, from the route table itself.",
        handlers.openapi,
        open=True,
    ),
    Route(
        "POST",
        "/embed",
        "Dense vectors (and optionally lexical weights) for texts, from a text model.",
        handlers.embed,
        (_model("text"), INPUT, _truncate(False, "a text"), RETURN_SPARSE, ENCODING_FORMAT),
    ),
    Route(
        "POST",
        "/v1/embeddings",
        "Dense vectors for texts in OpenAI's embeddings shape.",
        handlers.openai_embeddings,
        (_model("text"), INPUT, ENCODING_FORMAT, DIMENSIONS),
    ),
    Route(
        "POST",
        "/text",
        "Vectors for texts from an image-text model's text tower (the space its images share).",
        handlers.text,
        (_model("image_text"), INPUT, _truncate(False, "a text"), ENCODING_FORMAT),
    ),
    Route(
        "POST",
        "/image",
        "Vectors for base64 images from an image-text model's image tower.",
        handlers.image,
        (_model("image_text"), IMAGES, ENCODING_FORMAT),
    ),
    Route(
        "POST",
        "/rerank",
        "Relevance scores of documents for a query, from a cross-encoder, in input order.",
        handlers.rerank,
        (_model("rerank"), QUERY, DOCUMENTS, _truncate(True, "a query-document pair"), RAW_SCORES),
    ),
    Route(
        "POST",
        "/tokenize",
        "Token counts of texts as the model counts them (special tokens included).",
        handlers.tokenize,
        (_model("text", "image_text", "rerank"), INPUT),
    ),
)

# Paths answered without the API key.
OPEN_ROUTES = frozenset(route.path for route in ROUTES if route.open)
