"""The read side of the embeddings store: the retrieval legs as SQL over one model's partition.

- :func:`dense_search`: cosine distance over the partition's HNSW index, with
  pgvector 0.8 iterative index scans (``hnsw.iterative_scan = relaxed_order``)
  so WHERE filters do not starve the result, re-sorted exactly afterwards.
- :func:`lexical_search`: OR semantics over the accent-folded tsvector, ranked
  by BM25 (IDF from the partition's document frequencies, term-frequency
  saturation, length normalization, query term frequency). A rare term (a
  name, an inventory number) outweighs common words, unlike ``ts_rank`` over
  AND-ed terms. The query's stop words (its guessed language's) are dropped;
  the index keeps every word.
- :func:`sparse_search`: learned-sparse inner product (bge-m3 lexical weights).
- :func:`seed_chunks`: a stored record's chunks with their vectors (``similar_to``).

Every leg takes a :class:`Scope` (section scope, group facet, excluded record)
and an optional :class:`AclPushdown` that mirrors the gateway's ACL in SQL so
recall does not suffer; the gateway's gate still checks every row it returns.
Values are always bound parameters; identifiers come from ``rag_models``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import asyncpg
import numpy as np

from schema import session_settings

from .lru import Lru
from .partitions import ModelPartition
from .stopwords import strip_stopwords
from .store import to_sparsevec
from .text import fold

__all__ = [
    "CUSTOM_PLANS",
    "AclPushdown",
    "Bm25Plan",
    "ChunkHit",
    "CorpusStats",
    "JsonMeta",
    "Scope",
    "bm25_idf",
    "bm25_plan",
    "bm25_score_sql",
    "chunk_from_row",
    "dense_search",
    "exact_scan_rows",
    "fetch_with_local_settings",
    "hit_columns",
    "hnsw_scan_settings",
    "identity_order",
    "lexical_search",
    "may_read_exactly",
    "query_terms",
    "read_session_settings",
    "reads_exactly",
    "scope_key",
    "scope_where",
    "scored_terms",
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
        allowed = sorted(k for k, v in acl.perms.items() if "/" in k and v >= 1)
        denied = sorted(k for k, v in acl.perms.items() if "/" in k and v < 1)
        sections = self.bind(readable)
        self.add(f"e.section_tipo = ANY({sections}::text[])")
        if acl.projects is not None:
            self.add(f"e.projects && {self.bind(list(acl.projects))}::int[]")
        # Every component the chunk needs (acl_pairs, "<section>/<component>", with their sections in
        # acl_sections; NULL when malformed: see migration 0013) has level >= 1: its explicit entry,
        # else its section's. No pair explicitly denied, and each pair's section readable (the common
        # case, one array operator) or the pair explicitly allowed.
        self.add("e.acl_pairs IS NOT NULL")
        if denied:
            self.add(f"NOT (e.acl_pairs && {self.bind(denied)}::text[])")
        explicit = self.bind(allowed)
        self.add(
            f"""(e.acl_sections <@ {sections}::text[]
                 OR NOT EXISTS (SELECT 1 FROM unnest(e.acl_pairs, e.acl_sections) AS u(pair, section)
                                WHERE NOT u.pair = ANY({explicit}::text[])
                                  AND NOT u.section = ANY({sections}::text[])))"""
        )

    @property
    def where_sql(self) -> str:
        return " AND ".join(f"({w})" for w in self.where)


def _modality(modality: str) -> str:
    if modality not in ("text", "image"):
        raise ValueError(f"modality must be text or image, not {modality!r}")
    return modality


def scope_where(scope: Scope, params: Sequence[Any] = ()) -> tuple[str, list[Any]]:
    """The WHERE clause (alias ``e``) of a text search in ``scope``, with its parameters after ``params``.

    The same push-down every leg applies; the FAISS cache builds its scope bitmaps from it.
    """
    sql = _Sql(params)
    sql.apply_scope(scope)
    return sql.where_sql, sql.params


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


def _dense_query(
    partition: ModelPartition, vector: np.ndarray, scope: Scope, limit: int, modality: str, with_vectors: bool
) -> tuple[str, list[Any]]:
    """The dense leg's statement and parameters: nearest ``limit`` chunks of the scope, exact order."""
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
    return query, sql.params


async def exact_scan_rows(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    vector: np.ndarray,
    scope: Scope,
    limit: int,
    modality: str = "text",
) -> float | None:
    """The rows the exact dense search (``exact=True``) would read for ``scope``, as the planner
    estimates them, when it reads them through an index (a bitmap scan of the ACL or section
    indexes); None when it would scan the whole partition.

    Why: for a scope that sees a small share of a large partition, the planner still picks the HNSW
    scan with the scope as a filter, which walks past invisible rows reading their pages (at 1M
    chunks and 1% visibility: 115 ms at recall@10 0.73), where reading the visible rows through the
    ``projects`` index and sorting them took 22.5 ms, exact (``benchmarks/results/2026-12-02/
    retrieval-at-scale/dense-acl-1m.txt``).
    """
    query, params = _dense_query(partition, vector, scope, limit, modality, False)
    settings = {**CUSTOM_PLANS, **EXACT_SCAN}
    (row,) = await fetch_with_local_settings(conn, settings, "EXPLAIN (FORMAT JSON) " + query, params)
    plan = row[0]
    nodes = [(json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]]
    rows = None
    while nodes:
        node = nodes.pop()
        nodes.extend(node.get("Plans", ()))
        if node.get("Relation Name") != partition.partition:
            continue
        if node["Node Type"] != "Bitmap Heap Scan":
            return None  # a sequential (or other) scan of the partition: not worth it
        rows = float(node["Plan Rows"])
    return rows


def may_read_exactly(scope: Scope, max_rows: int) -> bool:
    """Whether :func:`reads_exactly` could answer yes, known without the planner: the exact path is
    on (``max_rows`` > 0) and the search is scoped. A caller that remembers decisions checks this
    first, so an unscoped search costs no lookup."""
    return max_rows != 0 and scope != Scope()


async def reads_exactly(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    vector: np.ndarray,
    scope: Scope,
    limit: int,
    max_rows: int,
    modality: str = "text",
) -> bool:
    """Whether the dense leg answers ``scope`` exactly (``dense_search(exact=True)``): when the
    planner would read at most ``max_rows`` (``RAG_DENSE_EXACT_MAX_ROWS``; 0: never) of its rows
    through an index (:func:`exact_scan_rows`). An unscoped search never does, and never asks."""
    if not may_read_exactly(scope, max_rows):
        return False
    rows = await exact_scan_rows(conn, partition, vector, scope, limit, modality)
    return rows is not None and rows <= max_rows


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
    exact: bool = False,
) -> list[ChunkHit]:
    """Nearest chunks by cosine distance; score = ``1 - distance`` (cosine similarity).

    The scan settings (:func:`hnsw_scan_settings`) are the connection session's own (a gateway's
    read pool) or ``SET LOCAL`` in a transaction of the query's own
    (:func:`fetch_with_local_settings`). The outer query restores exact distance order (ties by
    chunk identity), which ``relaxed_order`` gives up inside the scan.
    ``exact`` keeps the planner off the HNSW index: a full scan, the ground
    truth that recall and the FAISS cache are measured against.
    """
    query, params = _dense_query(partition, vector, scope, limit, modality, with_vectors)
    settings = {**hnsw_scan_settings(ef_search, max_scan_tuples, limit), **CUSTOM_PLANS}
    if exact:
        settings.update(EXACT_SCAN)
    rows = await fetch_with_local_settings(conn, settings, query, params)
    return [
        _chunk(r, 1.0 - float(r["distance"]), _as_array(r["embedding"]) if with_vectors else None)
        for r in rows
    ]


# A generic plan of a leg's statement (what PostgreSQL switches to after five runs of one prepared
# statement) cannot see the ACL's values: it estimates `projects && $n` at 1% and leaves the HNSW
# index for a bitmap scan of every row plus a sort (300 ms instead of 3 on 10k chunks at 100%
# visibility); nor can it see how few keys a cache's re-read joins. Each is planned with its values.
CUSTOM_PLANS: Mapping[str, str] = MappingProxyType({"plan_cache_mode": "force_custom_plan"})
# The dense leg's exact search: no index scan, so no HNSW; the scope's rows are read (through a
# bitmap of its indexes where it has one) and sorted by distance.
EXACT_SCAN: Mapping[str, str] = MappingProxyType({"enable_indexscan": "off"})


def hnsw_scan_settings(ef_search: int, max_scan_tuples: int, limit: int = 0) -> dict[str, str]:
    """The dense leg's pgvector scan settings for a top-``limit`` (``ef_search`` at least ``limit``,
    at most pgvector's 1000). ``relaxed_order`` lets the scan go on past rows the ACL filters out."""
    return {
        "hnsw.iterative_scan": "relaxed_order",
        "hnsw.ef_search": str(min(1000, max(int(ef_search), int(limit)))),
        "hnsw.max_scan_tuples": str(int(max_scan_tuples)),
    }


def read_session_settings(ef_search: int, max_scan_tuples: int) -> dict[str, str]:
    """What a pool of retrieval reads opens its sessions with (``create_pool(session=...)``): every
    leg's settings at their configured values, so that no leg pays a ``SET LOCAL`` for them."""
    return {**CUSTOM_PLANS, **hnsw_scan_settings(ef_search, max_scan_tuples)}


async def fetch_with_local_settings(
    conn: asyncpg.Connection, settings: Mapping[str, str], query: str, params: Sequence[Any]
) -> list[asyncpg.Record]:
    """``query`` under ``settings`` ({name: value}), which end with it.

    Settings the connection's session already holds (:func:`schema.session_settings`) are not set
    again; when that is all of them the query runs alone, one round trip (issue 27). Otherwise it
    runs in a read-only transaction of its own after ``SET LOCAL`` of the rest: BEGIN and the
    settings in one round trip (a simple-protocol batch), then the query, then COMMIT. Inside a
    caller's transaction, a savepoint.
    """
    held = session_settings(conn)
    needed = [f"SET LOCAL {name} = {value}" for name, value in settings.items() if held.get(name) != value]
    if not needed:
        return await conn.fetch(query, *params)
    if conn.is_in_transaction():
        async with conn.transaction():
            await conn.execute("; ".join(needed))
            return await conn.fetch(query, *params)
    await conn.execute("; ".join(["BEGIN READ ONLY", *needed]))
    try:
        rows = await conn.fetch(query, *params)
    except BaseException:
        with contextlib.suppress(Exception):  # else the pool's release rolls it back
            if not conn.is_closed() and conn.is_in_transaction():
                await conn.execute("ROLLBACK")
        raise
    await conn.execute("COMMIT")
    return rows


def _tsquery_literal(term: str) -> str:
    return "'" + term.replace("\\", "\\\\").replace("'", "''") + "'"


_TERMS_CACHE_SIZE = 4096
_TERMS_CACHE: Lru[str, dict[str, int]] = Lru(_TERMS_CACHE_SIZE)


async def query_terms(db: Executor, query: str) -> dict[str, int]:
    """A query's lexemes with their frequency in the query, parsed exactly as the lexical column is.

    Folded, PostgreSQL's ``simple`` parser; frequency is the lexeme's position count. The parse
    depends on the text alone, so the last :data:`_TERMS_CACHE_SIZE` queries' terms are kept (a
    repeated query saves the lexical leg one round trip).
    """
    folded = fold(query)
    cached = _TERMS_CACHE.get(folded)
    if cached is not None:
        return dict(cached)
    rows = await db.fetch(
        "SELECT lexeme, coalesce(array_length(positions, 1), 1) AS n "
        "FROM unnest(to_tsvector('simple'::regconfig, $1)) ORDER BY lexeme",
        folded,
    )
    terms = {r["lexeme"]: int(r["n"]) for r in rows}
    _TERMS_CACHE.put(folded, terms)
    return dict(terms)


def scored_terms(terms: Mapping[str, int]) -> dict[str, int]:
    """The query terms BM25 scores, with their query frequency.

    Why the lexical leg lost to a plain BM25 (bm25s) on CACM's natural-language
    queries (0.86x), and what each rule here puts back:

    - Query term frequency. BM25 sums over the query's tokens, so a word the
      asker repeats ("mechanisms ... mechanisms") weighs twice; we scored
      distinct lexemes, flattening long queries to a bag of equally weighted
      words. Worth +0.04 nDCG@10 on CACM, the largest single cause.
    - One-letter tokens. PostgreSQL's parser keeps the "i" and "m" of "I'm" and
      the "s" of "system's"; as query terms they match chunks at random (BM25
      tokenizers drop them). A lone digit stays: it can be part of a signature.
    - Stop words, of the query's guessed language (:func:`strip_stopwords`).

    The third cause, document length, is on the index side: see
    ``schema/migrations/0012_bm25_length.sql``.
    """
    kept = {t: n for t, n in terms.items() if len(t) > 1 or t.isdigit()} or dict(terms)
    return {t: kept[t] for t in strip_stopwords(sorted(kept))}


@dataclass
class _Stats:
    n: int
    avgdl: float
    at: float
    df: dict[str, int] = field(default_factory=dict)


class CorpusStats:
    """BM25 statistics (chunk count, mean length, document frequencies) per partition and section scope, cached.

    A chunk's length is ``lexical_length`` (stored at write time, see migration 0012), not
    its lexeme count.

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
            f"""SELECT count(*) AS n, coalesce(avg(e.lexical_length), 0) AS avgdl
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
                out[t] = bm25_idf(stats.n, df)
        return stats, out


@dataclass(frozen=True)
class Bm25Plan:
    """One query's BM25 inputs under given corpus statistics (what both lexical legs score with).

    ``terms`` and ``weights`` (``qtf * idf``) are the scored terms, ``selective`` the ones that form
    the match set (see :data:`COMMON_TERM_SHARE`), ``avgdl`` the mean chunk length (at least 1).
    """

    terms: list[str]
    weights: list[float]
    selective: list[str]
    avgdl: float

    @property
    def tsquery(self) -> str:
        """The match set as a tsquery: any selective term (OR)."""
        return " | ".join(_tsquery_literal(t) for t in self.selective)


def bm25_plan(
    terms: Mapping[str, int], idf: Mapping[str, float], df: Mapping[str, int], n: int, avgdl: float
) -> Bm25Plan | None:
    """The plan of a query with ``terms`` (query frequencies) and their ``idf`` over ``n`` chunks.

    None when nothing can match (no term in the corpus, or an empty corpus).
    """
    if not idf or n == 0:
        return None
    scored = list(idf)
    selective = [t for t in scored if df[t] <= COMMON_TERM_SHARE * n] or scored
    return Bm25Plan(scored, [terms[t] * idf[t] for t in scored], selective, max(avgdl, 1.0))


def bm25_idf(n: int, df: int) -> float:
    """BM25 IDF of a term in ``df`` of ``n`` chunks, ``ln(1 + (N - df + 0.5) / (df + 0.5))``."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def bm25_score_sql(terms: str, weights: str, avgdl: str) -> str:
    """A subquery (alias ``e``, for a LATERAL join) of one chunk's BM25 ``score``.

    ``terms`` (text[]), ``weights`` (float8[]) and ``avgdl`` (float8) are the placeholders of a
    :class:`Bm25Plan`'s fields; ``dl`` is the chunk's ``lexical_length``.
    """
    return f"""SELECT sum(q.weight * u.tf
                       / (u.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * e.lexical_length / {avgdl}::float8))) AS score
            FROM (SELECT lexeme, coalesce(array_length(positions, 1), 1)::float8 AS tf
                  FROM unnest(e.lexical)) u
            JOIN unnest({terms}::text[], {weights}::float8[]) AS q(term, weight) ON q.term = u.lexeme"""


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

    ``score = sum over query terms t of qtf(t) * idf(t) * tf / (tf + k1 * (1 - b + b * dl / avgdl))``
    (Lucene's form, as bm25s: the classic ``(k1 + 1)`` factor is a constant and changes no ranking)
    with ``dl`` the chunk's ``lexical_length`` (see :func:`scored_terms` and
    migration 0012 for what is counted and why). The match set is the chunks
    holding any query term rarer than :data:`COMMON_TERM_SHARE` of the corpus
    (all terms when none is), so a query of common words cannot turn into a
    full scan; every query term still contributes to the score of the chunks
    that match. Every matching chunk is scored before the cut to ``limit``.
    """
    terms = scored_terms(await query_terms(db, query))
    if not terms:
        return []
    corpus, idf = await stats.idf(db, partition, list(terms), scope.section_tipos, modality)
    plan = bm25_plan(terms, idf, corpus.df, corpus.n, corpus.avgdl)
    if plan is None:
        return []
    sql = _Sql([plan.terms, plan.weights, plan.tsquery, plan.avgdl], modality)
    sql.add("e.lexical @@ $3::tsquery")
    sql.apply_scope(scope)
    query_sql = f"""
        SELECT {_COLUMNS}, s.score
        FROM {partition.table} e
        CROSS JOIN LATERAL ({bm25_score_sql("$1", "$2", "$4")}) s
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
