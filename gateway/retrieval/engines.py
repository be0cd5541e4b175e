"""One gateway's retrieval, built once: the collaborators every engine shares, then the engines.

The app factory (and a test or benchmark that wants a gateway's retrieval without the app) calls
:func:`build_retrieval`; each engine gets only what it uses, and nothing reaches through another
engine for a collaborator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from gateway.base.metrics import Metrics
from gateway.base.settings import GatewaySettings
from gateway.retrieval.expand import ChunkWindows
from gateway.retrieval.legs import RetrievalLegs
from gateway.retrieval.objects import ObjectRetriever
from gateway.retrieval.query_embedding import QueryEmbedder
from gateway.retrieval.ranking import SectionFusion
from gateway.retrieval.retriever import Retriever
from index.search.bm25 import CorpusStats
from index.search.lexical_engine import Connections, LexicalEngine
from index.store.partitions import Partitions
from inference.client import SidecarClient

if TYPE_CHECKING:  # FAISS loads only when the app builds a cache
    from index.vectors.cache import VectorCache

__all__ = ["RetrievalEngines", "build_retrieval"]


@dataclass(frozen=True)
class RetrievalEngines:
    """The shared collaborators (query embedder, legs, partitions) and the engines built on them."""

    queries: QueryEmbedder
    legs: RetrievalLegs
    partitions: Partitions
    retriever: Retriever
    objects: ObjectRetriever
    windows: ChunkWindows


def build_retrieval(
    pool: asyncpg.Pool,
    client: SidecarClient,
    settings: GatewaySettings,
    metrics: Metrics | None = None,
    *,
    vector_cache: VectorCache | None = None,
    lexical_engine: LexicalEngine | None = None,
    corpus_stats: CorpusStats | None = None,
    reread_pool: Connections | None = None,
) -> RetrievalEngines:
    """Retrieval over a read ``pool`` and the sidecar ``client``, with the app's vector cache and
    lexical engine when it has them; both may still be loading (pgvector and SQL serve until then)."""
    metrics = metrics or Metrics()
    queries = QueryEmbedder(pool, client, settings, metrics)
    legs = RetrievalLegs(
        pool,
        settings,
        metrics,
        vector_cache=vector_cache,
        lexical_engine=lexical_engine,
        corpus_stats=corpus_stats,
        reread_pool=reread_pool,
    )
    partitions = Partitions(pool)
    fusion = SectionFusion(pool, settings.lexical_stats_ttl)
    return RetrievalEngines(
        queries=queries,
        legs=legs,
        partitions=partitions,
        retriever=Retriever(queries, legs, partitions, fusion, settings, metrics),
        objects=ObjectRetriever(pool, queries, legs, partitions, settings),
        windows=ChunkWindows(pool, partitions, queries.text_model),
    )
