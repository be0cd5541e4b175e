"""Hybrid retrieval: query vector -> dense, lexical and learned-sparse legs -> fusion -> ACL gate.

The pipeline every text action shares:

1. the query vector from the sidecar (LRU-cached); none usable ->
   :class:`EmbeddingUnavailable`, never a blind ranking;
2. the legs in parallel over the model's partition, each over-fetching
   ``max(limit * 4, 20)`` with the scope and the caller's ACL pushed into SQL;
3. fusion (:mod:`gateway.fusion`): distribution-normalized scores by default
   (``RAG_FUSION``), or the fusion tuned for the searched sections (their descriptors);
4. the ACL gate (:mod:`gateway.acl`) on every fused candidate;
5. passages as they are, or collapsed to the best chunk per record.

``similar_to`` skips the sidecar: it searches with the seed's stored vectors.

With the FAISS cache (:mod:`index.vector_cache`) holding the partition, the
dense leg (and ``similar_to``'s neighbours) come from it: exact top-k with the
scope and ACL inside the search, rows re-read from the store. Every fused
candidate is then re-scored with its exact cached vector: that cosine is the
candidate's ``similarity`` and decides between candidates RRF leaves tied
(before the identity tie-break). Cache off, cold or over budget: the SQL leg,
exactly as without a cache.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

import asyncpg
import numpy as np

from index.bm25 import CorpusStats
from index.dense_leg import dense_search, may_read_exactly, reads_exactly, seed_chunks
from index.hits import ChunkHit, ChunkKey, Scope, scope_key
from index.lexical_index import LexicalIndex
from index.lexical_leg import lexical_search, sparse_search
from index.lru import Lru
from index.models import ModelNotServed, resolve_model
from index.partitions import ModelPartition, get_partition, serving_model
from index.sections import SectionStore
from inference.client import EmbedResult, ModelInfo, SidecarClient, SidecarError, SidecarRejected

from .acl import chunk_readable, gate, pushdown
from .auth import Principal
from .fusion import collapse, rrf, score_fusion
from .metrics import Metrics
from .query_cache import QueryVector, QueryVectorCache
from .settings import FUSION_METHODS, LEGS, GatewaySettings

if TYPE_CHECKING:  # FAISS loads only when the app builds a cache
    from index.vector_cache import VectorCache

log = logging.getLogger(__name__)

# How stale a gateway's idea of the serving text model may be after a model-change backfill's
# swap: until it re-reads, it serves the old model from the old partition (kept), whole answers.
SERVING_TTL_S = 1.0
EXACT_DECISION_TTL_S = 60.0  # a scope's exact-or-HNSW choice is re-estimated after this (stores grow)
EXACT_DECISIONS_KEPT = 4096  # scopes whose choice is kept (the least recently used go first)

T = TypeVar("T")

__all__ = [
    "EmbeddingUnavailable",
    "LegResults",
    "QueryRejected",
    "Ranked",
    "Retriever",
    "SeedNotFound",
    "over_fetch",
]


class EmbeddingUnavailable(Exception):
    """The sidecar did not give a usable query vector (down, overloaded, refused, or malformed)."""


class QueryRejected(Exception):
    """The sidecar refused the query text itself (a 4xx for the input): the caller's error, not an outage."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class SeedNotFound(Exception):
    """The seed record does not exist, has no stored vectors, or the caller may not read it."""


@dataclass(frozen=True, slots=True)  # no __dict__: a search builds one per authorized candidate
class Ranked:
    """A fused, authorized chunk: the fused score and its rank in each leg that found it."""

    chunk: ChunkHit
    score: float
    ranks: Mapping[str, int]
    similarity: float | None = None  # best single-leg cosine similarity, when a dense leg found it
    rerank_score: float | None = None  # the cross-encoder's score, when reranked


@dataclass(frozen=True)
class LegResults:
    """Each leg's ranked chunks for one query (before fusion and the gate)."""

    lists: Mapping[str, Sequence[ChunkHit]]
    exact: Mapping[ChunkKey, float] = field(default_factory=dict)  # cached cosine of each candidate


def _tuned_fusion(entry: object) -> tuple[str, tuple[tuple[str, float], ...]] | None:
    """A descriptor's ``retrieval`` entry as (method, weights), or None when absent or unusable."""
    if not isinstance(entry, Mapping):
        return None
    method, weights = entry.get("fusion"), entry.get("weights")
    if method not in FUSION_METHODS or not isinstance(weights, Mapping):
        log.warning("ignoring a section's tuned fusion %r: unknown method or no weights", entry)
        return None
    try:
        clean = tuple(sorted((str(leg), float(w)) for leg, w in weights.items() if leg in LEGS))
    except (TypeError, ValueError):
        return None
    if not clean or any(not math.isfinite(w) or w < 0 for _, w in clean) or not any(w for _, w in clean):
        return None
    return str(method), clean


def over_fetch(limit: int) -> int:
    """Candidates each leg fetches for a final ``limit``: ``max(limit * 4, 20)``."""
    return max(limit * 4, 20)


def _similarities(
    lists: Mapping[str, Sequence[ChunkHit]], exact: Mapping[ChunkKey, float]
) -> dict[ChunkKey, float]:
    """Each candidate's best cosine similarity from a scored leg (``dense``, ``seed:*``), the exact
    re-scores of cached vectors over them."""
    similarity: dict[ChunkKey, float] = {}
    for name, rows in lists.items():
        if name == "dense" or name.startswith("seed:"):
            for chunk in rows:
                similarity[chunk.key] = max(similarity.get(chunk.key, -1.0), chunk.score)
    similarity.update(exact)
    return similarity


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


class Retriever:
    """The retrieval engine of one gateway (pool, query-side sidecar client, caches, metrics)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        settings: GatewaySettings,
        metrics: Metrics | None = None,
    ) -> None:
        self.pool = pool
        self.vector_cache: VectorCache | None = None  # set by the app once the cache exists
        self.lexical_index: LexicalIndex | None = None  # set by the app with RAG_LEXICAL_INDEX=memory
        self.client = client
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.cache = QueryVectorCache(settings.query_cache_size)
        self.stats = CorpusStats(ttl=settings.lexical_stats_ttl)
        self._model: ModelInfo | None = None  # resolved on first use
        self._serving_read_at = 0.0  # monotonic time rag_serving_models was last read
        self._partitions: dict[str, ModelPartition] = {}
        # section tipo -> (when read, (method, weights) tuned for it or None)
        self._fusion_cache: dict[str, tuple[float, tuple[str, tuple[tuple[str, float], ...]] | None]] = {}
        self._ttl = settings.lexical_stats_ttl
        # (partition, modality, scope) -> (when decided, whether the dense leg reads it exactly)
        self._exact_scopes: Lru[Hashable, tuple[float, bool]] = Lru(EXACT_DECISIONS_KEPT)
        self._weights = settings.weights  # parsed once (the property parses RAG_FUSION_WEIGHTS per read)

    # -- model, partition, query vector -------------------------------------------------------

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

    async def partition(self, model_id: str) -> ModelPartition | None:
        """The model's partition, or None while nothing was ever stored for it."""
        cached = self._partitions.get(model_id)
        if cached is None:
            cached = await get_partition(self.pool, model_id)
            if cached is not None:
                self._partitions[model_id] = cached
        return cached

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

    # -- legs, fusion, gate --------------------------------------------------------------------

    async def embed_image_query(self, model: ModelInfo, query: str) -> np.ndarray:
        """A text through the image-text model's text tower (sidecar ``/text``), never ``/embed``."""
        try:
            result = await self.client.embed_image_texts(model.id, [query])
        except SidecarError as exc:
            log.warning("text-to-image query embedding failed: %s", exc)
            raise EmbeddingUnavailable(str(exc)) from exc
        return _only_vector(result, model.dimension)

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
        """The lexical leg over ``modality`` rows: from the in-memory index when it can answer
        exactly, else in SQL with this engine's corpus statistics (IDF)."""
        if self.lexical_index is not None:
            hits = await self.lexical_index.search(conn, partition, query, scope, fetch, modality=modality)
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
        """pgvector's HNSW dense search with the configured scan settings, or the exact search for a
        scope whose few rows the planner reads through an index (:meth:`_reads_exactly`)."""
        s = self.settings
        return await dense_search(
            conn,
            partition,
            vector,
            scope,
            fetch,
            ef_search=s.hnsw_ef_search,
            max_scan_tuples=s.hnsw_max_scan_tuples,
            modality=modality,
            exact=await self._reads_exactly(scope, conn, partition, vector, fetch, modality),
        )

    async def _reads_exactly(
        self, scope: Scope, conn: asyncpg.Connection, partition: ModelPartition, vector: np.ndarray, fetch: int,
        modality: str,
    ) -> bool:  # fmt: skip
        """:func:`index.dense_leg.reads_exactly` with ``RAG_DENSE_EXACT_MAX_ROWS``, remembered: a scope is
        asked once per partition and minute (the record a similar search excludes does not count),
        so the estimate's round trip is rare."""
        scope = replace(scope, exclude_record=None)
        max_rows = self.settings.dense_exact_max_rows
        if not may_read_exactly(scope, max_rows):  # reads_exactly's own answer, without the cache lookup
            return False
        key = (partition.partition, modality, scope_key(scope))
        now = time.monotonic()
        known = self._exact_scopes.get(key)
        if known is not None and now - known[0] < EXACT_DECISION_TTL_S:
            return known[1]
        exact = await reads_exactly(conn, partition, vector, scope, fetch, max_rows, modality)
        self._exact_scopes.put(key, (now, exact))
        return exact

    def _rescore(
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

    async def query_legs(
        self,
        principal: Principal,
        query: str,
        scope: Scope,
        fetch: int,
        legs: Sequence[str] = LEGS,
    ) -> LegResults:
        """Run the requested legs for a text query (ACL pushed into SQL; not yet gated)."""
        model_id, vector = await self.embed_query(principal, query)
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
        return LegResults(lists, self._rescore(partition, [vector.dense], lists))

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
        """Fuse the legs (``method``: ``dbsf``, ``minmax`` or ``rrf``; default the settings'), then gate.

        ``per_record``: each record's best chunk only; ``limit``: the first ``limit`` of them. Every
        candidate is fused and gated either way (the gate's count of dropped candidates stays whole);
        only the kept ones become :class:`Ranked` (a search fuses about 80 for 10).
        """
        weights = self._weights if weights is None else weights
        method = self.settings.fusion if method is None else method
        lists = results.lists
        with self.metrics.time_leg("fusion"):
            by_key: dict[tuple, ChunkHit] = {}
            for name in [n for n in LEGS if n in lists] + sorted(set(lists) - set(LEGS)):
                for chunk in lists[name]:
                    by_key.setdefault(chunk.key, chunk)  # dense's row first (same content in every leg)
            if method == "rrf":
                fused = rrf(
                    {name: [c.key for c in rows] for name, rows in lists.items()},
                    k=self.settings.rrf_k,
                    weights=weights,
                )
            else:
                fused = score_fusion(
                    {name: [(c.key, c.score) for c in rows] for name, rows in lists.items()},
                    weights=weights,
                    normalize=method,
                )
            similarity = _similarities(lists, results.exact)
            if results.exact:  # re-scored with exact cached vectors: RRF ties go to the closer one
                fused.sort(key=lambda f: (-f.score, f.best_rank, -similarity.get(f.key, -2.0)))
        with self.metrics.time_leg("acl"):
            allowed = gate(principal, (by_key[f.key] for f in fused), scope)
            dropped = len(fused) - len(allowed)
            if dropped:
                self.metrics.acl_dropped.inc(dropped)
        if per_record:
            allowed = collapse(allowed, lambda c: c.record, limit)
        elif limit is not None:
            allowed = allowed[:limit]
        scores = {f.key: f for f in fused}
        out = []
        for c in allowed:
            f = scores[c.key]
            out.append(Ranked(c, f.score, f.ranks, similarity.get(f.key)))
        return out

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
            method, weights = await self.section_fusion(scope)
        return self.fuse(
            principal, results, scope, weights=weights, method=method, limit=limit, per_record=per_record
        )

    async def section_fusion(self, scope: Scope) -> tuple[str | None, Mapping[str, float] | None]:
        """The fusion tuned for the searched sections (``retrieval`` in their descriptors), if they agree.

        ``mnemo eval --tune --apply SECTION`` stores it. A query over several sections uses it
        only when all of them carry the same one; otherwise (and unscoped) the settings' fusion.
        Descriptors are cached for ``RAG_LEXICAL_STATS_TTL`` seconds, like the corpus statistics.
        """
        if not scope.section_tipos:
            return None, None
        now = time.monotonic()
        missing = [
            t
            for t in scope.section_tipos
            if now - self._fusion_cache.get(t, (-math.inf, None))[0] >= self._ttl
        ]
        if missing:
            found = await SectionStore(self.pool).get_many(missing)
            for tipo in missing:
                self._fusion_cache[tipo] = (now, _tuned_fusion((found.get(tipo) or {}).get("retrieval")))
        tuned = {self._fusion_cache[t][1] for t in scope.section_tipos}
        agreed = tuned.pop() if len(tuned) == 1 else None
        if agreed is None:
            return None, None
        method, weights = agreed
        return method, dict(weights)

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
            return (await self.dense_leg(partition, seed.vector, scope, fetch))[0]

        found = await asyncio.gather(*(one(seed) for seed in seeds))
        lists = {f"seed:{i:04d}": rows for i, rows in enumerate(found)}
        vectors = [seed.vector for seed in seeds if seed.vector is not None]
        results = LegResults(lists, self._rescore(partition, vectors, lists))
        return self.fuse(principal, results, scope, weights={}, method="rrf", limit=limit, per_record=True)
