"""The lexical engines' re-read: their candidates plus every key changed after their watermark,
through the scope's SQL filter and the plan's match set, in the SQL leg's order.

The engine (Tantivy's :mod:`index.lexical.engine`) only *selects*: this statement decides what is served. A
candidate unchanged since the watermark keeps the engine's score (the same BM25 over the same row,
:func:`index.search.bm25.bm25_summand`); a changed key, or a candidate the engine could not score, is
scored by the SQL leg's own expression. A deleted row or a revoked ACL is never served: every row
passes the scope's filter here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from index.search.bm25 import Bm25Plan, bm25_score_sql
from index.search.read_settings import CUSTOM_PLANS, fetch_with_local_settings
from index.search.scope_sql import scope_where
from index.store.change_feed import RowKey, Watermark, candidates_params, candidates_sql
from index.store.hits import Scope, hit_columns, identity_order
from index.store.partitions import ModelPartition

__all__ = ["reread_candidates", "reread_statement"]


def reread_statement(
    partition: ModelPartition,
    plan: Bm25Plan,
    scope: Scope,
    keys: Sequence[RowKey],
    scores: Sequence[float | None],
    watermark: Watermark,
) -> tuple[str, list[Any]]:
    """The re-read's statement and its parameters (:func:`reread_candidates`)."""
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
    return query, [*params, *candidates_params(keys, partition.model, watermark, scores)]


async def reread_candidates(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    plan: Bm25Plan,
    scope: Scope,
    keys: Sequence[RowKey],
    scores: Sequence[float | None],
    watermark: Watermark,
    *,
    plans: Mapping[str, str] = CUSTOM_PLANS,
) -> tuple[list[asyncpg.Record], int]:
    """The rows of ``keys`` (scored ``scores``; None: score it here) and of every key changed after
    ``watermark``, filtered and ordered as the SQL leg would, with how many were trusted candidates
    (unchanged since the watermark).

    ``plans``: how PostgreSQL plans it, set for the statement unless ``conn``'s session holds it.
    :data:`~index.search.read_settings.PLANNED_ONCE` (the gateway's re-read pool): planned once per
    session, the keys' lookups (:func:`~index.store.change_feed.candidates_sql`) and the change
    feed's index scans being its only sensible plan whatever the values (``tests/test_tantivy_lexical.py``
    checks the generic plan). ``CUSTOM_PLANS``: planned with its values at every run, which costs
    more than running it (0.43 against 0.36 ms at 1M chunks) but needs no pool of its own.
    """
    query, params = reread_statement(partition, plan, scope, keys, scores, watermark)
    rows = await fetch_with_local_settings(conn, plans, query, params)
    return rows, sum(1 for r in rows if r["trusted"])
