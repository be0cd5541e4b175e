"""The lexical engines' re-read: their candidates plus every key changed after their watermark,
through the scope's SQL filter and the plan's match set, in the SQL leg's order.

The engine (Tantivy's :mod:`index.lexical.engine`) only *selects*: this statement decides what is served. A
candidate unchanged since the watermark keeps the engine's score (the same BM25 over the same row,
:func:`index.search.bm25.bm25_summand`); a changed key, or a candidate the engine could not score, is
scored by the SQL leg's own expression. A deleted row or a revoked ACL is never served: every row
passes the scope's filter here.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from index.search.bm25 import Bm25Plan, bm25_score_sql
from index.search.read_settings import CUSTOM_PLANS, fetch_with_local_settings
from index.search.scope_sql import scope_where
from index.store.change_feed import RowKey, Watermark, candidates_params, candidates_sql
from index.store.hits import Scope, hit_columns, identity_order
from index.store.partitions import ModelPartition

__all__ = ["reread_candidates"]


async def reread_candidates(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    plan: Bm25Plan,
    scope: Scope,
    keys: Sequence[RowKey],
    scores: Sequence[float | None],
    watermark: Watermark,
) -> tuple[list[asyncpg.Record], int]:
    """The rows of ``keys`` (scored ``scores``; None: score it here) and of every key changed after
    ``watermark``, filtered and ordered as the SQL leg would, with how many were trusted candidates
    (unchanged since the watermark)."""
    where, params = scope_where(scope, [plan.terms, plan.weights, plan.tsquery, plan.avgdl])
    ctes, source = candidates_sql(len(params) + 1, partition.table, scored=True)
    query = f"""
        WITH {ctes}
        SELECT {hit_columns()}, k.cached AND NOT k.pending AS trusted,
               CASE WHEN k.pending OR k.cand_score IS NULL
                    THEN ({bm25_score_sql("$1", "$2", "$4")}) ELSE k.cand_score END AS score
        FROM {source}
        WHERE {where} AND e.lexical @@ $3::tsquery
        ORDER BY score DESC, {identity_order()}"""
    # Planned with its values every time: a generic plan (PostgreSQL's choice after five runs of
    # one prepared statement) of an earlier join could not see how few keys it joins (16 ms
    # against 0.8 on 20k chunks). The keys' lookups (candidates_sql) now leave that join no
    # other plan; a generic plan of the rest is not measured, so the read pool's sessions and
    # CUSTOM_PLANS keep custom plans.
    rows = await fetch_with_local_settings(
        conn, CUSTOM_PLANS, query, [*params, *candidates_params(keys, partition.model, watermark, scores)]
    )
    return rows, sum(1 for r in rows if r["trusted"])
