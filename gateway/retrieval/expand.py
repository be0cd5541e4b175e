"""Small-to-big: a retrieved passage widened to its neighbours or its parent section.

The widened chunks come from the store and each passes the ACL gate, exactly
like a search result: a neighbour the caller may not read is left out, never
shown. A chunk already shown by a better-ranked passage is not repeated.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg

from gateway.access.acl import chunk_readable
from gateway.access.auth import Principal
from gateway.retrieval.ranking import Ranked
from index.store.hits import ChunkHit, ChunkKey
from index.store.neighbours import document_window, parent_chunks
from index.store.partitions import ModelPartition, Partitions
from inference.client import ModelInfo

__all__ = ["ChunkWindows", "Expanded", "unexpanded"]


@dataclass(frozen=True)
class Expanded:
    """A ranked passage and the readable chunks around it (the hit included), in document order."""

    ranked: Ranked
    chunks: tuple[ChunkHit, ...]
    mode: str | None = None

    @property
    def text(self) -> str:
        return "\n".join(c.text for c in self.chunks)

    @property
    def chunk_indexes(self) -> list[int]:
        return [c.chunk_index for c in self.chunks]


def unexpanded(ranked: Sequence[Ranked]) -> list[Expanded]:
    return [Expanded(r, (r.chunk,)) for r in ranked]


class ChunkWindows:
    """Readable chunks around stored chunks, read from the text model's partition: a document's
    window around one chunk (``read_chunk``), or small-to-big expansion of ranked passages."""

    def __init__(
        self, pool: asyncpg.Pool, partitions: Partitions, text_model: Callable[[], Awaitable[ModelInfo]]
    ) -> None:
        self.pool = pool
        self.partitions = partitions
        self.text_model = text_model

    async def _partition(self) -> ModelPartition | None:
        return await self.partitions.of((await self.text_model()).id)

    async def around(self, principal: Principal, key: ChunkKey, before: int, after: int) -> list[ChunkHit]:
        """The readable chunks of ``key``'s document from ``before`` chunks before it to ``after``
        after it, itself included when it exists and the caller may read it."""
        partition = await self._partition()
        if partition is None:
            return []
        window = await document_window(self.pool, partition, key, before, after)
        return [c for c in window if chunk_readable(principal, c)]

    async def expand(
        self,
        principal: Principal,
        ranked: Sequence[Ranked],
        mode: str,
        *,
        neighbours: int,
        parent_limit: int,
    ) -> list[Expanded]:
        """Each passage widened by ``mode`` (``neighbours`` or ``parent``), readable chunks only."""
        partition = await self._partition()
        if partition is None:
            return unexpanded(ranked)
        shown: set[tuple] = set()
        out = []
        async with self.pool.acquire() as conn:
            for r in ranked:
                hit = r.chunk
                if mode == "parent":
                    around = await parent_chunks(conn, partition, hit, parent_limit)
                else:
                    around = await document_window(conn, partition, hit.key, neighbours, neighbours)
                kept = [
                    c
                    for c in around
                    if c.key == hit.key or (c.key not in shown and chunk_readable(principal, c))
                ]
                if hit.key not in {c.key for c in kept}:  # deleted meanwhile: the hit as retrieved
                    kept = sorted([*kept, hit], key=lambda c: c.chunk_index)
                shown.update(c.key for c in kept)
                out.append(Expanded(r, tuple(kept), mode))
        return out
