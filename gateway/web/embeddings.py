"""``GET /v1/models`` and ``POST /v1/embeddings`` on the gateway: OpenAI's embeddings API, metered
per principal (issue 45).

Archives point OpenAI-compatible clients at the gateway, not at the sidecar, to get per-user metering:
the caller is one of the gateway's own bearer tokens (its ``sub`` is the "API key" the ledger counts
against), the body is the sidecar's ``/v1/embeddings`` body, and the answer is the sidecar's,
unchanged. The sidecar's own route stays as it is: an infrastructure endpoint behind
``RAG_SIDECAR_API_KEY``, with no database and so no principals (``inference`` stands alone).

In order: the token (401); the kill switch (``RAG_ENABLED`` off: 503 ``rag.disabled``, as every
action that reaches the sidecar); the body, read strictly (:func:`gateway.base.body.read_json`) and checked here
field by field as the sidecar declares them, so a bad one is the gateway's coded 400 before anything
is reserved; the fairness limiter and the reservation of an upper bound of the input's tokens on
``embedding_input_tokens`` (429, :func:`gateway.budgets.ledger.metered`); one sidecar call; the settlement
to the sidecar's ``usage.prompt_tokens``. A sidecar failure refunds the whole reservation and answers
the sidecar's refusal with its status (:data:`gateway.base.errors.ERRORS`' ``embeddings.*`` codes);
a failure of the service rather than of the input is 503 ``rag.embedding_unavailable``.

``GET /v1/models`` answers everyone who may call ``/v1/embeddings`` (any valid token), in OpenAI's
list shape, so an OpenAI SDK's ``models.list()`` finds the ids it may embed with; each entry also
says what a caller needs of a model (kind, capabilities, dimension, input limit), and an admin's
(the console's operations page) where it runs too (device, dtype).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.access.auth import Principal, authenticate
from gateway.base.body import read_json
from gateway.base.errors import ERRORS, ApiError, json_response
from gateway.base.resources import SETTINGS_KEY, SIDECAR_KEY
from gateway.budgets.ledger import BUDGETS_KEY, Metering, metered
from inference.client import ModelInfo, SidecarError, SidecarRejected

__all__ = [
    "METER",
    "REQUEST_SCHEMA",
    "RESPONSE_SCHEMA",
    "EmbeddingsRequest",
    "setup_openai_routes",
    "sidecar_failure",
    "token_bound",
]

log = logging.getLogger(__name__)

METER = "embedding_input_tokens"
ENCODING_FORMATS = ("float", "base64")  # the sidecar's: JSON floats, or base64 of little-endian float32
MAX_DIMENSIONS = 2**31 - 1  # past any model's width; bounds the integer before it is re-encoded

# The reservation is an upper bound of what the sidecar can report, so a call cannot outspend the
# budget it passed: per input, its UTF-8 bytes plus SPECIAL_TOKENS_PER_INPUT. Every token a
# tokenizer emits for the text covers at least one byte of it (a WordPiece or BPE piece, a
# SentencePiece piece, a byte-fallback token: one byte at least each); beyond those come the special
# tokens ([CLS] and [SEP], <s> and </s>: two), SentencePiece's one zero-width word-start piece ("▁")
# at the start of an input, and one spare for a model that adds a language or task token. No cap by
# the model's max input tokens: this route never truncates (an input over the limit is the sidecar's
# 422, refunded), so the bytes are the bound. The one tokenizer step that can break it is a
# normalizer that expands text (NFKC turns U+FDFA, 3 bytes, into 18 characters); the settlement then
# charges the excess, as a language model reporting more than its estimate is charged: the ledger
# records what the sidecar counted.
SPECIAL_TOKENS_PER_INPUT = 4


def token_bound(texts: Sequence[str]) -> int:
    """The most tokens ``texts`` can cost (see :data:`SPECIAL_TOKENS_PER_INPUT`)."""
    return sum(len(text.encode("utf-8")) + SPECIAL_TOKENS_PER_INPUT for text in texts)


@dataclass(frozen=True)
class EmbeddingsRequest:
    """A checked ``/v1/embeddings`` body: the sidecar's fields (model, input, encoding_format,
    dimensions); unknown fields (OpenAI's ``user``) are ignored, as the sidecar ignores them."""

    model: str
    input: str | list[str]  # as the caller sent it: the sidecar answers a string as one input
    encoding_format: str
    dimensions: int | None

    @property
    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input

    @classmethod
    def read(cls, body: Any) -> EmbeddingsRequest:
        """``body`` checked in the sidecar's field order; the first bad field is a coded 400."""
        if not isinstance(body, Mapping):
            raise ApiError.invalid_request("The request body must be a JSON object")
        model = body.get("model")  # required by the sidecar: no default model is invented here
        if model is None:
            raise ApiError.invalid_request("model is required (GET /v1/models lists the ids)")
        if not isinstance(model, str):
            raise ApiError.invalid_request("model must be a string")
        texts = body.get("input")
        if texts is None:
            raise ApiError.invalid_request("input is required: a string, or a list of strings")
        if not (
            isinstance(texts, str) or (isinstance(texts, list) and all(isinstance(t, str) for t in texts))
        ):
            raise ApiError.invalid_request("input must be a string or a list of strings")
        if isinstance(texts, list) and not texts:
            raise ApiError.invalid_request("input is empty")
        encoding_format = body.get("encoding_format")
        if encoding_format is None:
            encoding_format = "float"
        if encoding_format not in ENCODING_FORMATS:
            raise ApiError.invalid_request("encoding_format must be 'float' or 'base64'")
        dimensions = body.get("dimensions")
        if dimensions is not None and (
            not isinstance(dimensions, int)
            or isinstance(dimensions, bool)
            or not 1 <= dimensions <= MAX_DIMENSIONS
        ):
            raise ApiError.invalid_request(f"dimensions must be an integer in [1, {MAX_DIMENSIONS}]")
        return cls(model, texts, encoding_format, dimensions)


# What OpenAPI publishes of the body: what EmbeddingsRequest.read accepts.
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string", "description": "A text model id the sidecar serves."},
        "input": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}],
            "description": "The texts: one string, or a list of strings.",
        },
        "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS), "default": "float"},
        "dimensions": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_DIMENSIONS,
            "description": "Only the model's own dimension is accepted: vectors are never cut.",
        },
    },
}


def openai_list(item: dict[str, Any], **more: dict[str, Any]) -> dict[str, Any]:
    """The schema of OpenAI's list answer: ``{"object": "list", "data": [item, ...]}`` and ``more``
    fields beside them (required)."""
    return {
        "type": "object",
        "required": ["object", "data", *more],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": item}, **more},
    }


# The sidecar's answer, passed on unchanged (OpenAI's embeddings list).
RESPONSE_SCHEMA = openai_list(
    {
        "type": "object",
        "required": ["object", "embedding", "index"],
        "properties": {
            "object": {"const": "embedding"},
            "embedding": {
                "oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}],
                "description": "floats, or base64 of little-endian float32 (encoding_format)",
            },
            "index": {"type": "integer"},
        },
    },
    model={"type": "string"},
    usage={
        "type": "object",
        "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
    },
)


def sidecar_failure(exc: SidecarError) -> ApiError:
    """The sidecar's refusal of the input as ``embeddings.<its code>`` with its status; anything else
    (a 5xx, no answer, a refusal that is the gateway's own doing such as a wrong sidecar API key)
    is the service's failure, 503 ``rag.embedding_unavailable``, never blamed on the caller."""
    retry_after = None if exc.retry_after is None else max(1, math.ceil(exc.retry_after))
    code = f"embeddings.{exc.code}"
    if exc.code is not None and code in ERRORS and ERRORS[code].status == exc.status:
        message = exc.message if isinstance(exc, SidecarRejected) else None  # else the code's own words
        return ApiError(code, message, retry_after=retry_after)
    log.warning("POST /v1/embeddings: the sidecar failed: %s", exc)
    return ApiError("rag.embedding_unavailable", retry_after=retry_after)


async def embeddings(request: web.Request) -> web.Response:
    """OpenAI's embeddings for the gateway's tokens, metered per principal (``embedding_input_tokens``)."""
    principal = authenticate(request)
    if not request.app[SETTINGS_KEY].enabled:
        raise ApiError.rag_disabled()
    call = EmbeddingsRequest.read(await read_json(request))
    budgets = request.app.get(BUDGETS_KEY)
    metering = None if budgets is None else Metering(budgets, principal)
    async with metered(metering, {METER: token_bound(call.texts)}):
        try:
            answer = await request.app[SIDECAR_KEY].openai_embeddings(
                call.model, call.input, encoding_format=call.encoding_format, dimensions=call.dimensions
            )
        except SidecarError as exc:
            raise sidecar_failure(exc) from exc  # metered refunds the reservation
        if metering is not None:
            await metering.settle(metering.reservation(METER), answer.prompt_tokens)
    response = json_response(request, answer.body)
    if metering is not None:
        response.headers.update(metering.headers())
    return response


# What every caller reads of a model beside OpenAI's fields, and what an admin reads besides.
MODEL_DETAIL = ("kind", "capabilities", "dimension", "max_input_tokens")
ADMIN_MODEL_DETAIL = ("device", "dtype")
# The answer of GET /v1/models (OpenAI's model list; its entries may carry more fields).
MODELS_SCHEMA = openai_list(
    {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "kind": {"type": "string", "description": "text, image_text or rerank"},
            "capabilities": {"type": "array", "items": {"type": "string"}},
            "dimension": {"type": ["integer", "null"]},
            "max_input_tokens": {"type": ["integer", "null"]},
            "device": {"type": "string", "description": "admins only"},
            "dtype": {"type": "string", "description": "admins only"},
        },
    }
)


def model_entry(model: ModelInfo, principal: Principal) -> dict[str, Any]:
    """One served model as OpenAI's model object, with what ``principal`` may read of it."""
    detail = MODEL_DETAIL + (ADMIN_MODEL_DETAIL if principal.admin else ())
    # capabilities is a frozenset: no JSON encoder writes one, so it goes out as a sorted list
    shown = {name: getattr(model, name) for name in detail} | {"capabilities": sorted(model.capabilities)}
    return {"id": model.id, "object": "model", "created": 0, "owned_by": "mnemo", **shown}


async def models(request: web.Request) -> web.Response:
    """The models the sidecar serves, in OpenAI's list shape, for every caller of /v1/embeddings."""
    principal = authenticate(request)
    try:
        served = await request.app[SIDECAR_KEY].models()
    except SidecarError as exc:
        raise ApiError.embedding_unavailable() from exc
    return json_response(request, {"object": "list", "data": [model_entry(m, principal) for m in served]})


def setup_openai_routes(app: web.Application) -> None:
    """``GET /v1/models`` and ``POST /v1/embeddings``: the OpenAI-shaped routes, per principal metered."""
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/embeddings", embeddings)
