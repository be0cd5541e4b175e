"""Record images: where their bytes come from, and how they are prepared for embedding.

- **Sources** (:func:`check_source`, :func:`load_source`): base64 ``data``, a
  ``path`` under ``RAG_MEDIA_ROOT`` (a path that resolves outside it, symlinks
  included, is refused), or a ``url`` that an allow-listed
  ``RAG_MEDIA_BASE_URL`` prefix admits on its parsed, decoded form
  (:mod:`index.media_urls` states the rules). Nothing else is ever read or fetched.
- **Preparation** (:func:`prepare_image`, pure and picklable, so the bulk job
  runs it in a process pool): the pixel count is checked from the header
  before any pixel is decoded (decompression bombs stop there), EXIF
  orientation is applied, the image becomes RGB, is downsized to
  ``RAG_IMAGE_MAX_PX`` on its longest side and re-encoded as JPEG (what the
  sidecar embeds), and a thumbnail is made when asked for.
- The **content hash** is the sha256 of the original bytes: an unchanged file
  is never decoded or embedded again.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yarl
from PIL import Image

from index.media_urls import MediaNotAllowed, check_url
from index.settings import MediaSettings
from inference.images import ImageDecodeError, read_base64, read_image

__all__ = [
    "JPEG_QUALITY",
    "ImageRejected",
    "MediaNotAllowed",
    "PreparedImage",
    "check_source",
    "content_hash",
    "decode_data",
    "load_source",
    "prepare_file",
    "prepare_image",
    "resolve_media_path",
]

JPEG_QUALITY = 90
THUMBNAIL_QUALITY = 80
SOURCE_KEYS = ("data", "path", "url")


class ImageRejected(ValueError):
    """Bytes that are not a usable image (corrupt, not an image, too large); ``reason`` is a stable slug."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Crosses the bulk job's process boundary: rebuild from both fields, not from args.
        return (type(self), (self.reason, self.message))


@dataclass(frozen=True)
class PreparedImage:
    """An image ready to embed: its identity (hash of the original bytes) and its downsized JPEG."""

    content_hash: str
    jpeg: bytes
    width: int
    height: int
    thumbnail: bytes | None = None


def content_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def decode_data(data: str, max_bytes: int) -> bytes:
    """Strict base64 (optional ``data:`` URL prefix) within ``max_bytes``."""
    try:
        return read_base64(data, max_bytes)
    except ImageDecodeError as exc:
        raise _rejected(exc) from exc


def _rejected(exc: ImageDecodeError) -> ImageRejected:
    return ImageRejected(exc.reason, f"the image {exc.message}")


def resolve_media_path(root: str | Path | None, relative: str, *, root_name: str = "RAG_MEDIA_ROOT") -> Path:
    """``relative`` under ``root``, resolved (symlinks followed); refused when it leaves the root
    (``root_name`` names that root in the refusal)."""
    if not root:
        raise MediaNotAllowed("RAG_MEDIA_ROOT is not set: path images are refused")
    base = Path(root).resolve()
    if "\x00" in relative:
        raise MediaNotAllowed("the path holds a NUL byte")
    target = (base / relative).resolve()
    if target != base and base not in target.parents:
        raise MediaNotAllowed(f"{relative!r} resolves outside {root_name}")
    return target


def _source_kind(image: Mapping[str, Any]) -> str:
    """Which of ``data``, ``path``, ``url`` the image gives; exactly one is required."""
    given = [k for k in SOURCE_KEYS if image.get(k) is not None]
    if len(given) != 1:
        raise MediaNotAllowed("give exactly one of data, path, url")
    return given[0]


def check_source(image: Mapping[str, Any], media: MediaSettings) -> str:
    """Validate where an image's bytes come from (at intake, before it is queued); returns the kind."""
    kind = _source_kind(image)
    if kind == "data":
        decode_data(image["data"], media.image_max_bytes)
    elif kind == "path":
        path = resolve_media_path(media.media_root, image["path"])
        if not path.is_file():
            raise ImageRejected("not_found", f"{image['path']!r} is not a file under RAG_MEDIA_ROOT")
    else:
        check_url(image["url"], media.allowed_bases)
    return kind


async def load_source(image: Mapping[str, Any], media: MediaSettings, session: Any = None) -> bytes:
    """The original bytes of a record image (``session``: an aiohttp session for URLs)."""
    kind = _source_kind(image)
    if kind == "data":
        return decode_data(image["data"], media.image_max_bytes)
    if kind == "path":
        path = resolve_media_path(media.media_root, image["path"])
        return _read_file(path, media.image_max_bytes)
    url = check_url(image["url"], media.allowed_bases)
    if session is None:
        raise MediaNotAllowed("no HTTP session to fetch URL images with")
    # Exactly the checked URL goes out: encoded=True stops yarl from re-normalizing it, and
    # redirects, which could leave the allow-list, are not followed.
    async with session.get(
        yarl.URL(url, encoded=True), allow_redirects=False, timeout=aiohttp.ClientTimeout(total=30)
    ) as r:
        if r.status != 200:
            raise ImageRejected("fetch_failed", f"GET {url} answered {r.status}")
        raw = await r.content.read(media.image_max_bytes + 1)
    if len(raw) > media.image_max_bytes:
        raise ImageRejected("too_large", f"over the {media.image_max_bytes}-byte image limit")
    return raw


def _read_file(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as fh:
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError as exc:
        raise ImageRejected("not_found", f"{path} does not exist") from exc
    except OSError as exc:
        raise ImageRejected("unreadable", f"{path}: {exc.strerror}") from exc
    if len(raw) > max_bytes:
        raise ImageRejected("too_large", f"{path} is over the {max_bytes}-byte image limit")
    if not raw:
        raise ImageRejected("empty", f"{path} is empty")
    return raw


def _encode_jpeg(image: Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def prepare_image(
    raw: bytes, *, max_px: int, max_pixels: int, thumbnail_px: int | None = None
) -> PreparedImage:
    """Decode (pixel limit first), orient, RGB, downsize and re-encode; optionally a thumbnail."""
    try:
        image = read_image(raw, max_pixels, orient=True)
    except ImageDecodeError as exc:
        raise _rejected(exc) from exc
    image.thumbnail((max_px, max_px), Image.Resampling.LANCZOS)
    thumb = None
    if thumbnail_px:
        small = image.copy()
        small.thumbnail((thumbnail_px, thumbnail_px), Image.Resampling.LANCZOS)
        thumb = _encode_jpeg(small, THUMBNAIL_QUALITY)
    return PreparedImage(content_hash(raw), _encode_jpeg(image, JPEG_QUALITY), *image.size, thumb)


def prepare_file(
    path: str, known_hash: str | None, *, max_bytes: int, max_px: int, max_pixels: int, thumbnail_px: int
) -> PreparedImage | str | ImageRejected:
    """The bulk job's worker step: read, hash, and prepare unless the hash is ``known_hash``.

    Returns the hash alone for an unchanged file (nothing decoded), and a
    rejection as a value (it crosses a process boundary without a traceback).
    """
    try:
        raw = _read_file(Path(path), max_bytes)
        digest = content_hash(raw)
        if digest == known_hash:
            return digest
        return prepare_image(raw, max_px=max_px, max_pixels=max_pixels, thumbnail_px=thumbnail_px)
    except ImageRejected as exc:
        return exc
