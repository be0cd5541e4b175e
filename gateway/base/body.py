"""Reading a JSON request body from an untrusted client: the one place the gateway's limits live.

In order, each a coded envelope error (never a 500):

- the declared type is JSON (415 ``request.unsupported_media_type``; a missing
  ``Content-Type`` is read as JSON, as many API clients omit it);
- the content coding is ``identity`` or ``gzip`` (415 otherwise); aiohttp's
  own decompression is off (see :mod:`gateway.web.server`) so a body that is not
  gzip is a 400 ``request.invalid_encoding`` here instead of a dropped
  connection, and the inflated size obeys the same byte limit as a plain body
  (a gzip bomb is a 413);
- the body arrives within ``RAG_GATEWAY_BODY_TIMEOUT`` (408 ``request.timeout``:
  a slow-loris body does not hold a handler forever);
- the JSON itself, via :func:`inference.strict_json.loads_strict`: strict UTF-8,
  nesting, number length, and no NUL or lone surrogate in any string or key,
  since PostgreSQL rejects both in text and jsonb.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from aiohttp import web

from gateway.base.errors import ApiError, ClientGone
from gateway.base.resources import SETTINGS_KEY
from inference.strict_json import JsonRejected, loads_strict

__all__ = ["read_json"]

_REASON_CODES = {
    "invalid_json": "request.invalid_json",
    "too_deep": "request.json_too_deep",
    "number_too_long": "request.number_too_long",
    "invalid_text": "request.invalid_text",
}


def _check_media_type(request: web.Request) -> str:
    declared = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if declared and declared != "application/json" and not declared.endswith("+json"):
        raise ApiError(
            "request.unsupported_media_type", f"Content-Type {declared!r}: the body must be application/json"
        )
    coding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if coding not in ("identity", "gzip"):
        raise ApiError("request.unsupported_media_type", f"Content-Encoding {coding!r}: use gzip or none")
    return coding


def _gunzip(raw: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only
    try:
        out = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ApiError("request.invalid_encoding", "Content-Encoding is gzip but the body is not") from exc
    if len(out) > limit:
        raise ApiError("request.payload_too_large", f"the inflated body is over {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ApiError("request.invalid_encoding", "the gzip body is truncated or has trailing data")
    return out


async def read_json(request: web.Request) -> Any:
    """The request's JSON body, checked as the module says; :class:`ClientGone` when the client left."""
    coding = _check_media_type(request)
    settings = request.app[SETTINGS_KEY]
    try:
        async with asyncio.timeout(settings.body_timeout):
            raw = await request.read()
    except TimeoutError as exc:
        raise ApiError(
            "request.timeout", f"the body did not arrive within {settings.body_timeout:g}s"
        ) from exc
    except (ConnectionResetError, web.RequestPayloadError) as exc:  # hung up mid-body
        raise ClientGone(str(exc)) from exc
    if coding == "gzip":
        raw = _gunzip(raw, settings.max_body_bytes)
    try:
        return loads_strict(raw, forbid_nul=True)
    except JsonRejected as exc:
        raise ApiError(_REASON_CODES[exc.reason], str(exc)) from None
