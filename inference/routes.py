"""Every sidecar route, declared once: method, path, summary and the body's fields.

Both ends of the HTTP contract come from this table: the client's requests
(:meth:`Route.body <inference.contract.Route.body>`, the paths and field defaults of
:class:`inference.client.SidecarClient`), the request validation
(:meth:`Route.read <inference.contract.Route.read>`, what handlers receive), the ``/openapi.json``
request schemas (:func:`inference.openapi.build_spec`), the routing (:class:`inference.api.SidecarAPI`)
and the routes a model kind is told to use (:mod:`inference.service`). Adding a route is one entry
here and its handler in :data:`inference.handlers.HANDLERS`; ``tests/test_inference_contract.py``
proves the views agree. Pure data, light to import: the gateway loads it with the client.
"""

from __future__ import annotations

from .contract import Field, FieldType, Route
from .errors import ErrorCode

__all__ = [
    "EMBED",
    "HEALTHZ",
    "IMAGE",
    "METRICS",
    "MODELS",
    "OPENAI_EMBEDDINGS",
    "OPENAI_MODELS",
    "OPENAPI",
    "OPEN_ROUTES",
    "READYZ",
    "RERANK",
    "ROUTES",
    "TEXT",
    "TOKENIZE",
]


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

HEALTHZ = Route("GET", "/healthz", "Liveness: the process answers.", open=True)
READYZ = Route(
    "GET",
    "/readyz",
    "Readiness: every model has loaded and run its warm-up forward pass (503 until then).",
    open=True,
)
MODELS = Route(
    "GET",
    "/models",
    "The served models: id, kind, capabilities, dimension, max input tokens, device, dtype.",
)
OPENAI_MODELS = Route(
    "GET",
    "/v1/models",
    "The served models in OpenAI's list shape (the SDK's models.list() discovers them here).",
)
METRICS = Route(
    "GET", "/metrics", "Prometheus metrics: requests, batch sizes, queue depth, latency, throughput."
)
OPENAPI = Route(
    "GET",
    "/openapi.json",
    "This document: an OpenAPI 3.1 description of every route, from the route table itself.",
    open=True,
)
EMBED = Route(
    "POST",
    "/embed",
    "Dense vectors (and optionally lexical weights) for texts, from a text model.",
    (_model("text"), INPUT, _truncate(False, "a text"), RETURN_SPARSE, ENCODING_FORMAT),
)
OPENAI_EMBEDDINGS = Route(
    "POST",
    "/v1/embeddings",
    "Dense vectors for texts in OpenAI's embeddings shape.",
    (_model("text"), INPUT, ENCODING_FORMAT, DIMENSIONS),
)
TEXT = Route(
    "POST",
    "/text",
    "Vectors for texts from an image-text model's text tower (the space its images share).",
    (_model("image_text"), INPUT, _truncate(False, "a text"), ENCODING_FORMAT),
)
IMAGE = Route(
    "POST",
    "/image",
    "Vectors for base64 images from an image-text model's image tower.",
    (_model("image_text"), IMAGES, ENCODING_FORMAT),
)
RERANK = Route(
    "POST",
    "/rerank",
    "Relevance scores of documents for a query, from a cross-encoder, in input order.",
    (_model("rerank"), QUERY, DOCUMENTS, _truncate(True, "a query-document pair"), RAW_SCORES),
)
TOKENIZE = Route(
    "POST",
    "/tokenize",
    "Token counts of texts as the model counts them (special tokens included).",
    (_model("text", "image_text", "rerank"), INPUT),
)

ROUTES: tuple[Route, ...] = (
    HEALTHZ,
    READYZ,
    MODELS,
    OPENAI_MODELS,
    METRICS,
    OPENAPI,
    EMBED,
    OPENAI_EMBEDDINGS,
    TEXT,
    IMAGE,
    RERANK,
    TOKENIZE,
)

# Paths answered without the API key.
OPEN_ROUTES = frozenset(route.path for route in ROUTES if route.open)
