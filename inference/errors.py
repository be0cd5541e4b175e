"""The sidecar's error table: one exception type per HTTP status, raised deep, answered once at the edge.

Every error carries a stable machine-readable ``code`` and a human ``message``; the HTTP layer turns it
into ``{"error": {"code", "message"}}`` with ``status`` (and ``Retry-After`` where set). The classes
pickle by their arguments so they cross Ray process boundaries intact.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "BadRequest",
    "ErrorCode",
    "InputTooLong",
    "MethodNotAllowed",
    "ModelFailed",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "RouteNotFound",
    "SidecarApiError",
    "Unauthorized",
    "UnsupportedMediaType",
]


class ErrorCode(StrEnum):
    """Every ``error.code`` the sidecar answers: one table, shared by the server and its client.

    A StrEnum, so a member is its JSON string and compares equal to the code a client reads back.
    """

    # the class defaults, one per status
    INTERNAL_ERROR = "internal_error"
    BAD_REQUEST = "bad_request"
    UNAUTHORIZED = "unauthorized"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TIMEOUT = "request_timeout"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    INPUT_TOO_LONG = "input_too_long"
    OVERLOADED = "overloaded"
    MODEL_ERROR = "model_error"
    NOT_READY = "not_ready"
    # the HTTP layer and the body
    BAD_HTTP_REQUEST = "bad_http_request"
    BAD_CONTENT_LENGTH = "bad_content_length"
    BODY_TOO_LARGE = "body_too_large"
    INVALID_JSON = "invalid_json"
    JSON_TOO_DEEP = "json_too_deep"
    NUMBER_TOO_LONG = "number_too_long"
    INVALID_TEXT = "invalid_text"
    # fields and inputs
    MISSING_FIELD = "missing_field"
    INVALID_TYPE = "invalid_type"
    EMPTY_INPUT = "empty_input"
    TOO_MANY_INPUTS = "too_many_inputs"
    WRONG_MODEL_KIND = "wrong_model_kind"
    SPARSE_UNSUPPORTED = "sparse_unsupported"
    UNSUPPORTED_DIMENSIONS = "unsupported_dimensions"
    INVALID_ENCODING_FORMAT = "invalid_encoding_format"
    # images
    INVALID_BASE64 = "invalid_base64"
    INVALID_IMAGE = "invalid_image"
    IMAGE_TOO_LARGE = "image_too_large"
    IMAGE_TOO_MANY_PIXELS = "image_too_many_pixels"


class SidecarApiError(Exception):
    """Base: an error the sidecar answers with a coded JSON body."""

    status: int = 500
    default_code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = ErrorCode(code or self.default_code)
        self.retry_after = retry_after

    def __reduce__(self):  # keep code/retry_after across pickling (Ray replicas -> ingress)
        return (_rebuild, (type(self), self.message, self.code, self.retry_after))

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


def _rebuild(cls: type[SidecarApiError], message: str, code: ErrorCode, retry_after: float | None):
    return cls(message, code=code, retry_after=retry_after)


class BadRequest(SidecarApiError):
    """Malformed JSON, wrong types, empty input, bad base64, bytes that are not an image (400)."""

    status = 400
    default_code = ErrorCode.BAD_REQUEST


class Unauthorized(SidecarApiError):
    """Missing or wrong API key (401)."""

    status = 401
    default_code = ErrorCode.UNAUTHORIZED


class ModelNotFound(SidecarApiError):
    """No model of that id is served (404)."""

    status = 404
    default_code = ErrorCode.MODEL_NOT_FOUND


class RouteNotFound(SidecarApiError):
    """No such path (404)."""

    status = 404
    default_code = ErrorCode.NOT_FOUND


class MethodNotAllowed(SidecarApiError):
    """The path exists but not for this method (405)."""

    status = 405
    default_code = ErrorCode.METHOD_NOT_ALLOWED


class RequestTimeout(SidecarApiError):
    """The request, body upload included, took longer than the front's request timeout (408)."""

    status = 408
    default_code = ErrorCode.REQUEST_TIMEOUT


class PayloadTooLarge(SidecarApiError):
    """Too many inputs, a body over the byte limit, an image over the byte or pixel limit (413)."""

    status = 413
    default_code = ErrorCode.PAYLOAD_TOO_LARGE


class UnsupportedMediaType(SidecarApiError):
    """A body that is not JSON by its Content-Type, or sent with a Content-Encoding (415)."""

    status = 415
    default_code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class InputTooLong(SidecarApiError):
    """A text over the model's token limit without ``truncate`` (422)."""

    status = 422
    default_code = ErrorCode.INPUT_TOO_LONG


class Overloaded(SidecarApiError):
    """Admission bound reached: try again after ``retry_after`` seconds (429)."""

    status = 429
    default_code = ErrorCode.OVERLOADED


class ModelFailed(SidecarApiError):
    """The forward pass raised or returned NaN/infinity; the replica stays up and serves the next request (500)."""

    status = 500
    default_code = ErrorCode.MODEL_ERROR


class NotReady(SidecarApiError):
    """The model has not finished loading and warming up, or is unreachable (503)."""

    status = 503
    default_code = ErrorCode.NOT_READY
