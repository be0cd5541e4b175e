"""Hybrid retrieval: query vector -> dense, lexical and learned-sparse legs -> fusion -> ACL gate.

The pipeline every text action shares, one module per step:

1. the query vector from the sidecar (:mod:`gateway.retrieval.query_embedding`, LRU-cached); none usable ->
   :class:`~gateway.retrieval.query_embedding.EmbeddingUnavailable`, never a blind ranking;
2. the legs in parallel over the model's partition (:mod:`gateway.retrieval.legs`), each over-fetching
   ``max(limit * 4, 20)`` with the scope and the caller's ACL pushed into SQL; the dense leg from
   the FAISS cache and the lexical leg from the lexical engine when they can answer exactly;
3. fusion, then the ACL gate on every fused candidate (:mod:`gateway.retrieval.ranking`);
4. passages as they are, or collapsed to the best chunk per record.

``similar_to`` skips the sidecar: it searches with the seed's stored vectors.

The :class:`Retriever` is built with its collaborators: the vector cache and the lexical engine
(or None) are the app's, created before it and loading in the background while pgvector and SQL
serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import asyncpg

from gateway.access.acl import chunk_readable, pushdown
from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import LEGS, GatewaySettings
from gateway.retrieval.legs import LegResults, RetrievalLegs, over_fetch
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryEmbedder
from gateway.retrieval.ranking import Ranked, SectionFusion, fuse
from index.search.bm25 import CorpusStats
from index.search.dense_leg import seed_chunks
from index.search.lexical_engine import LexicalEngine
from index.store.hits import ChunkHit, Scope
from index.store.partitions import ModelPartition, get_partition
from inference.client import ModelInfo, SidecarClient

if TYPE_CHECKING:  # FAISS loads only when the app builds a cache
    from index.vectors.cache import VectorCache

log = logging.getLogger(__name__)

__all__ = ["Retriever", "SeedNotFound"]


class SeedNotFound(Exception):
    """The seed record does not exist, has no stored vectors, or the caller may not read it."""


class Retriever:
    """The retrieval engine of one gateway: query embedding, legs, fusion and gate over a read pool."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        settings: GatewaySettings,
        metrics: Metrics | None = None,
        *,
        vector_cache: VectorCache | None = None,
        lexical_engine: LexicalEngine | None = None,
        corpus_stats: CorpusStats | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.queries = QueryEmbedder(pool, client, settings, self.metrics)
        self.legs = RetrievalLegs(
            pool,
            settings,
            self.metrics,
            vector_cache=vector_cache,
            lexical_engine=lexical_engine,
            corpus_stats=corpus_stats,
        )
        self.fusion = SectionFusion(pool, settings.lexical_stats_ttl)
        self._partitions: dict[str, ModelPartition] = {}
        self._weights = settings.weights  # parsed once (the property parses RAG_FUSION_WEIGHTS per read)

    async def text_model(self) -> ModelInfo:
        """The text model this gateway searches now (:meth:`QueryEmbedder.text_model`)."""
        return await self.queries.text_model()

    async def partition(self, model_id: str) -> ModelPartition | None:
        """The model's partition, or None while nothing was ever stored for it."""
        cached = self._partitions.get(model_id)
        if cached is None:
            cached = await get_partition(self.pool, model_id)
            if cached is not None:
                self._partitions[model_id] = cached
        return cached

    async def query_legs(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        fetch: int,
        legs: Sequence[str] = LEGS,
    ) -> LegResults:
        """Run the requested legs for a text query (ACL pushed into SQL; not yet gated)."""
        model_id, vector = await self.queries.embed_query(principal, query)
        partition = await self.partition(model_id)
        if partition is None:
            return LegResults({})
        if partition.dimension != vector.dense.size:
            log.error(
                "query vector has %d dimensions, partition %s has %d",
                vector.dense.size,
                partition.partition,
                partition.dimension,
            )
            raise EmbeddingUnavailable("query vector dimension does not match the store")
        scope = Scope(scope.section_tipos, scope.group, scope.exclude_record, pushdown(principal))
        return await self.legs.run(partition, query, vector, scope, fetch, legs)

    def fuse(
        self,
        principal: Principal,
        results: LegResults,
        scope: Scope,
        *,
        weights: Mapping[str, float] | None = None,
        method: str | None = None,
        limit: int | None = None,
        per_record: bool = False,
    ) -> list[Ranked]:
        """:func:`gateway.retrieval.ranking.fuse` with the settings' weights and method unless given."""
        return fuse(
            principal,
            results,
            scope,
            self.settings,
            self.metrics,
            weights=self._weights if weights is None else weights,
            method=self.settings.fusion if method is None else method,
            limit=limit,
            per_record=per_record,
        )

    # -- the actions' retrievals ---------------------------------------------------------------

    async def passages(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        limit: int,
        *,
        legs: Sequence[str] = LEGS,
        weights: Mapping[str, float] | None = None,
    ) -> list[Ranked]:
        """The best authorized passages (chunks) for a query."""
        return await self._ranked(principal, query, scope, limit, legs, weights, per_record=False)

    async def records(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        limit: int,
        *,
        legs: Sequence[str] = LEGS,
        weights: Mapping[str, float] | None = None,
    ) -> list[Ranked]:
        """The best authorized records for a query (each its best chunk)."""
        return await self._ranked(principal, query, scope, limit, legs, weights, per_record=True)

    async def _ranked(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        limit: int,
        legs: Sequence[str],
        weights: Mapping[str, float] | None,
        *,
        per_record: bool,
    ) -> list[Ranked]:
        """The first ``limit`` authorized passages (or records' best passages) of the over-fetched
        legs, fused."""
        results = await self.query_legs(principal, query, scope, over_fetch(limit), legs)
        method = None
        if weights is None:
            method, weights = await self.fusion.for_scope(scope)
        return self.fuse(
            principal, results, scope, weights=weights, method=method, limit=limit, per_record=per_record
        )

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

    async def similar(
        self,
        principal: Principal,
        section_tipo: str,
        section_id: int,
        limit: int,
        *,
        group: str | None = None,
    ) -> list[Ranked]:
        """Records closest to a seed record, searched with the seed's stored vectors (never re-embedded).

        Each of the seed's first ``RAG_SIMILAR_SEED_CHUNKS`` readable chunks is
        one dense query; their lists are fused, gated and collapsed to records,
        the seed itself excluded. With ``group``, seed and neighbours narrow to
        that facet. A seed the caller may not read is reported as not found.
        """
        model = await self.text_model()
        partition = await self.partition(model.id)
        if partition is None:
            raise SeedNotFound()
        seeds = await self.readable_seeds(principal, partition, section_tipo, section_id, group=group)
        seeds = seeds[: self.settings.similar_seed_chunks]
        scope = Scope(group=group, exclude_record=(section_tipo, section_id), acl=pushdown(principal))
        fetch = over_fetch(limit)

        async def one(seed: ChunkHit) -> list[ChunkHit]:
            assert seed.vector is not None
            return (await self.legs.dense_leg(partition, seed.vector, scope, fetch))[0]

        found = await asyncio.gather(*(one(seed) for seed in seeds))
        lists = {f"seed:{i:04d}": rows for i, rows in enumerate(found)}
        vectors = [seed.vector for seed in seeds if seed.vector is not None]
        results = LegResults(lists, self.legs.rescore(partition, vectors, lists))
        return self.fuse(principal, results, scope, weights={}, method="rrf", limit=limit, per_record=True)
