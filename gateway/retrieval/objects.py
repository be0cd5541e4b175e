"""The image layer's retrieval: ``similar_objects``, ``search_by_text_image``, ``characterize_object``.

All three search the image-text model's partition (``modality = 'image'``
rows) and pass every candidate row through the one ACL gate
(:func:`gateway.access.acl.gate`: section, image component, projects) before any
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
  (:mod:`gateway.retrieval.characterize`). A neighbour's weight is its best cosine
  similarity (clamped at 0); a neighbour found only by the lexical leg
  carries no vote, since the proposal is meant to come from looks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np

from gateway.access.acl import gate, pushdown
from gateway.access.auth import Principal
from gateway.base.settings import GatewaySettings
from gateway.retrieval.characterize import Vote, categorical_vote, date_summary
from gateway.retrieval.fusion import rrf
from gateway.retrieval.legs import RetrievalLegs, SeedNotFound
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryEmbedder
from index.store.hits import ChunkHit, Scope
from index.store.partitions import ModelPartition, Partitions
from index.store.sections import SectionStore
from inference.client import ModelInfo

__all__ = ["ObjectHit", "ObjectRetriever", "object_dict"]

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
    """Image retrieval beside a gateway's text retrieval, on the same query embedder, legs and
    partitions; one per app, so the image-text model resolves once."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        queries: QueryEmbedder,
        legs: RetrievalLegs,
        partitions: Partitions,
        settings: GatewaySettings,
    ) -> None:
        self.pool = pool  # the section descriptors' compare_scope and roles
        self.queries = queries
        self.legs = legs
        self.partitions = partitions
        self.settings = settings
        self._model: ModelInfo | None = None

    async def image_model(self) -> ModelInfo:
        """The image-text model (``RAG_IMAGE_MODEL`` or the sidecar's first); unavailable -> 503."""
        if self._model is None:
            self._model = await self.queries.resolve_model("image_text", self.settings.sidecar.image_model)
        return self._model

    async def partition(self) -> ModelPartition | None:
        return await self.partitions.of((await self.image_model()).id)

    async def _dense(
        self, partition: ModelPartition, vector: np.ndarray, scope: Scope, fetch: int
    ) -> list[ChunkHit]:
        return await self.legs.timed(
            "image_dense",
            lambda conn: self.legs.hnsw_search(conn, partition, vector, scope, fetch, "image"),
        )

    async def _lexical(
        self, partition: ModelPartition, query: str, scope: Scope, fetch: int
    ) -> list[ChunkHit]:
        return await self.legs.timed(
            "image_lexical",
            lambda conn: self.legs.lexical(conn, partition, query, scope, fetch, "image"),
        )

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
        seeds = await self.legs.readable_seeds(
            principal, partition, section_tipo, section_id, modality="image", view=view
        )
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
        vector = await self.queries.embed_image_query(await self.image_model(), query)
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
