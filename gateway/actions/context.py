"""What an action handler runs against: the caller, the retrieval engines and the optional services.

The app's cleanup contexts build the engines once and keep them on the app
under the typed keys below; :func:`action_context` reads them for one call, so
the HTTP dispatcher and the MCP server hand a handler exactly the same thing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp import web

from gateway.access.auth import Principal
from gateway.actions.providers import Provider
from gateway.base.ask_settings import AskSettings
from gateway.base.errors import ApiError
from gateway.base.metrics import Metrics
from gateway.base.resources import POOL_KEY
from gateway.budgets.ledger import BUDGETS_KEY, Metering
from gateway.retrieval.expand import ChunkWindows, Expanded
from gateway.retrieval.objects import ObjectRetriever
from gateway.retrieval.query_embedding import EmbeddingUnavailable, QueryRejected
from gateway.retrieval.ranking import Ranked
from gateway.retrieval.rerank import Reranker
from gateway.retrieval.retriever import Retriever
from index.store.sections import SectionStore

__all__ = [
    "ASK_KEY",
    "OBJECTS_KEY",
    "PASSAGES_KEY",
    "RETRIEVER_KEY",
    "WINDOWS_KEY",
    "ActionContext",
    "Args",
    "AskServices",
    "Handler",
    "PassageServices",
    "action_context",
    "query_error",
]


@dataclass(frozen=True)
class PassageServices:
    """The optional steps of the passage actions and ask: cross-encoder rerank, small-to-big expansion."""

    reranker: Reranker
    rerank_depth: int
    expand_neighbours: int
    expand_parent_chunks: int

    @classmethod
    def configured(cls, reranker: Reranker, settings: AskSettings) -> PassageServices:
        return cls(reranker, settings.rerank_depth, settings.expand_neighbours, settings.expand_parent_chunks)

    def depth(self, limit: int, rerank: bool) -> int:
        """Candidates to retrieve: ``limit``, or the rerank depth when reranking (it reorders a deeper pool)."""
        return max(limit, self.rerank_depth) if rerank else limit

    async def rerank(self, query: str, ranked: Sequence[Ranked], limit: int) -> tuple[list[Ranked], bool]:
        """``ranked`` reordered by the cross-encoder and cut to ``limit``; whether the reorder happened."""
        outcome = await self.reranker.rerank(query, ranked, self.depth(limit, True))
        return outcome.ranked[:limit], outcome.reranked

    async def expand(
        self, windows: ChunkWindows, principal: Principal, ranked: Sequence[Ranked], mode: str
    ) -> list[Expanded]:
        """Small-to-big expansion of ``ranked`` (``mode``: neighbours or parent) with the configured widths."""
        return await windows.expand(
            principal, ranked, mode, neighbours=self.expand_neighbours, parent_limit=self.expand_parent_chunks
        )


@dataclass(frozen=True)
class AskServices:
    """What ask needs besides retrieval and the passage steps: the generator and its egress inputs."""

    settings: AskSettings
    provider: Provider
    sections: SectionStore
    metrics: Metrics


RETRIEVER_KEY: web.AppKey[Retriever] = web.AppKey("retriever", Retriever)
OBJECTS_KEY: web.AppKey[ObjectRetriever] = web.AppKey("object_retriever", ObjectRetriever)
PASSAGES_KEY: web.AppKey[PassageServices] = web.AppKey("passage_services", PassageServices)
ASK_KEY: web.AppKey[AskServices] = web.AppKey("ask_services", AskServices)
WINDOWS_KEY: web.AppKey[ChunkWindows] = web.AppKey("chunk_windows", ChunkWindows)


@dataclass(frozen=True)
class ActionContext:
    """One call's caller and engines. The services are None in an app built without them (a wiring
    bug, reported as such when an action needs one, never as the caller's error)."""

    principal: Principal
    retriever: Retriever
    windows: ChunkWindows
    pool: asyncpg.Pool
    objects: ObjectRetriever | None = None
    passages: PassageServices | None = None
    ask: AskServices | None = None
    metering: Metering | None = None  # this call's budget reservations (None: an app without budgets)

    def object_retriever(self) -> ObjectRetriever:
        if self.objects is None:
            raise RuntimeError("the image retrieval is not configured")
        return self.objects

    def passage_services(self) -> PassageServices:
        if self.passages is None:
            raise RuntimeError("the passage services (reranker, expansion) are not configured")
        return self.passages

    def ask_services(self) -> AskServices:
        if self.ask is None:
            raise RuntimeError("the ask services (generator, section store) are not configured")
        return self.ask


Args = Mapping[
    str, Any
]  # an action's options as its declared readers returned them (gateway.actions.options)
Handler = Callable[[ActionContext, Args], Awaitable[tuple[str, Any]]]


def action_context(app: web.Application, principal: Principal) -> ActionContext:
    """The context of one call by ``principal`` against a started app's engines."""
    budgets = app.get(BUDGETS_KEY)
    return ActionContext(
        principal,
        app[RETRIEVER_KEY],
        app[WINDOWS_KEY],
        app[POOL_KEY],
        app.get(OBJECTS_KEY),
        app.get(PASSAGES_KEY),
        app.get(ASK_KEY),
        None if budgets is None else Metering(budgets, principal),
    )


def query_error(exc: EmbeddingUnavailable | QueryRejected) -> ApiError:
    """A failed query embedding, at the edge: bad input is the caller's 400, anything else a 503."""
    if isinstance(exc, QueryRejected):
        return ApiError.invalid_options(f"query: the embedding model refused it ({exc.code}: {exc.message})")
    return ApiError.embedding_unavailable()
