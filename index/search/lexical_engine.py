"""The lexical leg as a swappable engine: what the retriever needs from one.

Two implementations answer the same leg. The SQL leg (:func:`index.search.lexical_leg.lexical_search`)
always can; an engine that holds its own copy of the text (the on-disk Tantivy index,
:class:`index.lexical.engine.TantivyLexical`) answers faster when it can answer *exactly*: its
scores and tie order are the SQL leg's, and its candidates are re-read from PostgreSQL under the
caller's current ACL, so an engine can only hide a row, never reveal one. When it cannot (still
loading, behind the change feed, a modality it does not hold) it says so with None and the retriever
asks the SQL leg: never a partial or stale answer.

The engine is matched structurally (a :class:`typing.Protocol`): an engine imports nothing from
here, it only has these methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import asyncpg

from index.store.hits import ChunkHit, Scope
from index.store.partitions import ModelPartition

__all__ = ["Connections", "LexicalEngine"]


class Connections(Protocol):
    """Where a read takes a connection from: an asyncpg pool, or the gateway's read pool."""

    def acquire(self) -> AbstractAsyncContextManager[asyncpg.Connection]: ...


class LexicalEngine(Protocol):
    """A lexical leg the gateway starts with the app, asks first, and stops with it.

    Lifecycle: the app builds the engine before the retriever, calls :meth:`start` (which returns at
    once: loading and following the change feed run in the background, the SQL leg serving
    meanwhile), and :meth:`stop` at shutdown. :meth:`status` is the engine's part of ``/readyz``.
    """

    async def start(self) -> None:
        """Begin loading and following the store's changes in the background; return at once."""
        ...

    async def stop(self) -> None:
        """Stop following the store and release what the engine holds."""
        ...

    async def status(
        self, conn: asyncpg.Connection, partitions: Sequence[ModelPartition]
    ) -> dict[str, object]:
        """The ``/readyz`` detail: at least ``mode`` and ``running``, then each of ``partitions`` in
        the index folders' vocabulary (:mod:`index.follow.folder_state`), read on ``conn``."""
        ...

    async def search(
        self,
        conn: asyncpg.Connection,
        partition: ModelPartition,
        query: str,
        scope: Scope,
        limit: int,
        *,
        modality: str = "text",
        reread: Connections | None = None,
    ) -> list[ChunkHit] | None:
        """The BM25 top-``limit`` of ``query`` in ``scope`` (scores and ties as the SQL leg's), rows
        read on ``conn``, the candidates' re-read on a connection of ``reread`` when given (a pool
        whose sessions plan it once: :data:`index.search.read_settings.PLANNED_ONCE`); None: this
        engine cannot answer exactly right now, the SQL leg serves."""
        ...
