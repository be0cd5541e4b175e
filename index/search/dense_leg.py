"""The dense leg: cosine distance over one model partition's HNSW index, and the seeds' vectors.

:func:`dense_search` uses pgvector 0.8 iterative index scans (``hnsw.iterative_scan =
relaxed_order``) so WHERE filters do not starve the result, re-sorted exactly afterwards; for a
scope that sees few rows, :func:`reads_exactly` decides (from the planner's estimate) to read
those rows exactly instead. :func:`seed_chunks` reads a stored record's chunks with their vectors
(``similar_to``'s seed). :class:`DenseLeg` is the one place that chooses between the two for a
reader: it asks the planner once per scope and minute and remembers the answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Hashable
from dataclasses import replace
from typing import Any

import asyncpg
import numpy as np

from index.lru import Lru
from index.search.read_settings import CUSTOM_PLANS, EXACT_SCAN, fetch_with_local_settings, hnsw_scan_settings
from index.search.scope_sql import WhereSql
from index.store.executor import Executor
from index.store.hits import _COLUMNS, _IDENTITY_ORDER, ChunkHit, Scope, _chunk, scope_key
from index.store.partitions import ModelPartition

EXACT_DECISION_TTL_S = 60.0  # a scope's exact-or-HNSW choice is re-estimated after this (stores grow)
EXACT_DECISIONS_KEPT = 4096  # scopes whose choice is kept (the least recently used go first)

__all__ = ["DenseLeg", "dense_search", "exact_scan_rows", "may_read_exactly", "reads_exactly", "seed_chunks"]


def _dense_query(
    partition: ModelPartition, vector: np.ndarray, scope: Scope, limit: int, modality: str, with_vectors: bool
) -> tuple[str, list[Any]]:
    """The dense leg's statement and parameters: nearest ``limit`` chunks of the scope, exact order."""
    sql = WhereSql([np.asarray(vector, dtype=np.float32)], modality)
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


class DenseLeg:
    """pgvector's dense leg for one reader (a gateway, a benchmark): HNSW with the configured scan
    settings, or the exact search for a scope whose few rows the planner reads through an index.

    The choice (:func:`reads_exactly` with ``RAG_DENSE_EXACT_MAX_ROWS``) is remembered per partition,
    modality and scope for :data:`EXACT_DECISION_TTL_S` (the record a similar search excludes does
    not count), so the planner's round trip is rare; an unscoped search never asks.
    """

    def __init__(self, *, ef_search: int, max_scan_tuples: int, exact_max_rows: int) -> None:
        self.ef_search = ef_search
        self.max_scan_tuples = max_scan_tuples
        self.exact_max_rows = exact_max_rows
        # (partition, modality, scope) -> (when decided, whether the scope is read exactly)
        self._decisions: Lru[Hashable, tuple[float, bool]] = Lru(EXACT_DECISIONS_KEPT)

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        vector: np.ndarray,
        scope: Scope,
        limit: int,
        modality: str = "text",
    ) -> list[ChunkHit]:
        """The nearest ``limit`` chunks of ``scope`` (:func:`dense_search`), exact where decided."""
        return await dense_search(
            conn,
            partition,
            vector,
            scope,
            limit,
            ef_search=self.ef_search,
            max_scan_tuples=self.max_scan_tuples,
            modality=modality,
            exact=await self.reads_exactly(conn, partition, vector, scope, limit, modality),
        )

    async def reads_exactly(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        vector: np.ndarray,
        scope: Scope,
        limit: int,
        modality: str = "text",
    ) -> bool:
        """:func:`reads_exactly` for this leg's ``exact_max_rows``, remembered."""
        scope = replace(scope, exclude_record=None)
        if not may_read_exactly(scope, self.exact_max_rows):  # known without the memo's lookup
            return False
        key = (partition.partition, modality, scope_key(scope))
        now = time.monotonic()
        known = self._decisions.get(key)
        if known is not None and now - known[0] < EXACT_DECISION_TTL_S:
            return known[1]
        exact = await reads_exactly(conn, partition, vector, scope, limit, self.exact_max_rows, modality)
        self._decisions.put(key, (now, exact))
        return exact


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
    sql = WhereSql([section_tipo, section_id], modality)
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
