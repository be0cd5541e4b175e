"""The retrieval legs of one gateway: each leg from its fastest exact source, else from SQL.

- dense: the FAISS cache (:mod:`index.vectors.cache`) when it holds the partition and can prove an
  exact top-k, else pgvector (:class:`index.search.dense_leg.DenseLeg`: HNSW, or the exact scan
  for a scope whose few rows the planner reads through an index, decided there);
- lexical: the lexical engine (:class:`index.search.lexical_engine.LexicalEngine`) when it can answer
  exactly, else the SQL leg with this gateway's corpus statistics;
- sparse: bge-m3's learned-sparse leg, in SQL.

Each runs on a pooled read connection, timed as its leg. :meth:`RetrievalLegs.rescore` gives every
fused candidate the cache holds its exact cosine. The cache and the engine are the app's,
built before the retriever; both load in the background while pgvector and SQL serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import asyncpg
import numpy as np

from gateway.access.acl import chunk_readable
from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import LEGS, GatewaySettings
from gateway.retrieval.query_cache import QueryVector
from index.search.bm25 import CorpusStats
from index.search.dense_leg import DenseLeg, seed_chunks
from index.search.lexical_engine import Connections, LexicalEngine
from index.search.lexical_leg import lexical_search, sparse_search
from index.store.hits import ChunkHit, ChunkKey, Scope
from index.store.partitions import ModelPartition

if TYPE_CHECKING:  # FAISS loads only when the app builds a cache
    from index.vectors.cache import VectorCache

T = TypeVar("T")

__all__ = ["LegResults", "RetrievalLegs", "SeedNotFound", "over_fetch"]


class SeedNotFound(Exception):
    """The seed record does not exist, has no stored vectors, or the caller may not read it."""


def over_fetch(limit: int) -> int:
    """Candidates each leg fetches for a final ``limit``: ``max(limit * 4, 20)``."""
    return max(limit * 4, 20)


@dataclass(frozen=True)
class LegResults:
    """Each leg's ranked chunks for one query (before fusion and the gate)."""

    lists: Mapping[str, Sequence[ChunkHit]]
    exact: Mapping[ChunkKey, float] = field(default_factory=dict)  # cached cosine of each candidate


class RetrievalLegs:
    """The legs over one gateway's read pool, with the app's vector cache and lexical engine (or None)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        settings: GatewaySettings,
        metrics: Metrics,
        *,
        vector_cache: VectorCache | None = None,
        lexical_engine: LexicalEngine | None = None,
        corpus_stats: CorpusStats | None = None,
        reread_pool: Connections | None = None,
    ) -> None:
        """``reread_pool``: read connections whose sessions plan the lexical engine's re-read once
        (:data:`index.search.read_settings.PLANNED_ONCE`); None re-reads on the leg's own."""
        self.pool = pool
        self.reread_pool = reread_pool
        self.settings = settings
        self.metrics = metrics
        self.vector_cache = vector_cache
        self.lexical_engine = lexical_engine
        # The SQL lexical leg's IDF (the app shares one with its lexical engine's re-read).
        self.stats = corpus_stats or CorpusStats(ttl=settings.lexical_stats_ttl)
        # pgvector's dense leg, which alone decides exact scan or HNSW for a scope.
        self.dense = DenseLeg(
            ef_search=settings.hnsw_ef_search,
            max_scan_tuples=settings.hnsw_max_scan_tuples,
            exact_max_rows=settings.dense_exact_max_rows,
        )

    async def timed(self, leg: str, run: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """``run`` on a pooled read connection, its time recorded as retrieval leg ``leg``."""
        with self.metrics.time_leg(leg):
            async with self.pool.acquire() as conn:
                return await run(conn)

    async def lexical(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        query: str,
        scope: Scope,
        fetch: int,
        modality: str = "text",
    ) -> list[ChunkHit]:
        """The lexical leg over ``modality`` rows: from the lexical engine when it can answer
        exactly, else in SQL with this gateway's corpus statistics (IDF)."""
        if self.lexical_engine is not None:
            hits = await self.lexical_engine.search(
                conn, partition, query, scope, fetch, modality=modality, reread=self.reread_pool
            )
            if hits is not None:
                return hits
        return await lexical_search(conn, partition, query, scope, fetch, stats=self.stats, modality=modality)

    async def dense_leg(
        self, partition: ModelPartition, vector: np.ndarray, scope: Scope, fetch: int
    ) -> tuple[list[ChunkHit], bool]:
        """The dense leg: from the FAISS cache when it can answer exactly, else pgvector's HNSW.

        Returns the hits and whether the cache served them.
        """
        with self.metrics.time_leg("dense"):
            async with self.pool.acquire() as conn:
                if self.vector_cache is not None:
                    hits = await self.vector_cache.search(conn, partition, vector, scope, fetch)
                    if hits is not None:
                        return hits, True
                return await self.hnsw_search(conn, partition, vector, scope, fetch), False

    async def hnsw_search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        vector: np.ndarray,
        scope: Scope,
        fetch: int,
        modality: str = "text",
    ) -> list[ChunkHit]:
        """pgvector's dense search: HNSW, or the exact scan where :class:`DenseLeg` decides it."""
        return await self.dense.search(conn, partition, vector, scope, fetch, modality)

    async def readable_seeds(
        self,
        principal: Principal,
        partition: ModelPartition,
        section_tipo: str,
        section_id: int,
        *,
        group: str | None = None,
        modality: str = "text",
        view: str | None = None,
    ) -> list[ChunkHit]:
        """A seed record's stored rows (with vectors) that the caller may read, of one ``view`` when
        given; none (missing, unreadable, nothing stored) -> :class:`SeedNotFound`, alike."""
        async with self.pool.acquire() as conn:
            seeds = await seed_chunks(
                conn, partition, section_tipo, section_id, group=group, modality=modality
            )
        seeds = [c for c in seeds if chunk_readable(principal, c)]
        if view is not None:
            seeds = [c for c in seeds if c.meta.get("view", "") == view]
        if not seeds:
            raise SeedNotFound()
        return seeds

    def rescore(
        self,
        partition: ModelPartition,
        vectors: Sequence[np.ndarray],
        lists: Mapping[str, Sequence[ChunkHit]],
    ) -> dict[ChunkKey, float]:
        """Exact cosine (best over ``vectors``) of every candidate the cache holds; {} when cold."""
        if self.vector_cache is None:
            return {}
        keys = list(dict.fromkeys(c.key for rows in lists.values() for c in rows))
        row_keys = [(t, i, comp, lang, "", idx) for t, i, comp, lang, idx in keys]  # text rows: view ''
        best: dict[ChunkKey, float] = {}
        for vector in vectors:
            for row_key, score in self.vector_cache.similarities(partition, vector, row_keys).items():
                key = (row_key[0], row_key[1], row_key[2], row_key[3], row_key[5])
                best[key] = max(score, best.get(key, -1.0))
        return best

    async def gather(
        self, partition: ModelPartition, query: str, vector: QueryVector, scope: Scope, fetch: int,
        legs: Sequence[str] = LEGS,
    ) -> LegResults:  # fmt: skip
        """The requested legs of a text query in parallel (``scope`` carries the ACL push-down;
        nothing gated yet), with the cache's exact cosine of every candidate."""
        tasks: dict[str, asyncio.Task[list[ChunkHit]]] = {}
        dense: asyncio.Task[tuple[list[ChunkHit], bool]] | None = None
        async with asyncio.TaskGroup() as tg:
            if "dense" in legs:
                dense = tg.create_task(self.dense_leg(partition, vector.dense, scope, fetch))
            if "lexical" in legs:
                tasks["lexical"] = tg.create_task(
                    self.timed("lexical", lambda c: self.lexical(c, partition, query, scope, fetch))
                )
            if "sparse" in legs and vector.sparse:
                tasks["sparse"] = tg.create_task(
                    self.timed("sparse", lambda c: sparse_search(c, partition, vector.sparse, scope, fetch))
                )
        lists = {name: task.result() for name, task in tasks.items()}
        if dense is not None:
            lists = {"dense": dense.result()[0], **lists}
        return LegResults(lists, self.rescore(partition, [vector.dense], lists))
