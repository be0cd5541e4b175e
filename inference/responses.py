"""The sidecar's answers: :class:`HttpResponse`, JSON and coded-error bodies, and a model's vectors.

Every answer is written with the one JSON encoder (:mod:`inference.json_out`); every error is
``{"error": {"code", "message"}}`` with its status (and ``Retry-After`` where set).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ModelFailed, SidecarApiError
from .json_out import dumps

__all__ = ["HttpResponse", "encode_vectors", "error_response", "finite", "json_response"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


def json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> HttpResponse:
    return HttpResponse(status, dumps(payload), headers=dict(headers or {}))


def error_response(exc: SidecarApiError) -> HttpResponse:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return json_response(exc.status, exc.to_json(), headers)


def finite(values: np.ndarray | Sequence[float], what: str) -> None:
    """A model's numbers reach the caller finite or not at all: a NaN or an infinity (an fp16 overflow,
    a broken checkpoint) is a coded 500, in every encoding. The JSON encoder would write it as null,
    and base64 would carry it as bytes, both silently."""
    if not np.isfinite(np.asarray(values, dtype=np.float64)).all():
        log.error("the model returned a non-finite value in its %s", what)
        raise ModelFailed(f"the model returned a non-finite value (NaN or infinity) in its {what}")


def encode_vectors(matrix: np.ndarray, encoding: str) -> list:
    """Rows of ``matrix`` as JSON floats, or (``base64``) as OpenAI's little-endian float32 base64."""
    finite(matrix, "vectors")
    if encoding == "base64":
        rows = np.ascontiguousarray(matrix, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]
    return matrix.astype(np.float32).tolist()
