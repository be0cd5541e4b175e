"""The media URL allow-list: which record image URLs the drain may fetch, decided on the parsed form.

``RAG_MEDIA_BASE_URL`` lists prefixes such as ``https://media.archive.example/public/``. A record's
``images[].url`` is fetched only when, parsed once with :func:`urllib.parse.urlsplit`:

- its scheme, host and port equal one allowed base's exactly (hosts compared lower-cased, the
  port made explicit: ``127.1``, ``127.0.0.1.``, ``[::1]`` or another port never match
  ``127.0.0.1``);
- it carries no userinfo (``user@``) and no fragment (``#``);
- its raw text holds no control character, space or backslash (``urlsplit`` silently drops tab,
  CR and LF, so they are refused before parsing);
- its path, percent-decoded once as strict UTF-8, holds no dot segment (``.``, ``..``), no
  encoded slash or backslash (``%2F``, ``%5C``), no control character or NUL, and no
  percent-escape left over (double encoding such as ``%252e``);
- that decoded path starts with the base's path on a segment boundary (``/media/`` allows
  ``/media/a.jpg``, never ``/mediaX/a.jpg`` nor ``/media`` itself).

:func:`check_url` returns the one canonical URL that was checked: the decoded path re-encoded,
the query kept as given. The fetch sends exactly that string (``yarl.URL(..., encoded=True)``,
no re-normalization, no redirects), so what the server is asked for is what was allowed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, quote, unquote_to_bytes, urlsplit

__all__ = ["AllowedBase", "MediaNotAllowed", "check_client_link", "check_url", "parse_allowed_base"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters a URL's raw text may never hold: C0 controls, DEL, space, backslash. (urlsplit strips
# "\t\r\n" before parsing, so "http://h/media/\n../x" would otherwise be judged without them.)
_FORBIDDEN_RAW = re.compile(r"[\x00-\x20\x7f\\]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_SEPARATOR = re.compile(r"%(2[Ff]|5[Cc])")
_LEFTOVER_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What stays literal when the decoded path is re-encoded: RFC 3986 pchar minus "%", plus "/".
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


class MediaNotAllowed(ValueError):
    """A media source Mnemo will not read: a URL (or allow-list entry) failing a rule above, a path
    outside ``RAG_MEDIA_ROOT``, or a source kind not configured. The message names the rule."""


@dataclass(frozen=True)
class AllowedBase:
    """One ``RAG_MEDIA_BASE_URL`` entry, parsed: scheme, host, explicit port, decoded path ending in /."""

    scheme: str
    host: str
    port: int
    path: str

    def admits(self, scheme: str, host: str, port: int, path: str) -> bool:
        return (scheme, host, port) == (self.scheme, self.host, self.port) and path.startswith(self.path)


@dataclass(frozen=True)
class _Parsed:
    scheme: str
    host: str
    port: int
    path: str  # percent-decoded
    query: str  # as given (still encoded)

    def canonical(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        netloc = host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"
        url = f"{self.scheme}://{netloc}{quote(self.path, safe=_PATH_SAFE)}"
        return f"{url}?{self.query}" if self.query else url


def _check_raw(url: str, noun: str) -> None:
    """The raw text's rules, for a fetched URL and a client link alike (``noun`` names it)."""
    if not isinstance(url, str) or not url:
        raise MediaNotAllowed(f"the {noun} is empty")
    if _FORBIDDEN_RAW.search(url):
        raise MediaNotAllowed(f"the {noun} holds a control character, a space or a backslash")


def _split(url: str, noun: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL" and the like
        raise MediaNotAllowed(f"the {noun} does not parse: {exc}") from None


def _parse(url: str) -> _Parsed:
    _check_raw(url, "URL")
    if "#" in url:
        raise MediaNotAllowed("the URL holds a fragment (#)")
    parts = _split(url, "URL")
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise MediaNotAllowed("only http and https URLs are fetched")
    if "@" in parts.netloc:
        raise MediaNotAllowed("the URL holds userinfo (user@host)")
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise MediaNotAllowed(f"the URL's port is not valid: {exc}") from None
    host = (parts.hostname or "").lower()
    if not host:
        raise MediaNotAllowed("the URL has no host")
    return _Parsed(scheme, host, port, _decoded_path(parts.path or "/"), parts.query)


def _decoded_path(raw: str) -> str:
    if _BAD_ESCAPE.search(raw):
        raise MediaNotAllowed("the path holds a malformed percent-escape")
    if _ENCODED_SEPARATOR.search(raw):
        raise MediaNotAllowed("the path holds an encoded slash or backslash (%2F, %5C)")
    try:
        path = unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise MediaNotAllowed("the path's percent-escapes are not UTF-8") from None
    if _CONTROL.search(path):
        raise MediaNotAllowed("the path holds a control character or NUL")
    if _LEFTOVER_ESCAPE.search(path):
        raise MediaNotAllowed("the path is percent-encoded twice")
    if not path.startswith("/"):
        raise MediaNotAllowed("the path is not absolute")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise MediaNotAllowed("the path holds a dot segment (. or ..)")
    return path


def parse_allowed_base(entry: str) -> AllowedBase:
    """One allow-list entry, held to the same rules as a URL; its path is made to end in ``/``."""
    parsed = _parse(entry.strip())
    if parsed.query:
        raise MediaNotAllowed("an allowed base may not hold a query")
    path = parsed.path if parsed.path.endswith("/") else parsed.path + "/"
    return AllowedBase(parsed.scheme, parsed.host, parsed.port, path)


def check_url(url: str, allowed: Sequence[AllowedBase]) -> str:
    """The canonical form of ``url`` when an allowed base admits it; :class:`MediaNotAllowed` otherwise."""
    if not allowed:
        raise MediaNotAllowed("RAG_MEDIA_BASE_URL is not set: URL images are refused")
    parsed = _parse(url)
    if not any(base.admits(parsed.scheme, parsed.host, parsed.port, parsed.path) for base in allowed):
        raise MediaNotAllowed(f"{url!r} is not under an allowed RAG_MEDIA_BASE_URL")
    return parsed.canonical()


def check_client_link(url: str) -> None:
    """A URL Mnemo never fetches but hands to clients (an image's ``thumb_url``, shown by the archive's
    UI and the console): an http(s) URL with a host and no userinfo, or a path on the gateway's own
    origin (``/...``, not ``//host``). ``javascript:``, ``data:`` and control characters are refused."""
    _check_raw(url, "link")
    if url.startswith("/") and not url.startswith("//"):
        return
    parts = _split(url, "link")
    if parts.scheme.lower() not in _DEFAULT_PORTS or not parts.hostname:
        raise MediaNotAllowed("a link must be an http(s) URL with a host, or a path starting with /")
    if "@" in parts.netloc:
        raise MediaNotAllowed("the link holds userinfo (user@host)")
