"""The read side of the embeddings store: the retrieval legs as SQL over one model's partition.

- :func:`dense_search`: cosine distance over the partition's HNSW index, with
  pgvector 0.8 iterative index scans (``hnsw.iterative_scan = relaxed_order``)
  so WHERE filters do not starve the result, re-sorted exactly afterwards.
- :func:`lexical_search`: OR semantics over the accent-folded tsvector, ranked
  by BM25 (IDF from the partition's document frequencies, term-frequency
  saturation, length normalization). A rare term (a name, an inventory number)
  outweighs common words, unlike ``ts_rank`` over AND-ed terms. The query's
  stop words (its guessed language's) are dropped; the index keeps every word.
- :func:`sparse_search`: learned-sparse inner product (bge-m3 lexical weights).
- :func:`seed_chunks`: a stored record's chunks with their vectors (``similar_to``).

Every leg takes a :class:`Scope` (section scope, group facet, excluded record)
and an optional :class:`AclPushdown` that mirrors the gateway's ACL in SQL so
recall does not suffer; the gateway's gate still checks every row it returns.
Values are always bound parameters; identifiers come from ``rag_models``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

from .partitions import ModelPartition
from .stopwords import strip_stopwords
from .text import fold

__all__ = [
    "AclPushdown",
    "ChunkHit",
    "CorpusStats",
    "Scope",
    "dense_search",
    "lexical_search",
    "query_terms",
    "seed_chunks",
    "sparse_search",
]

Executor = asyncpg.Connection | asyncpg.Pool
ChunkKey = tuple[str, int, str, str, int]  # section_tipo, section_id, component_tipo, lang, chunk_index

# BM25 parameters (Robertson/Lucene defaults, as in bm25s).
BM25_K1 = 1.5
BM25_B = 0.75
# Terms in more than this share of chunks still score, but do not widen the match set on their own.
COMMON_TERM_SHARE = 0.5

_COLUMNS = """e.section_tipo, e.section_id, e.component_tipo, e.lang, e.chunk_index,
       e.source_text, e.chunk_meta, e.projects, e.parent_key"""
_IDENTITY_ORDER = "section_tipo, section_id, component_tipo, lang, chunk_index"


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

    @property
    def key(self) -> ChunkKey:
        return (self.section_tipo, self.section_id, self.component_tipo, self.lang, self.chunk_index)

    @property
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


class _Sql:
    """Accumulates WHERE clauses with positional parameters."""

    def __init__(self, params: Sequence[Any] = (), modality: str = "text") -> None:
        self.params: list[Any] = list(params)
        self.where: list[str] = [f"e.modality = {self.bind(_modality(modality))}"]

    def bind(self, value: Any) -> str:
        self.params.append(value)
        return f"${len(self.params)}"

    def add(self, clause: str) -> None:
        self.where.append(clause)

    def apply_scope(self, scope: Scope) -> None:
        if scope.section_tipos is not None:
            self.add(f"e.section_tipo = ANY({self.bind(list(scope.section_tipos))}::text[])")
        if scope.group is not None:
            self.add(f"e.component_tipo = {self.bind('rag:' + scope.group)}")
        if scope.view is not None:
            self.add(f"e.view = {self.bind(scope.view)}")
        if scope.exclude_record is not None:
            tipo, sid = scope.exclude_record
            self.add(f"NOT (e.section_tipo = {self.bind(tipo)} AND e.section_id = {self.bind(sid)})")
        if scope.acl is not None:
            self._apply_acl(scope.acl)

    def _apply_acl(self, acl: AclPushdown) -> None:
        readable = sorted(k for k, v in acl.perms.items() if "/" not in k and v >= 1)
        self.add(f"e.section_tipo = ANY({self.bind(readable)}::text[])")
        if acl.projects is not None:
            self.add(f"e.projects && {self.bind(list(acl.projects))}::int[]")
        perms = self.bind(json.dumps(dict(acl.perms)))
        # level(section, component): the explicit "section/component" entry, else the section's.
        level = "coalesce(({p}::jsonb ->> ({s} || '/' || {c}))::int, ({p}::jsonb ->> {s})::int, 0)"
        contributor = "c.v #>> '{}'"
        c_section = f"CASE WHEN strpos({contributor}, '/') > 0 THEN split_part({contributor}, '/', 1) ELSE e.section_tipo END"
        c_component = f"CASE WHEN strpos({contributor}, '/') > 0 THEN split_part({contributor}, '/', 2) ELSE {contributor} END"
        self.add(
            f"""CASE WHEN e.component_tipo LIKE 'rag:%' THEN
                  jsonb_typeof(e.chunk_meta -> 'contributors') = 'array'
                  AND jsonb_array_length(e.chunk_meta -> 'contributors') > 0
                  AND NOT EXISTS (
                      SELECT 1 FROM jsonb_array_elements(e.chunk_meta -> 'contributors') AS c(v)
                      WHERE jsonb_typeof(c.v) <> 'string'
                         OR (c.v #>> '{{}}') ~ '(^$|^/|/$|/.*/)'
                         OR {level.format(p=perms, s=c_section, c=c_component)} < 1)
                ELSE {level.format(p=perms, s="e.section_tipo", c="e.component_tipo")} >= 1
              END"""
        )

    @property
    def where_sql(self) -> str:
        return " AND ".join(f"({w})" for w in self.where)


def _modality(modality: str) -> str:
    if modality not in ("text", "image"):
        raise ValueError(f"modality must be text or image, not {modality!r}")
    return modality


def _chunk(row: asyncpg.Record, score: float, vector: np.ndarray | None = None) -> ChunkHit:
    meta = row["chunk_meta"]
    return ChunkHit(
        section_tipo=row["section_tipo"],
        section_id=row["section_id"],
        component_tipo=row["component_tipo"],
        lang=row["lang"],
        chunk_index=row["chunk_index"],
        text=row["source_text"],
        meta=json.loads(meta) if isinstance(meta, str) else dict(meta or {}),
        projects=tuple(row["projects"] or ()),
        parent_key=row["parent_key"],
        score=score,
        vector=vector,
    )


async def dense_search(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    vector: np.ndarray,
    scope: Scope,
    limit: int,
    *,
    ef_search: int = 100,
    max_scan_tuples: int = 20000,
    modality: str = "text",
    with_vectors: bool = False,
) -> list[ChunkHit]:
    """Nearest chunks by cosine distance; score = ``1 - distance`` (cosine similarity).

    Runs in its own transaction so the ``SET LOCAL`` scan settings stay local.
    ``relaxed_order`` lets the HNSW scan continue past filtered-out rows; the
    outer query restores exact distance order (ties by chunk identity).
    """
    sql = _Sql([np.asarray(vector, dtype=np.float32)], modality)
    sql.apply_scope(scope)
    cast = partition.cast
    vectors = ", e.embedding" if with_vectors else ""
    query = f"""
        WITH nn AS MATERIALIZED (
            SELECT {_COLUMNS}{vectors}, e.embedding::{cast} <=> $1::{cast} AS distance
            FROM {partition.table} e
            WHERE {sql.where_sql}
            ORDER BY e.embedding::{cast} <=> $1::{cast}
            LIMIT {int(limit)})
        SELECT * FROM nn ORDER BY distance, {_IDENTITY_ORDER}"""
    async with conn.transaction(readonly=True):
        await conn.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        await conn.execute(f"SET LOCAL hnsw.ef_search = {min(1000, max(int(ef_search), int(limit)))}")
        await conn.execute(f"SET LOCAL hnsw.max_scan_tuples = {int(max_scan_tuples)}")
        rows = await conn.fetch(query, *sql.params)
    return [
        _chunk(r, 1.0 - float(r["distance"]), _as_array(r["embedding"]) if with_vectors else None)
        for r in rows
    ]


def _tsquery_literal(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


async def query_terms(db: Executor, query: str) -> list[str]:
    """The distinct lexemes of a query, parsed exactly as the lexical column is (folded, 'simple')."""
    rows = await db.fetch(
        "SELECT lexeme FROM unnest(to_tsvector('simple'::regconfig, $1)) ORDER BY lexeme", fold(query)
    )
    return [r["lexeme"] for r in rows]


@dataclass
class _Stats:
    n: int
    avgdl: float
    at: float
    df: dict[str, int] = field(default_factory=dict)


class CorpusStats:
    """BM25 statistics (chunk count, mean length, document frequencies) per partition and section scope, cached.

    A query scoped to sections is scored with those sections' statistics (a
    term common in one collection can be rare in another); an unscoped query
    with the whole partition's. Statistics older than ``ttl`` seconds are
    recomputed; document frequencies are counted per term on first use (a GIN
    index probe) and cached with them. Corpus statistics drift slowly, so a
    short staleness only nudges scores.
    """

    def __init__(self, ttl: float = 60.0) -> None:
        self.ttl = ttl
        self._stats: dict[tuple[str, tuple[str, ...] | None, str], _Stats] = {}

    def invalidate(self) -> None:
        self._stats.clear()

    async def _base(
        self,
        db: Executor,
        partition: ModelPartition,
        sections: tuple[str, ...] | None,
        modality: str = "text",
    ) -> _Stats:
        now = time.monotonic()
        key = (partition.partition, sections, modality)
        cached = self._stats.get(key)
        if cached is not None and now - cached.at < self.ttl:
            return cached
        row = await db.fetchrow(
            f"""SELECT count(*) AS n,
                       coalesce(avg((SELECT sum(coalesce(array_length(u.positions, 1), 1))
                                     FROM unnest(e.lexical) u)), 0) AS avgdl
                FROM {partition.table} e
                WHERE e.modality = $2 AND ($1::text[] IS NULL OR e.section_tipo = ANY($1::text[]))""",
            None if sections is None else list(sections),
            _modality(modality),
        )
        stats = _Stats(n=int(row["n"]), avgdl=float(row["avgdl"] or 0.0), at=now)
        for old in [k for k, v in self._stats.items() if now - v.at >= self.ttl]:  # scopes vary: prune
            del self._stats[old]
        self._stats[key] = stats
        return stats

    async def idf(
        self,
        db: Executor,
        partition: ModelPartition,
        terms: Sequence[str],
        sections: tuple[str, ...] | None = None,
        modality: str = "text",
    ) -> tuple[_Stats, dict[str, float]]:
        """BM25 IDF per term, ``ln(1 + (N - df + 0.5) / (df + 0.5))``; terms absent from the corpus dropped."""
        sections = None if sections is None else tuple(sorted(set(sections)))
        stats = await self._base(db, partition, sections, modality)
        missing = [t for t in terms if t not in stats.df]
        if missing:
            rows = await db.fetch(
                f"""SELECT t.term, (SELECT count(*) FROM {partition.table} e
                                    WHERE e.modality = $4 AND e.lexical @@ t.q
                                      AND ($3::text[] IS NULL OR e.section_tipo = ANY($3::text[]))) AS df
                    FROM unnest($1::text[], $2::tsquery[]) AS t(term, q)""",
                missing,
                [_tsquery_literal(t) for t in missing],
                None if sections is None else list(sections),
                _modality(modality),
            )
            for r in rows:
                stats.df[r["term"]] = int(r["df"])
        out = {}
        for t in terms:
            df = stats.df.get(t, 0)
            if df > 0:
                out[t] = math.log(1.0 + (stats.n - df + 0.5) / (df + 0.5))
        return stats, out


async def lexical_search(
    db: Executor,
    partition: ModelPartition,
    query: str,
    scope: Scope,
    limit: int,
    *,
    stats: CorpusStats,
    modality: str = "text",
) -> list[ChunkHit]:
    """BM25 over the folded tsvector with OR semantics; score = the BM25 sum.

    The match set is the chunks holding any query term rarer than
    :data:`COMMON_TERM_SHARE` of the corpus (all terms when none is), so a
    query of common words cannot turn into a full scan; every query term still
    contributes to the score of the chunks that match.
    """
    terms = strip_stopwords(await query_terms(db, query))
    if not terms:
        return []
    corpus, idf = await stats.idf(db, partition, terms, scope.section_tipos, modality)
    if not idf or corpus.n == 0:
        return []
    selective = [t for t in idf if corpus.df[t] <= COMMON_TERM_SHARE * corpus.n] or list(idf)
    tsquery = " | ".join(_tsquery_literal(t) for t in selective)
    scored_terms = list(idf)
    sql = _Sql([scored_terms, [idf[t] for t in scored_terms], tsquery, max(corpus.avgdl, 1.0)], modality)
    sql.add("e.lexical @@ $3::tsquery")
    sql.apply_scope(scope)
    query_sql = f"""
        WITH q AS (SELECT * FROM unnest($1::text[], $2::float8[]) AS q(term, idf))
        SELECT {_COLUMNS}, s.score
        FROM {partition.table} e
        CROSS JOIN LATERAL (
            SELECT sum(q.idf * u.tf * {BM25_K1 + 1}
                       / (u.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * d.dl / $4::float8))) AS score
            FROM (SELECT lexeme, coalesce(array_length(positions, 1), 1)::float8 AS tf
                  FROM unnest(e.lexical)) u
            JOIN q ON q.term = u.lexeme
            CROSS JOIN (SELECT sum(coalesce(array_length(positions, 1), 1))::float8 AS dl
                        FROM unnest(e.lexical)) d
        ) s
        WHERE {sql.where_sql}
        ORDER BY s.score DESC, {_IDENTITY_ORDER}
        LIMIT {int(limit)}"""
    rows = await db.fetch(query_sql, *sql.params)
    return [_chunk(r, float(r["score"])) for r in rows]


async def sparse_search(
    db: Executor,
    partition: ModelPartition,
    weights: Mapping[int, float],
    scope: Scope,
    limit: int,
) -> list[ChunkHit]:
    """Learned-sparse inner product over the chunks that have sparse weights; score = the dot product."""
    from .store import to_sparsevec

    query = to_sparsevec(weights)
    if query is None or not query.indices():
        return []
    sql = _Sql([query])
    sql.add("e.sparse IS NOT NULL")
    sql.add("(e.sparse <#> $1::sparsevec) < 0")
    sql.apply_scope(scope)
    rows = await db.fetch(
        f"""SELECT {_COLUMNS}, -(e.sparse <#> $1::sparsevec) AS score
            FROM {partition.table} e
            WHERE {sql.where_sql}
            ORDER BY score DESC, {_IDENTITY_ORDER}
            LIMIT {int(limit)}""",
        *sql.params,
    )
    return [_chunk(r, float(r["score"])) for r in rows]


async def seed_chunks(
    db: Executor,
    partition: ModelPartition,
    section_tipo: str,
    section_id: int,
    *,
    group: str | None = None,
    modality: str = "text",
) -> list[ChunkHit]:
    """A stored record's chunks (or images) with their dense vectors (ordered by component, language, index)."""
    sql = _Sql([section_tipo, section_id], modality)
    sql.add("e.section_tipo = $1 AND e.section_id = $2")
    sql.apply_scope(Scope(group=group))
    rows = await db.fetch(
        f"""SELECT {_COLUMNS}, e.embedding
            FROM {partition.table} e WHERE {sql.where_sql}
            ORDER BY e.component_tipo, e.lang, e.chunk_index""",
        *sql.params,
    )
    return [_chunk(r, 0.0, _as_array(r["embedding"])) for r in rows]


def _as_array(value: Any) -> np.ndarray:
    """A decoded ``vector`` (pgvector's Vector or an array) as float32 numpy."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)
