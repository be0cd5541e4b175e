"""The query side of retrieval: which model a search uses, and its query vectors from the sidecar.

A request resolves the text model once (:meth:`QueryEmbedder.text_model`) and searches that model's
partition, so an answer is one model's, never a mix. Query vectors are LRU-cached per caller, model
and normalized query. No usable vector (sidecar down, overloaded, malformed answer) is
:class:`EmbeddingUnavailable`, never a blind ranking; a query text the sidecar refuses is
:class:`QueryRejected`, the caller's error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import asyncpg
import numpy as np

from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import GatewaySettings
from gateway.retrieval.query_cache import QueryVector, QueryVectorCache
from index.models import ModelNotServed, resolve_model
from index.store.partitions import serving_model
from inference.client import EmbedResult, ModelInfo, SidecarClient, SidecarError, SidecarRejected

log = logging.getLogger(__name__)

# How stale a gateway's idea of the serving text model may be after a model-change backfill's
# swap: until it re-reads, it serves the old model from the old partition (kept), whole answers.
SERVING_TTL_S = 1.0

__all__ = ["SERVING_TTL_S", "EmbeddingUnavailable", "QueryEmbedder", "QueryRejected"]


class EmbeddingUnavailable(Exception):
    """The sidecar did not give a usable query vector (down, overloaded, refused, or malformed)."""


class QueryRejected(Exception):
    """The sidecar refused the query text itself (a 4xx for the input): the caller's error, not an outage."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _usable(vector: np.ndarray, dimension: int | None) -> bool:
    if vector.ndim != 1 or vector.size == 0 or not np.all(np.isfinite(vector)):
        return False
    if dimension is not None and vector.size != dimension:
        return False
    return float(np.linalg.norm(vector)) > 1e-6


def _only_vector(result: EmbedResult, dimension: int | None) -> np.ndarray:
    """The one query vector of ``result``; none usable -> :class:`EmbeddingUnavailable`."""
    embeddings = np.asarray(result.embeddings, dtype=np.float32)
    vector = embeddings[0] if embeddings.ndim == 2 and embeddings.shape[0] == 1 else np.empty(0)
    if not _usable(vector, dimension):
        log.error("the sidecar returned no usable query vector (shape %s)", embeddings.shape)
        raise EmbeddingUnavailable("no usable query vector")
    return vector


class QueryEmbedder:
    """The models a gateway searches with and its query vectors (query-side sidecar client, cache)."""

    def __init__(
        self, pool: asyncpg.Pool, client: SidecarClient, settings: GatewaySettings, metrics: Metrics
    ) -> None:
        self.pool = pool  # reads rag_serving_models
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.cache = QueryVectorCache(settings.query_cache_size)
        self._model: ModelInfo | None = None  # resolved on first use
        self._serving_read_at = 0.0  # monotonic time rag_serving_models was last read

    async def resolve_model(self, kind: str, configured: str | None) -> ModelInfo:
        """The sidecar's model of ``kind`` (``configured``, or its first); none -> :class:`EmbeddingUnavailable`."""
        try:
            return await resolve_model(self.client, kind, configured)
        except ModelNotServed as exc:
            log.error("no usable %s model: %s", kind, exc)
            raise EmbeddingUnavailable(str(exc)) from exc
        except SidecarError as exc:
            log.warning("sidecar unavailable while resolving the %s model: %s", kind, exc)
            raise EmbeddingUnavailable(str(exc)) from exc

    async def text_model(self) -> ModelInfo:
        """The text model: the configured id (resolved once); unset, the model a model-change
        backfill made serve text (re-read at most every :data:`SERVING_TTL_S`, so a blue/green
        swap reaches a running gateway), else the sidecar's first text model. A request resolves
        it once and searches that model's partition, so an answer is one model's, never a mix."""
        configured = self.settings.sidecar.text_model
        if configured:
            if self._model is None:
                self._model = await self.resolve_model("text", configured)
            return self._model
        now = time.monotonic()
        if self._model is None or now - self._serving_read_at >= SERVING_TTL_S:
            serving = await serving_model(self.pool)
            self._serving_read_at = now
            if self._model is None or (serving is not None and serving != self._model.id):
                self._model = await self.resolve_model("text", serving)
        return self._model

    async def embed_query(self, principal: Principal, query: str) -> tuple[str, QueryVector]:
        """(model id, query vector); cached per caller, model and normalized query."""
        model = await self.text_model()
        model_id = model.id
        cached = self.cache.get(model_id, query, owner=principal.sub)
        if cached is not None:
            self.metrics.query_cache_lookup("hit")
            return model_id, cached
        self.metrics.query_cache_lookup("miss")
        with self.metrics.time_leg("embed"):
            try:
                result = await self._embed(model, [query])
            except SidecarRejected as exc:
                # A 4xx other than 429 is about this input (a text the model cannot take): retrying
                # or reporting an outage would both be wrong.
                log.info("the sidecar refused the query: %s", exc)
                raise QueryRejected(exc.code, exc.message) from exc
            except SidecarError as exc:
                log.warning("query embedding failed: %s", exc)
                raise EmbeddingUnavailable(str(exc)) from exc
        dense = _only_vector(result, model.dimension)
        sparse = result.sparse[0] if result.sparse else None
        vector = QueryVector(dense=dense / np.linalg.norm(dense), sparse=sparse or None)
        self.cache.put(model_id, query, vector, owner=principal.sub)
        return model_id, vector

    async def _embed(self, model: ModelInfo, texts: Sequence[str]) -> EmbedResult:
        """Query embeddings, with sparse weights when ``/models`` says the model has a sparse head."""
        return await self.client.embed(model.id, texts, truncate=True, return_sparse=model.sparse)

    async def warm_queries(self, principal: Principal, queries: Sequence[str]) -> int:
        """Embed many queries in batched sidecar calls and cache them for ``principal`` (eval, benchmarks).

        Returns how many were embedded.
        """
        model = await self.text_model()
        model_id = model.id
        owner = principal.sub
        todo = list(dict.fromkeys(q for q in queries if self.cache.get(model_id, q, owner=owner) is None))
        if not todo:
            return 0
        try:
            result = await self._embed(model, todo)
        except SidecarError as exc:
            raise EmbeddingUnavailable(str(exc)) from exc
        embeddings = np.asarray(result.embeddings, dtype=np.float32)
        for i, query in enumerate(todo):
            if _usable(embeddings[i], model.dimension):
                sparse = result.sparse[i] if result.sparse else None
                vector = QueryVector(embeddings[i] / np.linalg.norm(embeddings[i]), sparse or None)
                self.cache.put(model_id, query, vector, owner=owner)
        return len(todo)

    async def embed_image_query(self, model: ModelInfo, query: str) -> np.ndarray:
        """A text through the image-text model's text tower (sidecar ``/text``), never ``/embed``."""
        try:
            result = await self.client.embed_image_texts(model.id, [query])
        except SidecarError as exc:
            log.warning("text-to-image query embedding failed: %s", exc)
            raise EmbeddingUnavailable(str(exc)) from exc
        return _only_vector(result, model.dimension)
