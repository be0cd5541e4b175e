"""Cross-encoder reranking of fused candidates through the sidecar's ``/rerank``.

Contract: reorder only, never drop or add. When the reranker is not served,
fails, or is slower than ``RAG_RERANK_TIMEOUT``, the fused order stands, the
caller is told (``reranked: false``) and ``mnemo_rerank_fallbacks`` counts it:
a slow cross-encoder must not turn a search into a timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.base.metrics import Metrics
from gateway.retrieval.ranking import Ranked
from index.models import resolve_model
from inference.client import SidecarClient

log = logging.getLogger(__name__)

__all__ = ["RerankOutcome", "Reranker"]


@dataclass(frozen=True)
class RerankOutcome:
    ranked: list[Ranked]
    reranked: bool
    model: str | None = None


class Reranker:
    """Reorders candidates with the configured (or first served) ``rerank`` model."""

    def __init__(
        self, client: SidecarClient, configured: str | None, timeout: float, metrics: Metrics
    ) -> None:
        self.client = client
        self.configured = configured
        self.timeout = timeout
        self.metrics = metrics
        self._model: str | None = None

    async def _model_id(self) -> str:
        if self._model is None:
            self._model = (await resolve_model(self.client, "rerank", self.configured)).id
        return self._model

    async def rerank(self, query: str, ranked: Sequence[Ranked], depth: int) -> RerankOutcome:
        """The first ``depth`` candidates by cross-encoder score (stable on ties), the rest after them."""
        head, tail = list(ranked[:depth]), list(ranked[depth:])
        if not head:
            return RerankOutcome([], reranked=False)
        try:
            async with asyncio.timeout(self.timeout):
                model = await self._model_id()
                scores = await self.client.rerank(model, query, [r.chunk.text for r in head])
        except TimeoutError:
            return self._fallback(ranked, "timeout")
        except Exception as exc:  # the sidecar's errors, a missing model: same outcome, logged
            log.warning("rerank failed, keeping the fused order: %s", exc)
            return self._fallback(ranked, type(exc).__name__)
        order = sorted(range(len(head)), key=lambda i: (-scores[i], i))
        reordered = [replace(head[i], rerank_score=float(scores[i])) for i in order]
        return RerankOutcome(reordered + tail, reranked=True, model=model)

    def _fallback(self, ranked: Sequence[Ranked], reason: str) -> RerankOutcome:
        self.metrics.rerank_fallbacks.labels(reason).inc()
        return RerankOutcome(list(ranked), reranked=False)
