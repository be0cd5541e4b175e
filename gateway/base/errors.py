"""One error type, one status table, one translation to envelope v2 at the edge.

Handlers raise :class:`ApiError` (usually through a named constructor such as
:meth:`ApiError.invalid_options`); :func:`error_middleware` turns it, and any
unexpected exception, into the dd_rag_api v2 failure envelope::

    {"ok": false, "request_id": "...",
     "error": {"code", "category", "message", "label_key", "retryable"}}

with the HTTP status of the code, for every route (``/v1/*`` included). An
unexpected exception becomes a 500 ``internal`` whose message never carries
the exception text (that goes to the log, with the request id).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.base.resources import ALLOWED_METHODS_KEY, ERROR_CODE_KEY, REQUEST_ID_KEY
from inference.errors import BadRequest, InputTooLong, ModelNotFound, Overloaded, PayloadTooLarge
from inference.json_out import dumps
from schema.database import database_unreachable

log = logging.getLogger(__name__)

# How the access log and metrics record a request whose client went away (nginx's 499).
CLIENT_ABORT = "client_abort"
CLIENT_CLOSED_STATUS = 499


class ClientGone(Exception):
    """The client closed the connection before its request was read: nobody is left to answer."""


REQUEST_ID_HEADER = "X-Request-Id"
# An incoming id is echoed only when it is short and plain, so logs cannot be forged through it.
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(frozen=True)
class ErrorSpec:
    status: int
    category: str
    message: str
    retryable: bool = False


# The status table: every code the gateway emits, its HTTP status, category and default message.
ERRORS: dict[str, ErrorSpec] = {
    "request.invalid_json": ErrorSpec(400, "request", "The request body is not valid JSON"),
    "request.invalid_text": ErrorSpec(
        400, "request", "A string holds a NUL character or a lone UTF-16 surrogate"
    ),
    "request.json_too_deep": ErrorSpec(400, "request", "The JSON body is nested too deeply"),
    "request.number_too_long": ErrorSpec(400, "request", "A number in the JSON body is too long"),
    "request.invalid_encoding": ErrorSpec(400, "request", "The body does not match its Content-Encoding"),
    "request.timeout": ErrorSpec(408, "request", "The request body was not received in time"),
    "request.invalid_request": ErrorSpec(400, "request", "The request is malformed"),
    "request.unknown_api": ErrorSpec(400, "request", "Unknown dd_api"),
    "request.unknown_action": ErrorSpec(400, "request", "Unknown action"),
    "request.invalid_options": ErrorSpec(400, "request", "Invalid options"),
    "request.payload_too_large": ErrorSpec(413, "request", "The request body is too large"),
    "request.unsupported_media_type": ErrorSpec(415, "request", "The request body must be JSON"),
    "request.method_not_allowed": ErrorSpec(405, "request", "Method not allowed"),
    # Intake (index.ingest.intake.IntakeError and index.store.sections.DescriptorError codes)
    "request.invalid_record": ErrorSpec(400, "request", "The record is invalid"),
    "request.invalid_descriptor": ErrorSpec(400, "request", "The section descriptor is invalid"),
    "request.unknown_section": ErrorSpec(422, "request", "The section has no descriptor"),
    "request.unknown_group": ErrorSpec(422, "request", "The section declares no such embed group"),
    "request.too_many_records": ErrorSpec(413, "request", "Too many records in one request"),
    "request.invalid_image": ErrorSpec(400, "request", "The record image is not usable"),
    "request.media_not_allowed": ErrorSpec(
        400, "request", "The image source is outside RAG_MEDIA_ROOT or the allowed RAG_MEDIA_BASE_URL"
    ),
    "request.unknown_image_component": ErrorSpec(
        422, "request", "The section's context declares no such image component"
    ),
    "request.unknown_metadata_component": ErrorSpec(
        422, "request", "The section's context declares no metadata role for that component"
    ),
    "not_found": ErrorSpec(404, "request", "Not found"),
    "auth.not_logged": ErrorSpec(401, "auth", "Authentication required"),
    "auth.invalid_token": ErrorSpec(401, "auth", "The bearer token is invalid"),
    "auth.forbidden": ErrorSpec(403, "auth", "Not allowed"),
    "auth.ask_not_granted": ErrorSpec(
        403, "auth", 'ask needs a grant: a token whose "grants" claim holds "ask" (gateway.budgets.ledger)'
    ),
    # Budgets and fairness (gateway.budgets.ledger): the caller's own limits, not the service's load.
    # Undotted like `internal`: the category is the code.
    "budget_exhausted": ErrorSpec(
        429, "budget_exhausted", "This principal's budget for the window is spent", True
    ),
    "rate_limited": ErrorSpec(429, "rate_limited", "This principal is calling too fast; retry shortly", True),
    # The sidecar's refusals of a call to the gateway's POST /v1/embeddings (gateway.web.embeddings),
    # passed on as "embeddings." + the sidecar's own code with the sidecar's status (its error class's,
    # so the two cannot drift). Any other sidecar failure is the service's: rag.embedding_unavailable.
    "embeddings.model_not_found": ErrorSpec(
        ModelNotFound.status, "embeddings", "The embedding sidecar serves no model of that id"
    ),
    "embeddings.wrong_model_kind": ErrorSpec(
        BadRequest.status, "embeddings", "The model is not a text embedding model"
    ),
    "embeddings.unsupported_dimensions": ErrorSpec(
        BadRequest.status, "embeddings", "The model's vectors have another dimension; they are never cut"
    ),
    "embeddings.too_many_inputs": ErrorSpec(
        PayloadTooLarge.status, "embeddings", "More inputs than the model takes in one request"
    ),
    "embeddings.body_too_large": ErrorSpec(
        PayloadTooLarge.status, "embeddings", "The request is over the embedding sidecar's body limit"
    ),
    "embeddings.input_too_long": ErrorSpec(
        InputTooLong.status, "embeddings", "An input is over the model's token limit"
    ),
    "embeddings.overloaded": ErrorSpec(
        Overloaded.status, "embeddings", "The embedding sidecar is at capacity; retry shortly", True
    ),
    "rag.disabled": ErrorSpec(503, "rag", "RAG is disabled"),
    "rag.media_disabled": ErrorSpec(503, "rag", "RAG media is disabled"),
    "rag.embedding_unavailable": ErrorSpec(
        503, "rag", "The embedding service did not return a query vector", retryable=True
    ),
    "rag.generation_failed": ErrorSpec(503, "rag", "The grounded answer could not be generated", True),
    "rag.chunk_not_found": ErrorSpec(404, "rag", "No such chunk"),
    "rag.not_implemented": ErrorSpec(501, "rag", "This action is not implemented yet"),
    "service.unavailable": ErrorSpec(503, "service", "The service is temporarily unavailable", True),
    "service.stopping": ErrorSpec(503, "service", "The gateway is shutting down; retry shortly", True),
    "service.overloaded": ErrorSpec(429, "service", "Too many requests in flight; retry shortly", True),
    "internal": ErrorSpec(500, "internal", "Internal error"),
}


class ApiError(Exception):
    """A coded failure that leaves the service as a v2 envelope with the code's HTTP status."""

    def __init__(
        self,
        code: str,
        message: str | None = None,
        *,
        retryable: bool | None = None,
        retry_after: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        spec = ERRORS[code]  # an unknown code is a programming error: fail loudly
        self.code = code
        self.status = spec.status
        self.category = spec.category
        self.message = message or spec.message
        self.retryable = spec.retryable if retryable is None else retryable
        # Seconds for Retry-After (None: RETRY_AFTER_S), and what the client needs to act on
        # (a spent budget's meter, use, limit and reset time), carried in the envelope's error.
        self.retry_after = retry_after
        self.details = details
        super().__init__(f"{code}: {self.message}")

    @property
    def label_key(self) -> str:
        """A stable key a client UI translates, e.g. ``error.rag.disabled``."""
        return "error." + self.code

    def body(self, request_id: str) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.code,
            "category": self.category,
            "message": self.message,
            "label_key": self.label_key,
            "retryable": self.retryable,
        }
        if self.retry_after is not None:
            error["retry_after"] = self.retry_after
        if self.details is not None:
            error.update(self.details)
        return {"ok": False, "request_id": request_id, "error": error}

    # Named constructors for the codes handlers raise most.
    @classmethod
    def invalid_options(cls, message: str) -> ApiError:
        return cls("request.invalid_options", message)

    @classmethod
    def invalid_request(cls, message: str) -> ApiError:
        return cls("request.invalid_request", message)

    @classmethod
    def not_logged(cls) -> ApiError:
        return cls("auth.not_logged")

    @classmethod
    def invalid_token(cls, message: str | None = None) -> ApiError:
        return cls("auth.invalid_token", message)

    @classmethod
    def forbidden(cls, message: str | None = None) -> ApiError:
        return cls("auth.forbidden", message)

    @classmethod
    def not_found(cls, message: str | None = None) -> ApiError:
        return cls("not_found", message)

    @classmethod
    def rag_disabled(cls) -> ApiError:
        return cls("rag.disabled")

    @classmethod
    def media_disabled(cls) -> ApiError:
        return cls("rag.media_disabled")

    @classmethod
    def embedding_unavailable(cls) -> ApiError:
        return cls("rag.embedding_unavailable")

    @classmethod
    def not_implemented(cls, action: str) -> ApiError:
        return cls("rag.not_implemented", f"The action {action!r} is not implemented yet")

    @classmethod
    def internal(cls) -> ApiError:
        return cls("internal")


def request_id(request: web.BaseRequest) -> str:
    """The id of this request: the caller's ``X-Request-Id`` when plain, else a fresh one (memoized)."""
    rid = request.get(REQUEST_ID_KEY)
    if rid is None:
        incoming = request.headers.get(REQUEST_ID_HEADER, "")
        rid = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
        request[REQUEST_ID_KEY] = rid
    return str(rid)


def json_response(request: web.BaseRequest, body: dict[str, Any], *, status: int = 200) -> web.Response:
    """A compact JSON response carrying the request id header."""
    response = web.Response(body=dumps(body), status=status, content_type="application/json", charset="utf-8")
    response.headers[REQUEST_ID_HEADER] = request_id(request)
    return response


def envelope_ok(request: web.Request, data: Any, msg: str = "ok") -> web.Response:
    """The v2 success envelope: ``{"ok": true, "request_id", "msg", "data"}``."""
    return json_response(request, {"ok": True, "request_id": request_id(request), "msg": msg, "data": data})


RETRY_AFTER_S = 1  # what a 429 or retryable 503 asks a client to wait: in-flight requests finish by then
DATABASE_DOWN_MESSAGE = (
    "The database did not answer (unreachable, restarting or cut the session); retry shortly"
)


def unexpected_failure(exc: Exception, where: str) -> ApiError:
    """The coded error for an exception no handler expected (the HTTP middleware's and the MCP tools').

    The database failing under the request is an outage: 503 ``service.unavailable``, retryable,
    a warning in the log. Anything else is a bug: 500 ``internal``, its stack in the log.
    """
    if database_unreachable(exc):
        log.warning("the database failed %s: %s", where, _first_cause(exc))
        return ApiError("service.unavailable", DATABASE_DOWN_MESSAGE)
    log.error("unhandled error in %s", where, exc_info=exc)
    return ApiError.internal()


def _first_cause(exc: BaseException) -> BaseException:
    """The first leaf of a task group's exception group (the legs fail alike), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def error_response(request: web.BaseRequest, error: ApiError) -> web.Response:
    """The error envelope (headers and the request id only: a protocol-level request has no route)."""
    response = json_response(request, error.body(request_id(request)), status=error.status)
    if error.status == 429 or (error.status == 503 and error.retryable):
        response.headers["Retry-After"] = str(error.retry_after or RETRY_AFTER_S)
    if error.status == 408:  # a client too slow to send its body does not keep the connection
        response.force_close()
    if error.code == "request.method_not_allowed":
        allowed = request.get(ALLOWED_METHODS_KEY)
        if allowed:
            response.headers["Allow"] = ",".join(sorted(allowed))
    return response


_HTTP_CODES = {
    400: "request.invalid_request",
    408: "request.timeout",
    404: "not_found",
    405: "request.method_not_allowed",
    413: "request.payload_too_large",
    415: "request.unsupported_media_type",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> ApiError:
    code = _HTTP_CODES.get(exc.status)
    if code is None:
        return ApiError("internal") if exc.status >= 500 else ApiError("request.invalid_request")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        request[ALLOWED_METHODS_KEY] = exc.allowed_methods
    return ApiError(code)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Translate every failure into a v2 envelope; every response carries the request id."""
    rid = request_id(request)
    try:
        response = await handler(request)
    except ApiError as exc:
        request[ERROR_CODE_KEY] = exc.code
        return error_response(request, exc)
    except ClientGone as exc:  # nobody reads this answer: record the abort, not an internal error
        log.info("client hung up during %s %s: %s", request.method, request.path, exc)
        request[ERROR_CODE_KEY] = CLIENT_ABORT
        return web.Response(status=CLIENT_CLOSED_STATUS)
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like pass through
            raise
        error = _from_http_exception(request, exc)
        request[ERROR_CODE_KEY] = error.code
        return error_response(request, error)
    except Exception as exc:
        error = unexpected_failure(exc, f"{request.method} {request.path}")
        request[ERROR_CODE_KEY] = error.code
        return error_response(request, error)
    response.headers.setdefault(REQUEST_ID_HEADER, rid)
    return response
