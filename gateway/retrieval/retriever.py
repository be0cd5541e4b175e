"""Hybrid retrieval: query vector -> dense, lexical and learned-sparse legs -> fusion -> ACL gate.

The :class:`Retriever` owns a text query's path, one collaborator per step, each built once per
app (:func:`gateway.retrieval.engines.build_retrieval`) and handed in:

1. the query vector from the sidecar (:class:`~gateway.retrieval.query_embedding.QueryEmbedder`,
   LRU-cached); none usable -> :class:`~gateway.retrieval.query_embedding.EmbeddingUnavailable`,
   never a blind ranking;
2. the legs in parallel over the model's partition (:class:`~gateway.retrieval.legs.RetrievalLegs`),
   each over-fetching ``max(limit * 4, 20)`` with the scope and the caller's ACL pushed into SQL;
   the dense leg from the FAISS cache and the lexical leg from the lexical engine when they can
   answer exactly;
3. fusion (tuned per section when its descriptor says so), then the ACL gate on every fused
   candidate (:mod:`gateway.retrieval.ranking`);
4. passages as they are, or collapsed to the best chunk per record.

``similar_to`` skips the sidecar: it searches with the seed's stored vectors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from gateway.access.acl import pushdown
from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import LEGS, GatewaySettings
from gateway.retrieval.legs import LegResults, RetrievalLegs, SeedNotFound, over_fetch
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryEmbedder
from gateway.retrieval.ranking import Ranked, SectionFusion, fuse
from index.store.hits import ChunkHit, Scope
from index.store.partitions import Partitions
from inference.client import ModelInfo

log = logging.getLogger(__name__)

__all__ = ["Retriever"]


class Retriever:
    """The text retrieval of one gateway: query embedding, legs, fusion and gate."""

    def __init__(
        self,
        queries: QueryEmbedder,
        legs: RetrievalLegs,
        partitions: Partitions,
        fusion: SectionFusion,
        settings: GatewaySettings,
        metrics: Metrics,
    ) -> None:
        self.queries = queries
        self.legs = legs
        self.partitions = partitions
        self.fusion = fusion
        self.settings = settings
        self.metrics = metrics
        self._weights = settings.weights  # parsed once (the property parses RAG_FUSION_WEIGHTS per read)

    async def text_model(self) -> ModelInfo:
        """The text model this gateway searches now (:meth:`QueryEmbedder.text_model`)."""
        return await self.queries.text_model()

    async def ranked(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        limit: int,
        *,
        per_record: bool,
        legs: Sequence[str] = LEGS,
        weights: Mapping[str, float] | None = None,
    ) -> list[Ranked]:
        """The first ``limit`` authorized passages for a query, or with ``per_record`` the best
        passage of each of the first ``limit`` records: the over-fetched legs, fused (with the
        searched sections' tuned fusion unless ``weights`` are given), gated."""
        results = await self.query_legs(principal, query, scope, over_fetch(limit), legs)
        method = None
        if weights is None:
            method, weights = await self.fusion.for_scope(scope)
        return self.fuse(
            principal, results, scope, weights=weights, method=method, limit=limit, per_record=per_record
        )

    async def query_legs(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        fetch: int,
        legs: Sequence[str] = LEGS,
    ) -> LegResults:
        """The requested legs of a text query (ACL pushed into SQL; not yet gated)."""
        model_id, vector = await self.queries.embed_query(principal, query)
        partition = await self.partitions.of(model_id)
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
        return await self.legs.gather(partition, query, vector, scope, fetch, legs)

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
        partition = await self.partitions.of(model.id)
        if partition is None:
            raise SeedNotFound()
        seeds = await self.legs.readable_seeds(principal, partition, section_tipo, section_id, group=group)
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
