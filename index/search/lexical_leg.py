"""The lexical legs as SQL: BM25 over the folded tsvector, and the learned-sparse inner product.

:func:`lexical_search` is OR semantics ranked by BM25 (IDF from the partition's document
frequencies, term-frequency saturation, length normalization, query term frequency): a rare term
(a name, an inventory number) outweighs common words, unlike ``ts_rank`` over AND-ed terms. It is
the SQL implementation of the lexical leg (:class:`index.search.lexical_engine.LexicalEngine` is the
other, and this one serves whenever an engine cannot answer). :func:`sparse_search` is bge-m3's
learned-sparse leg.
"""

from __future__ import annotations

from collections.abc import Mapping

from index.search.bm25 import CorpusStats, bm25_plan, bm25_score_sql, query_terms, scored_terms
from index.search.scope_sql import WhereSql
from index.store.executor import Executor
from index.store.hits import _COLUMNS, _IDENTITY_ORDER, ChunkHit, Scope, _chunk
from index.store.partitions import ModelPartition
from index.store.store import to_sparsevec

__all__ = ["lexical_search", "sparse_search"]


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
    holding any query term rarer than :data:`index.search.bm25.COMMON_TERM_SHARE` of the corpus
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
    sql = WhereSql([plan.terms, plan.weights, plan.tsquery, plan.avgdl], modality)
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
    sql = WhereSql([query])
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
