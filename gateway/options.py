"""Validation of dd_rag_api ``options``: one function per option, each raising a coded 400.

Grammars (section tipo, group slug) are the ones ingestion validates
descriptors with (:mod:`index.validation`), matched in full; a group is only
ever bound as a SQL parameter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from index.sections import VIEW_PATTERN
from index.validation import GROUP_ID_PATTERN, ID_MAX, TIPO_PATTERN, FieldError, parse_id

from .errors import ApiError

DEFAULT_LIMIT = 10
MAX_LIMIT = 50
MAX_QUERY_CHARS = 4000
MAX_SCOPE = 64

_TIPO_RE = re.compile(TIPO_PATTERN)
_GROUP_RE = re.compile(GROUP_ID_PATTERN)
_VIEW_RE = re.compile(VIEW_PATTERN)
SIMILARITY_MODES = ("hybrid", "visual")


def is_tipo(value: Any) -> bool:
    return isinstance(value, str) and _TIPO_RE.fullmatch(value) is not None


def is_group(value: Any) -> bool:
    return isinstance(value, str) and _GROUP_RE.fullmatch(value) is not None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def query(options: Mapping[str, Any]) -> str:
    value = options.get("query")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ApiError.invalid_options("Missing query")
    if not isinstance(value, str):
        raise ApiError.invalid_options("query must be a string")
    if len(value) > MAX_QUERY_CHARS:
        raise ApiError.invalid_options(f"query is longer than {MAX_QUERY_CHARS} characters")
    return value.strip()


def limit(options: Mapping[str, Any]) -> int:
    """``limit`` clamped to [1, 50]; 10 when absent."""
    value = options.get("limit")
    if value is None:
        return DEFAULT_LIMIT
    if not _is_int(value):
        raise ApiError.invalid_options("limit must be an integer")
    return max(1, min(MAX_LIMIT, value))


def scope(options: Mapping[str, Any]) -> tuple[str, ...] | None:
    """``section_tipo`` as a string or an array of strings; None when absent."""
    value = options.get("section_tipo")
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > MAX_SCOPE:
        raise ApiError.invalid_options(f"section_tipo must be a tipo or a list of 1..{MAX_SCOPE} tipos")
    if not all(is_tipo(t) for t in items):
        raise ApiError.invalid_options("section_tipo is not a valid tipo")
    return tuple(dict.fromkeys(items))


def group(options: Mapping[str, Any]) -> str | None:
    value = options.get("group")
    if value is None:
        return None
    if not is_group(value):
        raise ApiError.invalid_options("group is not a valid embed-group id")
    return value


def seed(options: Mapping[str, Any]) -> tuple[str, int]:
    """The seed record of ``similar_to``: ``section_tipo`` (one tipo) and ``section_id``."""
    tipo = options.get("section_tipo")
    if tipo is None:
        raise ApiError.invalid_options("Missing section_tipo")
    if not is_tipo(tipo):
        raise ApiError.invalid_options("section_tipo is not a valid tipo")
    sid = options.get("section_id")
    if sid is None:
        raise ApiError.invalid_options("Missing section_id")
    if isinstance(sid, str):  # the archive sends ids as strings too; ASCII digits only
        try:
            return tipo, parse_id(sid, field="section_id")
        except FieldError as exc:
            raise ApiError.invalid_options(str(exc)) from exc
    if not _is_int(sid) or sid < 0 or sid > ID_MAX:
        raise ApiError.invalid_options("section_id must be a non-negative integer")
    return tipo, sid


def similarity_mode(options: Mapping[str, Any]) -> str:
    """``similarity_mode``: ``hybrid`` (default: looks plus the context summary) or ``visual``."""
    value = options.get("similarity_mode", "hybrid")
    if value not in SIMILARITY_MODES:
        raise ApiError.invalid_options("similarity_mode must be visual or hybrid")
    return str(value)


def view(options: Mapping[str, Any]) -> str | None:
    """``view``: one image face (``obverse``, ``reverse``); None when absent."""
    value = options.get("view")
    if value is None:
        return None
    if not isinstance(value, str) or not value or _VIEW_RE.fullmatch(value) is None:
        raise ApiError.invalid_options("view is not a valid view name")
    return value


def flag(options: Mapping[str, Any], name: str, default: bool = False) -> bool:
    """A boolean option (``rerank``, ``stream``, ``near_duplicate``); ``default`` when absent.
    Anything but a JSON boolean is refused."""
    value = options.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError.invalid_options(f"{name} must be a boolean")
    return value


def compare_scope(options: Mapping[str, Any]) -> tuple[str, ...] | None:
    """``scope`` of ``similar_objects`` (a tipo or a list); None: the seed section's compare_scope."""
    value = options.get("scope")
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > MAX_SCOPE:
        raise ApiError.invalid_options(f"scope must be a tipo or a list of 1..{MAX_SCOPE} tipos")
    if not all(is_tipo(t) for t in items):
        raise ApiError.invalid_options("scope is not a valid tipo")
    return tuple(dict.fromkeys(items))


EXPAND_MODES = ("neighbours", "parent")


def expand(options: Mapping[str, Any]) -> str | None:
    """``expand``: ``"neighbours"`` or ``"parent"`` (small-to-big); None when absent."""
    value = options.get("expand")
    if value is None:
        return None
    if value not in EXPAND_MODES:
        raise ApiError.invalid_options('expand must be "neighbours" or "parent"')
    return str(value)


def bounded_int(options: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    """An integer option that must lie in [low, high] (out of range is an error, not a clamp)."""
    value = options.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise ApiError.invalid_options(f"{name} must be an integer in [{low}, {high}]")
    return int(value)
