"""Safe image decoding, the one definition: base64 -> bytes -> PIL RGB image, with byte, pixel and
decompression-bomb limits.

The pixel count is read from the header (``Image.open`` is lazy) and checked before any pixel is
decoded, so a 50 000 x 50 000 PNG of a few kilobytes is refused without allocating it.

Two layers:

- :func:`read_base64` and :func:`read_image` raise :class:`ImageDecodeError` with a stable
  ``reason``. They are a public helper of ``inference``: ingestion (``index/ingest/images.py``) decodes the
  archive's images with them, so the bomb guard exists once.
- :func:`decode_base64` and :func:`open_image` are the sidecar's own: the same checks, answered as
  its coded HTTP errors (``images[i] ...`` with ``invalid_base64``, ``image_too_large``, ...).
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import BadRequest, ErrorCode, PayloadTooLarge, SidecarApiError

__all__ = [
    "ImageDecodeError",
    "decode_base64",
    "open_image",
    "read_base64",
    "read_image",
]


class ImageDecodeError(ValueError):
    """Bytes that are not a usable image. ``reason`` is one of ``invalid_type``, ``invalid_base64``,
    ``too_large``, ``empty``, ``too_many_pixels``, ``not_an_image``, ``corrupt``; ``message`` is a
    predicate such as ``"is over the 1024-byte limit"``, for the caller to put a subject before."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # crosses process pools and Ray intact
        return (type(self), (self.reason, self.message))


def read_base64(data: object, max_bytes: int) -> bytes:
    """Strict base64 (standard alphabet, optional data-URL prefix) -> bytes, within ``max_bytes``."""
    if not isinstance(data, str):
        raise ImageDecodeError("invalid_type", "must be a base64 string")
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    if len(data) > (max_bytes + 2) // 3 * 4 + 4:
        raise ImageDecodeError("too_large", f"is over the {max_bytes}-byte limit")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageDecodeError("invalid_base64", "is not valid base64") from exc
    if not raw:
        raise ImageDecodeError("empty", "is empty")
    if len(raw) > max_bytes:
        raise ImageDecodeError("too_large", f"is over the {max_bytes}-byte limit")
    return raw


def read_image(raw: bytes, max_pixels: int, *, orient: bool = False) -> Image.Image:
    """Decode ``raw`` to RGB after checking its header size against ``max_pixels``; ``orient``
    applies the EXIF orientation first (an archive's photographs; the sidecar embeds as sent)."""
    try:
        with warnings.catch_warnings():
            # PIL's own bomb guard warns at MAX_IMAGE_PIXELS and raises at twice that; ours is stricter
            # and comes first, but an oversized header must never reach a decoder via a warning.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            width, height = image.size
            if width * height > max_pixels:
                raise ImageDecodeError(
                    "too_many_pixels", f"is {width}x{height} pixels, over the {max_pixels}-pixel limit"
                )
            image.load()
            if orient:
                image = ImageOps.exif_transpose(image) or image
            return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageDecodeError("too_many_pixels", "is over the pixel limit (decompression bomb)") from exc
    except UnidentifiedImageError as exc:
        raise ImageDecodeError("not_an_image", "is not a decodable image") from exc
    except ImageDecodeError:
        raise
    except (OSError, ValueError, SyntaxError) as exc:  # truncated or corrupt data past the header
        raise ImageDecodeError("corrupt", f"could not be decoded: {exc}") from exc


# The sidecar's answer to each reason: (error class, code).
_API_ERRORS: dict[str, tuple[type[SidecarApiError], ErrorCode]] = {
    "invalid_type": (BadRequest, ErrorCode.INVALID_TYPE),
    "invalid_base64": (BadRequest, ErrorCode.INVALID_BASE64),
    "too_large": (PayloadTooLarge, ErrorCode.IMAGE_TOO_LARGE),
    "empty": (BadRequest, ErrorCode.INVALID_IMAGE),
    "too_many_pixels": (PayloadTooLarge, ErrorCode.IMAGE_TOO_MANY_PIXELS),
    "not_an_image": (BadRequest, ErrorCode.INVALID_IMAGE),
    "corrupt": (BadRequest, ErrorCode.INVALID_IMAGE),
}


def _api_error(exc: ImageDecodeError, index: int) -> SidecarApiError:
    kind, code = _API_ERRORS[exc.reason]
    return kind(f"images[{index}] {exc.message}", code=code)


def decode_base64(data: object, index: int, max_bytes: int) -> bytes:
    """:func:`read_base64` for request image ``index``, failing as the sidecar's coded error."""
    try:
        return read_base64(data, max_bytes)
    except ImageDecodeError as exc:
        raise _api_error(exc, index) from exc


def open_image(raw: bytes, index: int, max_pixels: int) -> Image.Image:
    """:func:`read_image` for request image ``index``, failing as the sidecar's coded error."""
    try:
        return read_image(raw, max_pixels)
    except ImageDecodeError as exc:
        raise _api_error(exc, index) from exc
