"""The image layer's retrieval: ``similar_objects``, ``search_by_text_image``, ``characterize_object``.

All three search the image-text model's partition (``modality = 'image'``
rows) and pass every candidate row through the one ACL gate
(:func:`gateway.acl.gate`: section, image component, projects) before any
score or count is used; role values are read only from components the caller
may read. A seed the caller may not read is :class:`SeedNotFound`, exactly
like a missing one.

- ``similar_objects``: the seed's stored image vectors (never re-embedded).
  One dense list per seed image, each restricted to the same view (a coin's
  obverse against obverses) unless ``view`` names one; each list is gated and
  collapsed to records, and the lists are fused with RRF, so an object close
  on both faces outranks one close on a single face. ``hybrid`` mode adds a
  lexical list over the stored context summaries, queried with the seed's own
  summary; ``visual`` skips it. ``near_duplicate`` keeps only objects whose
  best single-view cosine similarity reaches ``RAG_NEAR_DUPLICATE_SIMILARITY``.
  The scope defaults to the seed section's ``compare_scope`` (its own section
  when that is empty).
- ``search_by_text_image``: the query through the image-text model's text
  tower (sidecar ``/text``), never the text ``/embed`` model, whose space is
  unrelated.
- ``characterize_object``: the seed's neighbours, then per role of the seed
  section's context a similarity-weighted vote or date summary
  (:mod:`gateway.characterize`). A neighbour's weight is its best cosine
  similarity (clamped at 0); a neighbour found only by the lexical leg
  carries no vote, since the proposal is meant to come from looks.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from index.partitions import ModelPartition, get_partition
from index.search import ChunkHit, Scope, lexical_search, seed_chunks
from index.sections import SectionStore

from . import options as opt
from .acl import chunk_readable, gate, pushdown
from .auth import Principal
from .characterize import Vote, categorical_vote, date_summary
from .errors import ApiError
from .fusion import rrf
from .retrieval import EmbeddingUnavailable, Retriever, SeedNotFound

if TYPE_CHECKING:
    from .actions import ActionContext

__all__ = [
    "ObjectHit",
    "ObjectRetriever",
    "characterize_object",
    "object_dict",
    "objects_for",
    "search_by_text_image",
    "similar_objects",
]

log = logging.getLogger(__name__)

MIN_CANDIDATES = 40  # per list: max(40, limit * 4), as the archive's layer fetches


@dataclass(frozen=True)
class ObjectHit:
    """A neighbour object: its best image row, fused score and best single-view similarity."""

    row: ChunkHit
    score: float
    similarity: float | None

    @property
    def record(self) -> tuple[str, int]:
        return self.row.record


def candidates(limit: int) -> int:
    return max(MIN_CANDIDATES, limit * 4)


def _best_per_record(rows: Sequence[ChunkHit]) -> list[ChunkHit]:
    seen: set[tuple[str, int]] = set()
    out = []
    for row in rows:
        if row.record not in seen:
            seen.add(row.record)
            out.append(row)
    return out


def readable_roles(principal: Principal, row: ChunkHit) -> dict[str, Any]:
    """The row's role values the caller may read (each role names the component it came from)."""
    out = {}
    for role, spec in (row.meta.get("roles") or {}).items():
        tipo = spec.get("tipo") if isinstance(spec, Mapping) else None
        if isinstance(tipo, str) and principal.component_level(row.section_tipo, tipo) >= 1:
            out[role] = spec.get("value")
    return out


class ObjectRetriever:
    """Image retrieval over one gateway's pool and sidecar (the model is resolved once)."""

    def __init__(self, retriever: Retriever) -> None:
        self.base = retriever
        self.pool = retriever.pool
        self.settings = retriever.settings
        self._model: Any = None
        self._partition: ModelPartition | None = None

    async def image_model(self) -> Any:
        """The image-text model (``RAG_IMAGE_MODEL`` or the sidecar's first); unavailable -> 503."""
        if self._model is None:
            from index.models import ModelNotServed, resolve_model
            from inference.client import SidecarError

            try:
                self._model = await resolve_model(
                    self.base.client, "image_text", self.settings.sidecar.image_model
                )
            except (ModelNotServed, SidecarError) as exc:
                log.warning("no usable image-text model: %s", exc)
                raise EmbeddingUnavailable(str(exc)) from exc
        return self._model

    async def partition(self) -> ModelPartition | None:
        if self._partition is None:
            model = await self.image_model()
            self._partition = await get_partition(self.pool, model.id)
        return self._partition

    async def _dense(
        self, partition: ModelPartition, vector: np.ndarray, scope: Scope, fetch: int
    ) -> list[ChunkHit]:
        return await self.base._timed(
            "image_dense", lambda conn: self.base.hnsw_search(conn, partition, vector, scope, fetch, "image")
        )

    async def _lexical(
        self, partition: ModelPartition, query: str, scope: Scope, fetch: int
    ) -> list[ChunkHit]:
        async def run(conn: Any) -> list[ChunkHit]:
            return await lexical_search(
                conn, partition, query, scope, fetch, stats=self.base.stats, modality="image"
            )

        return await self.base._timed("image_lexical", run)

    async def compare_scope(self, section_tipo: str) -> tuple[str, ...]:
        descriptor = await SectionStore(self.pool).get(section_tipo)
        scope = ((descriptor or {}).get("context") or {}).get("compare_scope") or []
        return tuple(scope) or (section_tipo,)

    async def similar(
        self,
        principal: Principal,
        section_tipo: str,
        section_id: int,
        *,
        limit: int,
        mode: str = "hybrid",
        view: str | None = None,
        near_duplicate: bool = False,
        scope: tuple[str, ...] | None = None,
    ) -> list[ObjectHit]:
        """Objects closest to a seed object, best first (see the module notes)."""
        partition = await self.partition()
        if partition is None:
            raise SeedNotFound()
        async with self.pool.acquire() as conn:
            seeds = await seed_chunks(conn, partition, section_tipo, section_id, modality="image")
        seeds = [s for s in seeds if chunk_readable(principal, s)]
        if view is not None:
            seeds = [s for s in seeds if s.meta.get("view", "") == view]
        if not seeds:
            raise SeedNotFound()
        sections = scope or await self.compare_scope(section_tipo)
        fetch = candidates(limit)
        acl = pushdown(principal)
        lists: dict[str, list[ChunkHit]] = {}
        scopes: dict[str, Scope] = {}
        for i, seed in enumerate(seeds):
            seed_view = view if view is not None else (seed.meta.get("view") or None)
            scopes[f"view:{i:03d}"] = Scope(
                section_tipos=sections, exclude_record=(section_tipo, section_id), acl=acl, view=seed_view
            )
        found = await asyncio.gather(
            *(self._dense(partition, seeds[i].vector, scopes[name], fetch) for i, name in enumerate(scopes))
        )
        for name, rows in zip(scopes, found, strict=True):
            lists[name] = _best_per_record(gate(principal, rows, scopes[name]))
        summary = seeds[0].text
        if mode == "hybrid" and summary.strip():
            lexical_scope = Scope(
                section_tipos=sections, exclude_record=(section_tipo, section_id), acl=acl, view=view
            )
            rows = await self._lexical(partition, summary, lexical_scope, fetch)
            lists["lexical"] = _best_per_record(gate(principal, rows, lexical_scope))
        return self._fuse(lists, limit, near_duplicate)

    def _fuse(
        self, lists: Mapping[str, Sequence[ChunkHit]], limit: int, near_duplicate: bool
    ) -> list[ObjectHit]:
        best: dict[tuple[str, int], ChunkHit] = {}
        similarity: dict[tuple[str, int], float] = {}
        for name, rows in lists.items():
            for row in rows:
                if name != "lexical" and row.score > similarity.get(row.record, -2.0):
                    similarity[row.record] = row.score
                    best[row.record] = row  # the visually closest face represents the object
                best.setdefault(row.record, row)
        fused = rrf({n: [r.record for r in rows] for n, rows in lists.items()}, k=self.settings.rrf_k)
        out = []
        floor = self.settings.near_duplicate_similarity
        for f in fused:
            sim = similarity.get(f.key)
            if near_duplicate and (sim is None or sim < floor):
                continue
            out.append(ObjectHit(best[f.key], f.score, sim))
        return out[:limit]

    async def by_text(
        self, principal: Principal, query: str, sections: tuple[str, ...] | None, limit: int
    ) -> list[ObjectHit]:
        """Objects whose images best match a text, through the image-text model's text tower."""
        from inference.client import SidecarError

        model = await self.image_model()
        try:
            result = await self.base.client.embed_image_texts(model.id, [query])  # type: ignore[attr-defined]
        except SidecarError as exc:
            log.warning("text-to-image query embedding failed: %s", exc)
            raise EmbeddingUnavailable(str(exc)) from exc
        vectors = np.asarray(result.embeddings, dtype=np.float32)
        vector = vectors[0] if vectors.ndim == 2 and vectors.shape[0] == 1 else np.empty(0)
        if vector.size == 0 or not np.all(np.isfinite(vector)) or float(np.linalg.norm(vector)) < 1e-6:
            raise EmbeddingUnavailable("no usable query vector")
        partition = await self.partition()
        if partition is None:
            return []
        if partition.dimension != vector.size:
            raise EmbeddingUnavailable("query vector dimension does not match the store")
        scope = Scope(section_tipos=sections, acl=pushdown(principal))
        rows = await self._dense(partition, vector, scope, candidates(limit))
        records = _best_per_record(gate(principal, rows, scope))[:limit]
        # A single list: the display score is 1 / (1 + cosine distance), as the archive shows it.
        return [ObjectHit(r, 1.0 / (2.0 - r.score), r.score) for r in records]

    async def characterize(
        self,
        principal: Principal,
        section_tipo: str,
        section_id: int,
        *,
        top_k: int,
        mode: str = "hybrid",
    ) -> dict[str, Any]:
        """Per-role proposals from the seed's neighbours, with confidence and evidence."""
        hits = await self.similar(principal, section_tipo, section_id, limit=top_k, mode=mode)
        descriptor = await SectionStore(self.pool).get(section_tipo)
        roles = ((descriptor or {}).get("context") or {}).get("metadata") or {}
        proposals: dict[str, Any] = {}
        for role, spec in roles.items():
            votes = []
            for hit in hits:
                values = readable_roles(principal, hit.row)
                if role in values and hit.similarity is not None:
                    votes.append(Vote(hit, max(0.0, hit.similarity), values[role]))
            if spec.get("kind") == "date":
                proposals[role] = _date(principal, date_summary(votes))
            else:
                proposals[role] = _categorical(principal, categorical_vote(votes))
        model = await self.image_model()
        return {
            "section_tipo": section_tipo,
            "section_id": section_id,
            "model": model.id,
            "neighbours": len(hits),
            "proposals": proposals,
        }


def object_dict(principal: Principal, hit: ObjectHit) -> dict[str, Any]:
    """The contract's object shape (section_tipo, section_id, similarity, score, view, thumb_url, context)."""
    row = hit.row
    return {
        "section_tipo": row.section_tipo,
        "section_id": row.section_id,
        "similarity": None if hit.similarity is None else round(hit.similarity, 6),
        "score": round(hit.score, 6),
        "view": row.meta.get("view", ""),
        "thumb_url": row.meta.get("thumb_url"),
        "context": readable_roles(principal, row),
        "component_tipo": row.component_tipo,
        "title": row.meta.get("title", ""),
    }


def _evidence(principal: Principal, votes: Sequence[Vote]) -> list[dict[str, Any]]:
    return [{**object_dict(principal, v.key), "weight": round(v.weight, 6)} for v in votes]


def _categorical(principal: Principal, proposal: Any) -> dict[str, Any]:
    if proposal is None:
        return {"kind": "categorical", "value": None, "confidence": 0.0, "distribution": [], "evidence": []}
    return {
        "kind": "categorical",
        "value": proposal.value,
        "confidence": round(proposal.confidence, 6),
        "distribution": [{"value": v, "share": round(s, 6)} for v, s in proposal.distribution],
        "evidence": _evidence(principal, proposal.evidence),
    }


def _date(principal: Principal, proposal: Any) -> dict[str, Any]:
    if proposal is None:
        return {
            "kind": "date",
            "earliest": None,
            "latest": None,
            "central": None,
            "confidence": 0.0,
            "evidence": [],
        }
    return {
        "kind": "date",
        "earliest": proposal.earliest,
        "latest": proposal.latest,
        "central": proposal.central,
        "confidence": round(proposal.confidence, 6),
        "evidence": _evidence(principal, proposal.evidence),
    }


_CACHE: weakref.WeakKeyDictionary[Retriever, ObjectRetriever] = weakref.WeakKeyDictionary()


def objects_for(retriever: Retriever) -> ObjectRetriever:
    """The image retrieval of a gateway (one per retrieval engine, so the model resolves once)."""
    found = _CACHE.get(retriever)
    if found is None:
        found = _CACHE[retriever] = ObjectRetriever(retriever)
    return found


# -- the dd_rag_api handlers ----------------------------------------------------------------------


async def similar_objects(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    section_tipo, section_id = opt.seed(options)
    objects = objects_for(ctx.retriever)
    try:
        hits = await objects.similar(
            ctx.principal,
            section_tipo,
            section_id,
            limit=opt.limit(options),
            mode=opt.similarity_mode(options),
            view=opt.view(options),
            near_duplicate=opt.flag(options, "near_duplicate"),
            scope=opt.compare_scope(options),
        )
    except SeedNotFound as exc:  # the same answer for a missing seed and a forbidden one
        raise ApiError.invalid_options("Unknown seed record") from exc
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc
    return "ok", [object_dict(ctx.principal, h) for h in hits]


async def search_by_text_image(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    query, sections, limit = opt.query(options), opt.scope(options), opt.limit(options)
    try:
        hits = await objects_for(ctx.retriever).by_text(ctx.principal, query, sections, limit)
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc
    return "ok", [object_dict(ctx.principal, h) for h in hits]


async def characterize_object(ctx: ActionContext, options: Mapping[str, Any]) -> tuple[str, Any]:
    section_tipo, section_id = opt.seed(options)
    try:
        data = await objects_for(ctx.retriever).characterize(
            ctx.principal,
            section_tipo,
            section_id,
            top_k=ctx.retriever.settings.characterize_top_k,
            mode=opt.similarity_mode(options),
        )
    except SeedNotFound as exc:
        raise ApiError.invalid_options("Unknown seed record") from exc
    except EmbeddingUnavailable as exc:
        raise ApiError.embedding_unavailable() from exc
    return "ok", data
