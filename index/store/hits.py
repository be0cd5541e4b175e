"""What the retrieval legs return and what they are scoped by: the store's domain types.

- :class:`ChunkHit`: one stored chunk a leg returns, with the leg's score; built from a row by
  :func:`chunk_from_row` (the fast constructor every leg and cache uses).
- :class:`Scope` and :class:`AclPushdown`: what a search may return (sections, group facet, view,
  excluded record) and the caller's ACL mirrored in SQL for recall; the gateway's gate still checks
  every row. :func:`scope_key` keys caches per scope.
- :class:`JsonMeta`: a hit's ``chunk_meta``, decoded on first read.

The SQL these scopes become is :mod:`index.search.scope_sql`; the legs are :mod:`index.search.dense_leg` and
:mod:`index.search.lexical_leg`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

__all__ = [
    "AclPushdown",
    "ChunkHit",
    "ChunkKey",
    "JsonMeta",
    "Scope",
    "chunk_from_row",
    "hit_columns",
    "identity_order",
    "scope_key",
]

ChunkKey = tuple[str, int, str, str, int]  # section_tipo, section_id, component_tipo, lang, chunk_index

_COLUMNS = """e.section_tipo, e.section_id, e.component_tipo, e.lang, e.chunk_index,
       e.source_text, e.chunk_meta, e.projects, e.parent_key"""
_IDENTITY_ORDER = "section_tipo, section_id, component_tipo, lang, chunk_index"


class JsonMeta(Mapping[str, Any]):
    """A chunk's ``chunk_meta`` as the row holds it (jsonb text), decoded on first read.

    Most hits never read it: an admin's search, and every candidate that fusion ranks below the cut,
    only need the row's columns, and a search builds ~80 hits (issue 15: the per-row ``json.loads``
    was 6-7% of the gateway's samples under load). Reads are those of the decoded object; a value
    that is not a JSON object reads as empty (the ACL then fails closed on a group chunk).
    """

    __slots__ = ("_data", "_raw")

    def __init__(self, raw: str) -> None:
        self._raw = raw
        self._data: dict[str, Any] | None = None

    @property
    def decoded(self) -> bool:
        """Whether anything has read it yet."""
        return self._data is not None

    def _decoded(self) -> dict[str, Any]:
        data = self._data
        if data is None:
            value = json.loads(self._raw)
            data = self._data = value if isinstance(value, dict) else {}
        return data

    def __getitem__(self, key: str) -> Any:
        return self._decoded()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __contains__(self, key: object) -> bool:
        return key in self._decoded()

    def get(self, key: str, default: Any = None) -> Any:
        return self._decoded().get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JsonMeta):
            other = other._decoded()
        return self._decoded() == other if isinstance(other, Mapping) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping

    def __repr__(self) -> str:
        return repr(self._decoded())

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (self._decoded(),))


@dataclass(frozen=True)
class ChunkHit:
    """One stored text chunk returned by a leg, with the leg's score (higher is better)."""

    section_tipo: str
    section_id: int
    component_tipo: str
    lang: str
    chunk_index: int
    text: str
    meta: Mapping[str, Any]
    projects: tuple[int, ...]
    parent_key: str | None
    score: float
    vector: np.ndarray | None = field(default=None, compare=False, repr=False)

    # Computed once per hit (fusion and the gate read them several times per candidate); the rows'
    # fast constructor (:func:`_chunk`) stores them directly.
    @functools.cached_property
    def key(self) -> ChunkKey:
        return (self.section_tipo, self.section_id, self.component_tipo, self.lang, self.chunk_index)

    @functools.cached_property
    def record(self) -> tuple[str, int]:
        return (self.section_tipo, self.section_id)


@dataclass(frozen=True)
class AclPushdown:
    """The caller's ACL as SQL filters (built by the gateway from its principal).

    ``perms`` maps ``section`` and ``section/component`` to levels; ``projects``
    None means every project. Mirrors the gateway's gate exactly: section read
    >= 1, every contributor of a group chunk readable (an empty or missing list
    fails closed), per-component level for other chunks, a shared project.
    """

    perms: Mapping[str, int]
    projects: tuple[int, ...] | None


@dataclass(frozen=True)
class Scope:
    """What a search may return, besides the ACL: sections, one group facet, one record excluded."""

    section_tipos: tuple[str, ...] | None = None
    group: str | None = None  # narrows to component_tipo 'rag:<group>'
    exclude_record: tuple[str, int] | None = None
    acl: AclPushdown | None = None  # None: no ACL push-down (admins)
    view: str | None = None  # image rows: one face (obverse, reverse)


def scope_key(scope: Scope) -> Hashable:
    """A hashable key of a scope's filters, for the caches that keep something per scope."""
    acl = None
    if scope.acl is not None:
        acl = (tuple(sorted(scope.acl.perms.items())), scope.acl.projects)
    return (scope.section_tipos, scope.group, scope.view, scope.exclude_record, acl)


def hit_columns() -> str:
    """The columns (alias ``e``) :func:`chunk_from_row` reads."""
    return _COLUMNS


def identity_order() -> str:
    """The tie order of every leg: the chunk's identity."""
    return _IDENTITY_ORDER


def chunk_from_row(row: asyncpg.Record, score: float, vector: np.ndarray | None = None) -> ChunkHit:
    """A :class:`ChunkHit` from a row selected with :func:`hit_columns`."""
    return _chunk(row, score, vector)


_new_object = object.__new__


def _chunk(row: asyncpg.Record, score: float, vector: np.ndarray | None = None) -> ChunkHit:
    """The hit of a row whose first columns are :data:`_COLUMNS`, in their order.

    A search turns ~80 rows into hits (issue 15: 11% of the gateway's samples under load), so the
    frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) and the columns' lookups
    by name are skipped: the same fields, set at once, read by position.
    """
    tipo, section_id, component, lang, index = row[0], row[1], row[2], row[3], row[4]
    meta, projects = row[6], row[7]
    hit = _new_object(ChunkHit)
    hit.__dict__.update(
        section_tipo=tipo,
        section_id=section_id,
        component_tipo=component,
        lang=lang,
        chunk_index=index,
        text=row[5],
        meta=JsonMeta(meta) if isinstance(meta, str) else dict(meta or {}),
        projects=tuple(projects) if projects else (),
        parent_key=row[8],
        score=score,
        vector=vector,
        key=(tipo, section_id, component, lang, index),
        record=(tipo, section_id),
    )
    return hit
