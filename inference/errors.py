"""The sidecar's error table: one exception type per HTTP status, raised deep, answered once at the edge.

Every error carries a stable machine-readable ``code`` and a human ``message``; the HTTP layer turns it
into ``{"error": {"code", "message"}}`` with ``status`` (and ``Retry-After`` where set). The classes
pickle by their arguments so they cross Ray process boundaries intact.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
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


class SidecarApiError(Exception):
    """Base: an error the sidecar answers with a coded JSON body."""

    status: int = 500
    default_code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.retry_after = retry_after

    def __reduce__(self):  # keep code/retry_after across pickling (Ray replicas -> ingress)
        return (_rebuild, (type(self), self.message, self.code, self.retry_after))

    def to_json(self) -> dict:
        return {"error": {"code": self.code, "message": self.message}}


def _rebuild(cls: type[SidecarApiError], message: str, code: str, retry_after: float | None):
    return cls(message, code=code, retry_after=retry_after)


class BadRequest(SidecarApiError):
    """Malformed JSON, wrong types, empty input, bad base64, bytes that are not an image (400)."""

    status = 400
    default_code = "bad_request"


class Unauthorized(SidecarApiError):
    """Missing or wrong API key (401)."""

    status = 401
    default_code = "unauthorized"


class ModelNotFound(SidecarApiError):
    """No model of that id is served (404)."""

    status = 404
    default_code = "model_not_found"


class RouteNotFound(SidecarApiError):
    """No such path (404)."""

    status = 404
    default_code = "not_found"


class MethodNotAllowed(SidecarApiError):
    """The path exists but not for this method (405)."""

    status = 405
    default_code = "method_not_allowed"


class RequestTimeout(SidecarApiError):
    """The request, body upload included, took longer than the front's request timeout (408)."""

    status = 408
    default_code = "request_timeout"


class PayloadTooLarge(SidecarApiError):
    """Too many inputs, a body over the byte limit, an image over the byte or pixel limit (413)."""

    status = 413
    default_code = "payload_too_large"


class UnsupportedMediaType(SidecarApiError):
    """A body that is not JSON by its Content-Type, or sent with a Content-Encoding (415)."""

    status = 415
    default_code = "unsupported_media_type"


class InputTooLong(SidecarApiError):
    """A text over the model's token limit without ``truncate`` (422)."""

    status = 422
    default_code = "input_too_long"


class Overloaded(SidecarApiError):
    """Admission bound reached: try again after ``retry_after`` seconds (429)."""

    status = 429
    default_code = "overloaded"


class ModelFailed(SidecarApiError):
    """The forward pass raised; the replica stays up and the next request is served (500)."""

    status = 500
    default_code = "model_error"


class NotReady(SidecarApiError):
    """The model has not finished loading and warming up, or is unreachable (503)."""

    status = 503
    default_code = "not_ready"
