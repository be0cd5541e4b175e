"""Typed keys for the plumbing the gateway shares between routes (aiohttp ``AppKey``/``RequestKey``).

The app's cleanup contexts fill them (pool, sidecar client, ...); routes, the
intake, the error middleware and the retrieval code read them. This module
sits below all of them, so it imports only leaf types: a key whose value is a
gateway engine lives beside it instead (the principal and the token verifier
in :mod:`gateway.access.auth`, the retrieval engines and action services in
:mod:`gateway.actions.context`), which keeps the import graph acyclic.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web

from gateway.base.metrics import Metrics
from gateway.base.settings import GatewaySettings
from index.search.bm25 import CorpusStats
from index.search.lexical_engine import LexicalEngine
from inference.client import SidecarClient
from schema.read_pool import ReadPool

if TYPE_CHECKING:  # FAISS loads only when the app builds a cache
    from index.vectors.cache import VectorCache

POOL_KEY: web.AppKey[asyncpg.Pool] = web.AppKey("pool", asyncpg.Pool)
SIDECAR_KEY: web.AppKey[SidecarClient] = web.AppKey("sidecar", SidecarClient)
# The query side's own client (one retry: a search fails fast rather than wait out backoffs),
# shared by retrieval, the reranker and the answer provider.
QUERY_SIDECAR_KEY: web.AppKey[SidecarClient] = web.AppKey("query_sidecar", SidecarClient)
SETTINGS_KEY: web.AppKey[GatewaySettings] = web.AppKey("settings", GatewaySettings)
METRICS_KEY: web.AppKey[Metrics] = web.AppKey("metrics", Metrics)
DATABASE_URL_KEY: web.AppKey[str] = web.AppKey("database_url", str)
# Retrieval's reads: a streaming replica when RAG_DATABASE_READ_URL names one and it is fresh.
READ_POOL_KEY: web.AppKey[ReadPool] = web.AppKey("read_pool", ReadPool)
# The FAISS cache, present unless RAG_FAISS_CACHE=off.
VECTOR_CACHE_KEY: web.AppKey[VectorCache] = web.AppKey("vector_cache")
# The lexical engine (the Tantivy index on disk: RAG_LEXICAL_INDEX=auto|tantivy), present unless it is off.
LEXICAL_INDEX_KEY: web.AppKey[LexicalEngine] = web.AppKey("lexical_index", LexicalEngine)
# The SQL lexical leg's corpus statistics (IDF), shared by the legs and the Tantivy engine's re-read.
CORPUS_STATS_KEY: web.AppKey[CorpusStats] = web.AppKey("corpus_stats", CorpusStats)
# How many processes serve this port (`mnemo gateway --workers N`): each enforces 1/N of a principal's
# fairness limits, so RAG_FAIR_* mean the same per gateway whatever the worker count.
WORKERS_KEY: web.AppKey[int] = web.AppKey("workers", int)

# Per-request state.
REQUEST_ID_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)
ACTION_KEY: web.RequestKey[str] = web.RequestKey("action", str)  # the dd_rag_api action, for metrics
ERROR_CODE_KEY: web.RequestKey[str] = web.RequestKey("error_code", str)  # the failure's code, for metrics
# The methods a route allows, for a 405's Allow header.
ALLOWED_METHODS_KEY: web.RequestKey[Collection[str]] = web.RequestKey("allowed_methods")

__all__ = [
    "ACTION_KEY",
    "ALLOWED_METHODS_KEY",
    "CORPUS_STATS_KEY",
    "DATABASE_URL_KEY",
    "ERROR_CODE_KEY",
    "METRICS_KEY",
    "POOL_KEY",
    "QUERY_SIDECAR_KEY",
    "READ_POOL_KEY",
    "REQUEST_ID_KEY",
    "SETTINGS_KEY",
    "SIDECAR_KEY",
    "VECTOR_CACHE_KEY",
]
