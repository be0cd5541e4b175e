"""Typed keys for the state the gateway shares between routes (aiohttp ``AppKey``/``RequestKey``).

The app's cleanup contexts fill them (pool, sidecar client, ...); routes, the
intake and the retrieval code read them. Keeping them here lets every module
import the keys without importing the app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg
from aiohttp import web

if TYPE_CHECKING:
    from inference.client import SidecarClient

    from .auth import Principal, TokenVerifier
    from .settings import GatewaySettings

POOL_KEY: web.AppKey[asyncpg.Pool] = web.AppKey("pool", asyncpg.Pool)
SIDECAR_KEY: web.AppKey[SidecarClient] = web.AppKey("sidecar")
SETTINGS_KEY: web.AppKey[GatewaySettings] = web.AppKey("settings")
VERIFIER_KEY: web.AppKey[TokenVerifier] = web.AppKey("token_verifier")
# The retrieval engine (gateway.retrieval.Retriever) and metrics (gateway.metrics.Metrics).
RETRIEVER_KEY: web.AppKey[Any] = web.AppKey("retriever")
METRICS_KEY: web.AppKey[Any] = web.AppKey("metrics")
DATABASE_URL_KEY: web.AppKey[str] = web.AppKey("database_url", str)
# The FAISS cache (index.vector_cache.VectorCache), present unless RAG_FAISS_CACHE=off.
VECTOR_CACHE_KEY: web.AppKey[Any] = web.AppKey("vector_cache")
# ask's reranker, generator and section store (gateway.ask.AskServices).
ASK_KEY: web.AppKey[Any] = web.AppKey("ask_services")

# Per-request state.
REQUEST_ID_KEY: web.RequestKey[str] = web.RequestKey("request_id", str)
PRINCIPAL_KEY: web.RequestKey[Principal] = web.RequestKey("principal")  # memoized by authenticate()
ACTION_KEY: web.RequestKey[str] = web.RequestKey("action", str)  # the dd_rag_api action, for metrics
ERROR_CODE_KEY: web.RequestKey[str] = web.RequestKey("error_code", str)  # the failure's code, for metrics
ALLOWED_METHODS_KEY: web.RequestKey[Any] = web.RequestKey("allowed_methods")

__all__ = [
    "ACTION_KEY",
    "ALLOWED_METHODS_KEY",
    "ASK_KEY",
    "DATABASE_URL_KEY",
    "ERROR_CODE_KEY",
    "METRICS_KEY",
    "POOL_KEY",
    "PRINCIPAL_KEY",
    "REQUEST_ID_KEY",
    "RETRIEVER_KEY",
    "SETTINGS_KEY",
    "SIDECAR_KEY",
    "VECTOR_CACHE_KEY",
    "VERIFIER_KEY",
]
