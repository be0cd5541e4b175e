"""BM25 for the lexical legs: query parsing, corpus statistics and the per-query plan.

The SQL leg (:func:`index.search.lexical_leg.lexical_search`) and the Tantivy engine
(:mod:`index.lexical.engine`) score with the same plan (:func:`bm25_plan`) and the same per-chunk formula
(:func:`bm25_score_sql`, :func:`bm25_summand`), so their scores and tie order agree.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from index.lru import Lru
from index.search.lexical_engine import Connections
from index.search.scope_sql import checked_modality
from index.search.stopwords import strip_stopwords
from index.store.executor import Executor
from index.store.partitions import ModelPartition
from index.text import fold

__all__ = [
    "BM25_B",
    "BM25_K1",
    "COMMON_TERM_SHARE",
    "SCORE_DECIMALS",
    "Bm25Plan",
    "CorpusStats",
    "bm25_idf",
    "bm25_plan",
    "bm25_plan_of_counts",
    "bm25_score_sql",
    "bm25_summand",
    "count_doc_freqs",
    "query_terms",
    "scored_terms",
]

log = logging.getLogger(__name__)

RECOUNT_RETRY_S = 5.0  # a failed background recount is tried again after this long

# BM25 parameters (Robertson/Lucene defaults, as in bm25s).
BM25_K1 = 1.5
BM25_B = 0.75
# The engine's scores are the SQL leg's to about 1e-15: the same formula, other floating-point steps
# (bm25_summand's in-place order, numpy's sum against PostgreSQL's). Two chunks the SQL leg scores
# exactly alike (a tie, broken by identity) could then come out an ulp apart, in the wrong order
# (hypothesis found one: 1.5936785410775807 against ...804, where PostgreSQL gave ...802 twice).
# Rounded to this many decimals, they tie again; distinct BM25 scores are far further apart.
SCORE_DECIMALS = 12
# Terms in more than this share of chunks still score, but do not widen the match set on their own.
COMMON_TERM_SHARE = 0.5


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


_StatsKey = tuple[str, tuple[str, ...] | None, str]  # (partition, sections, modality)


async def count_doc_freqs(
    db: Executor,
    partition: ModelPartition,
    terms: Sequence[str],
    sections: tuple[str, ...] | None,
    modality: str = "text",
) -> dict[str, int]:
    """How many of the store's chunks (of ``modality``, in ``sections``; None: all) hold each term:
    a GIN probe per term, cheap for a rare term, most of a second for a common one at 1M chunks."""
    rows = await db.fetch(
        f"""SELECT t.term, (SELECT count(*) FROM {partition.table} e
                            WHERE e.modality = $4 AND e.lexical @@ t.q
                              AND ($3::text[] IS NULL OR e.section_tipo = ANY($3::text[]))) AS df
            FROM unnest($1::text[], $2::tsquery[]) AS t(term, q)""",
        list(terms),
        [_tsquery_literal(t) for t in terms],
        None if sections is None else list(sections),
        checked_modality(modality),
    )
    return {r["term"]: int(r["df"]) for r in rows}


class CorpusStats:
    """BM25 statistics (chunk count, mean length, document frequencies) per partition and section scope, cached.

    A chunk's length is ``lexical_length`` (stored at write time, see migration 0012), not
    its lexeme count.

    A query scoped to sections is scored with those sections' statistics (a
    term common in one collection can be rare in another); an unscoped query
    with the whole partition's. Document frequencies are counted per term on
    first use (a GIN index probe) and cached with them. Corpus statistics
    drift slowly, so a short staleness only nudges scores.

    Statistics older than ``ttl`` seconds are recounted. With a pool attached
    (:meth:`refresh_on`, as the gateway's legs do), the held statistics keep
    serving while one background task per scope recounts them and the terms
    used since the last count (stale-while-revalidate): at 100k chunks a
    common term's count takes most of a second, at 1M seconds, and without it
    the requests that found the statistics expired paid that (the p99 spikes of
    every ``ttl``, per gateway worker). ``ttl`` 0 recounts on every use.
    """

    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._stats: dict[_StatsKey, _Stats] = {}
        self._pool: Connections | None = None
        self._refreshing: dict[_StatsKey, asyncio.Task[None]] = {}

    def refresh_on(self, pool: Connections) -> None:
        """Recount expired statistics in the background on ``pool`` (the first attached is kept)."""
        if self._pool is None:
            self._pool = pool

    def invalidate(self) -> None:
        self._stats.clear()

    async def stop(self) -> None:
        """Cancel the recounts under way (the app's cleanup, before its pools close)."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _count(
        self, db: Executor, partition: ModelPartition, sections: tuple[str, ...] | None, modality: str
    ) -> _Stats:
        row = await db.fetchrow(
            f"""SELECT count(*) AS n, coalesce(avg(e.lexical_length), 0) AS avgdl
                FROM {partition.table} e
                WHERE e.modality = $2 AND ($1::text[] IS NULL OR e.section_tipo = ANY($1::text[]))""",
            None if sections is None else list(sections),
            checked_modality(modality),
        )
        return _Stats(n=int(row["n"]), avgdl=float(row["avgdl"] or 0.0), at=self._clock())

    async def _base(
        self,
        db: Executor,
        partition: ModelPartition,
        sections: tuple[str, ...] | None,
        modality: str = "text",
    ) -> _Stats:
        now = self._clock()
        key = (partition.partition, sections, modality)
        cached = self._stats.get(key)
        if cached is not None and now - cached.at < self.ttl:
            return cached
        if cached is not None and self._pool is not None and self.ttl > 0:
            if key not in self._refreshing:
                self._refreshing[key] = asyncio.create_task(self._refresh(key, partition, cached))
            return cached  # stale while the task recounts
        stats = await self._count(db, partition, sections, modality)
        self._keep(key, stats)
        return stats

    def _keep(self, key: _StatsKey, stats: _Stats) -> None:
        for old in [k for k, v in self._stats.items() if stats.at - v.at >= 4 * max(self.ttl, 1.0)]:
            del self._stats[old]  # scopes vary: prune those long unused (a refresh keeps the used fresh)
        self._stats[key] = stats

    async def _refresh(self, key: _StatsKey, partition: ModelPartition, stale: _Stats) -> None:
        """Recount ``key``'s statistics and the terms counted under ``stale``, then swap them in."""
        _, sections, modality = key
        assert self._pool is not None
        try:
            async with self._pool.acquire() as conn:
                fresh = await self._count(conn, partition, sections, modality)
                terms = list(stale.df)
                if terms:
                    fresh.df.update(await count_doc_freqs(conn, partition, terms, sections, modality))
            # Terms first counted under the stale statistics while this ran: their counts are as new.
            fresh.df.update({t: n for t, n in stale.df.items() if t not in fresh.df})
            self._keep(key, fresh)
        except Exception as exc:  # the stale statistics keep serving; retried in a few seconds
            log.warning("corpus statistics of %s: recount failed (%s); the held ones serve", key[0], exc)
            stale.at = self._clock() - max(0.0, self.ttl - RECOUNT_RETRY_S)
        finally:
            self._refreshing.pop(key, None)

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
            stats.df.update(await count_doc_freqs(db, partition, missing, sections, modality))
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


def bm25_plan_of_counts(
    terms: Mapping[str, int], df: Mapping[str, int], n: int, avgdl: float
) -> Bm25Plan | None:
    """:func:`bm25_plan` from counted statistics: each term's ``df`` among ``n`` chunks (a term in
    none is dropped), as the lexical engines count them from their own index."""
    idf = {t: bm25_idf(n, df[t]) for t in terms if df[t] > 0}
    return bm25_plan(terms, idf, df, n, avgdl)


def bm25_idf(n: int, df: int) -> float:
    """BM25 IDF of a term in ``df`` of ``n`` chunks, ``ln(1 + (N - df + 0.5) / (df + 0.5))``."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def bm25_summand(
    weight: float | np.ndarray, tfs: np.ndarray, lengths: np.ndarray, avgdl: float
) -> np.ndarray:
    """One term's BM25 summand in chunks of ``lengths`` holding it ``tfs`` times: the one formula
    of the lexical engines, :func:`bm25_score_sql`'s in float64 (equal to about 1e-15). Broadcast:
    ``tfs`` of ``terms x chunks`` with ``weight`` of ``terms x 1`` gives every term's summands."""
    # weight * tf / (tf + k1 * (1 - b + b * length / avgdl)), in place where the shapes allow: this
    # runs over every posting a search admits, where each temporary is a pass over memory.
    tf = tfs.astype(np.float64)
    out = tf + BM25_K1 * (1 - BM25_B)
    out += lengths * (BM25_K1 * BM25_B / avgdl)
    np.divide(tf, out, out=out)
    out *= weight
    return out


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
