"""Fusion and the ACL gate: the legs' lists -> one authorized ranking.

The legs' candidates are fused (:mod:`gateway.retrieval.fusion`: distribution-normalized scores by default,
``RAG_FUSION``, or the fusion tuned for the searched sections, :class:`SectionFusion`), then every
fused candidate passes the ACL gate (:mod:`gateway.access.acl`) before any score leaves, then they are kept
as passages or collapsed to each record's best chunk. A candidate's ``similarity`` is its best
cosine from a dense leg, or the exact one of its cached vector when the FAISS cache re-scored it
(that cosine also decides between candidates RRF leaves tied, before the identity tie-break).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import asyncpg

from gateway.access.acl import gate
from gateway.access.auth import Principal
from gateway.base.metrics import Metrics
from gateway.base.settings import FUSION_METHODS, LEGS, GatewaySettings
from gateway.retrieval.fusion import collapse, rrf, score_fusion
from gateway.retrieval.legs import LegResults
from index.store.hits import ChunkHit, ChunkKey, Scope
from index.store.sections import SectionStore

log = logging.getLogger(__name__)

__all__ = ["Ranked", "SectionFusion", "fuse"]

TunedFusion = tuple[str, tuple[tuple[str, float], ...]]  # (method, sorted (leg, weight) pairs)


@dataclass(frozen=True, slots=True)  # no __dict__: a search builds one per authorized candidate
class Ranked:
    """A fused, authorized chunk: the fused score and its rank in each leg that found it."""

    chunk: ChunkHit
    score: float
    ranks: Mapping[str, int]
    similarity: float | None = None  # best single-leg cosine similarity, when a dense leg found it
    rerank_score: float | None = None  # the cross-encoder's score, when reranked


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


def fuse(
    principal: Principal,
    results: LegResults,
    scope: Scope,
    settings: GatewaySettings,
    metrics: Metrics,
    *,
    weights: Mapping[str, float],
    method: str,
    limit: int | None = None,
    per_record: bool = False,
) -> list[Ranked]:
    """Fuse the legs (``method``: ``dbsf``, ``minmax`` or ``rrf``), then gate.

    ``per_record``: each record's best chunk only; ``limit``: the first ``limit`` of them. Every
    candidate is fused and gated either way (the gate's count of dropped candidates stays whole);
    only the kept ones become :class:`Ranked` (a search fuses about 80 for 10).
    """
    lists = results.lists
    with metrics.time_leg("fusion"):
        by_key: dict[tuple, ChunkHit] = {}
        for name in [n for n in LEGS if n in lists] + sorted(set(lists) - set(LEGS)):
            for chunk in lists[name]:
                by_key.setdefault(chunk.key, chunk)  # dense's row first (same content in every leg)
        if method == "rrf":
            fused = rrf(
                {name: [c.key for c in rows] for name, rows in lists.items()},
                k=settings.rrf_k,
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
    with metrics.time_leg("acl"):
        allowed = gate(principal, (by_key[f.key] for f in fused), scope)
        dropped = len(fused) - len(allowed)
        if dropped:
            metrics.acl_dropped.inc(dropped)
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


def _tuned_fusion(entry: object) -> TunedFusion | None:
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


class SectionFusion:
    """The fusion tuned for the searched sections (``retrieval`` in their descriptors), cached."""

    def __init__(self, pool: asyncpg.Pool, ttl: float) -> None:
        self.pool = pool
        self.ttl = ttl
        self._cache: dict[str, tuple[float, TunedFusion | None]] = {}  # tipo -> (when read, tuned)

    async def for_scope(self, scope: Scope) -> tuple[str | None, Mapping[str, float] | None]:
        """(method, weights) tuned for ``scope``'s sections when they all agree; (None, None) else.

        ``mnemo eval --tune --apply SECTION`` stores it. A query over several sections uses it
        only when all of them carry the same one; otherwise (and unscoped) the settings' fusion.
        Descriptors are cached for ``RAG_LEXICAL_STATS_TTL`` seconds, like the corpus statistics.
        """
        if not scope.section_tipos:
            return None, None
        now = time.monotonic()
        missing = [
            t for t in scope.section_tipos if now - self._cache.get(t, (-math.inf, None))[0] >= self.ttl
        ]
        if missing:
            found = await SectionStore(self.pool).get_many(missing)
            for tipo in missing:
                self._cache[tipo] = (now, _tuned_fusion((found.get(tipo) or {}).get("retrieval")))
        tuned = {self._cache[t][1] for t in scope.section_tipos}
        agreed = tuned.pop() if len(tuned) == 1 else None
        if agreed is None:
            return None, None
        method, weights = agreed
        return method, dict(weights)
