"""The dd_rag_api ``options``: one :class:`Option` each, its reader and its JSON Schema side by side.

A reader validates one option as the handlers see it (a coded 400 on bad
input, the default when absent); the schema says the same for clients (the
OpenAPI document, the MCP tool schemas). :mod:`gateway.actions.specs` lists
which options each action takes, and ``tests/test_action_specs.py`` proves
reader and schema accept the same values.

Grammars (section tipo, group slug) are the ones ingestion validates
descriptors with (:mod:`index.store.validation`), matched in full; a group is only
ever bound as a SQL parameter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.base.errors import ApiError
from gateway.base.locator import CHUNK_ID_PATTERN, parse_chunk_id
from index.store.sections import VIEW_PATTERN
from index.store.validation import GROUP_ID_PATTERN, ID_MAX, TIPO_PATTERN, FieldError, parse_id

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


def seed_tipo(options: Mapping[str, Any]) -> str:
    """The seed record's ``section_tipo`` (one tipo, required)."""
    tipo = options.get("section_tipo")
    if tipo is None:
        raise ApiError.invalid_options("Missing section_tipo")
    if not is_tipo(tipo):
        raise ApiError.invalid_options("section_tipo is not a valid tipo")
    return str(tipo)


def seed_id(options: Mapping[str, Any]) -> int:
    """The seed record's ``section_id`` (required): an integer, or ASCII digits as the archive sends."""
    sid = options.get("section_id")
    if sid is None:
        raise ApiError.invalid_options("Missing section_id")
    if isinstance(sid, str):  # the archive sends ids as strings too; ASCII digits only
        try:
            return parse_id(sid, field="section_id")
        except FieldError as exc:
            raise ApiError.invalid_options(str(exc)) from exc
    if not _is_int(sid) or sid < 0 or sid > ID_MAX:
        raise ApiError.invalid_options("section_id must be a non-negative integer")
    return int(sid)


def seed(options: Mapping[str, Any]) -> tuple[str, int]:
    """The seed record (``similar_to``, the image actions): ``section_tipo`` and ``section_id``."""
    return seed_tipo(options), seed_id(options)


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


def rerank(options: Mapping[str, Any]) -> bool | None:
    """``rerank``; None when absent (ask reranks by default, the other actions do not)."""
    value = options.get("rerank")
    if value is None:
        return None
    return flag(options, "rerank")


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


def chunk_key(options: Mapping[str, Any]) -> tuple[str, int, str, str, int]:
    """``chunk_id`` of ``read_chunk`` (required), as the chunk key it names."""
    raw = options.get("chunk_id")
    if raw is None:
        raise ApiError.invalid_options("Missing chunk_id")
    key = parse_chunk_id(raw) if isinstance(raw, str) else None
    if key is None:
        raise ApiError.invalid_options("chunk_id is not a chunk id (section-id/component/lang/index)")
    return key


# -- the declarations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option: how handlers read it (``read``) and how clients are told (``schema``, JSON Schema)."""

    name: str
    read: Callable[[Mapping[str, Any]], Any]
    schema: Mapping[str, Any]
    description: str
    required: bool = False
    mcp: bool = True  # offered to MCP tools (False: an HTTP transport option, such as streaming)
    json_schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "json_schema", {**self.schema, "description": self.description})


def _tipos() -> dict[str, Any]:
    tipo = {"type": "string", "pattern": TIPO_PATTERN}
    return {"anyOf": [tipo, {"type": "array", "items": tipo, "minItems": 1, "maxItems": MAX_SCOPE}]}


def _flag_option(name: str, description: str, *, mcp: bool = True) -> Option:
    """A boolean option that is off unless given (``flag`` refuses anything but a boolean)."""
    return Option(
        name, lambda options: flag(options, name), {"type": "boolean", "default": False}, description, mcp=mcp
    )


QUERY = Option(
    "query",
    query,
    {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS, "pattern": r"\S"},
    "What to look for, in words.",
    required=True,
)
SCOPE = Option(
    "section_tipo",
    scope,
    _tipos(),
    "Sections to search (a tipo or a list of tipos); all readable sections when absent.",
)
LIMIT = Option(
    "limit",
    limit,
    {"type": "integer", "default": DEFAULT_LIMIT},
    f"How many results; clamped to [1, {MAX_LIMIT}].",
)
GROUP = Option(
    "group",
    group,
    {"type": "string", "pattern": GROUP_ID_PATTERN},
    "An embed-group facet id (e.g. card, transcription).",
)
RERANK = Option(
    "rerank",
    rerank,
    {"type": "boolean"},
    "Reorder with the cross-encoder (each result says whether it was reranked); off by default, "
    "on in ask (RAG_ASK_RERANK).",
)
EXPLAIN = _flag_option(
    "explain",
    "Each result carries legs: its 1-based rank in each retrieval leg that found it (what fusion combined).",
)
EXPAND = Option(
    "expand",
    expand,
    {"enum": list(EXPAND_MODES)},
    "Widen each passage with the readable chunks around it (small-to-big).",
)
STREAM = _flag_option(
    "stream", "Answer as server-sent events (delta events, then one done event with the envelope).", mcp=False
)
SEED_TIPO = Option(
    "section_tipo", seed_tipo, {"type": "string", "pattern": TIPO_PATTERN}, "The seed record's section.", True
)
SEED_ID = Option(
    "section_id",
    seed_id,
    {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": ID_MAX},
            {"type": "string", "pattern": r"^[0-9]{1,19}\Z"},
        ]
    },
    f"The seed record's id: an integer, or its ASCII digits (at most {ID_MAX}).",
    required=True,
)
SIMILARITY_MODE = Option(
    "similarity_mode",
    similarity_mode,
    {"enum": list(SIMILARITY_MODES), "default": "hybrid"},
    "hybrid: looks plus the context summary; visual skips the context leg.",
)
VIEW = Option(
    "view",
    view,
    {"type": "string", "minLength": 1, "pattern": VIEW_PATTERN},
    "Only this face of the seed (obverse, reverse).",
)
NEAR_DUPLICATE = _flag_option(
    "near_duplicate", "Keep only objects at least RAG_NEAR_DUPLICATE_SIMILARITY close to the seed."
)
COMPARE_SCOPE = Option(
    "scope", compare_scope, _tipos(), "Sections compared; default the seed section's compare_scope."
)
CHUNK_ID = Option(
    "chunk_id",
    chunk_key,
    {"type": "string", "pattern": CHUNK_ID_PATTERN},
    "section-id/component/lang/index, as passages carry it (e.g. oh1-412/rag:transcription/lg-spa/3).",
    required=True,
)
MAX_AROUND = 10
BEFORE = Option(
    "before",
    lambda options: bounded_int(options, "before", 1, 0, MAX_AROUND),
    {"type": "integer", "minimum": 0, "maximum": MAX_AROUND, "default": 1},
    "Readable chunks of the same document before it.",
)
AFTER = Option(
    "after",
    lambda options: bounded_int(options, "after", 1, 0, MAX_AROUND),
    {"type": "integer", "minimum": 0, "maximum": MAX_AROUND, "default": 1},
    "Readable chunks of the same document after it.",
)
PROBED_SECTION = Option(
    "section_tipo",
    lambda options: options.get("section_tipo"),  # the probe never errs: {groups: []} for anything else
    {},
    "The section asked about; anything that is not a readable, opted-in section answers {groups: []}.",
)
