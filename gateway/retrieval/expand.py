"""Small-to-big: a retrieved passage widened to its neighbours or its parent section.

The widened chunks come from the store and each passes the ACL gate, exactly
like a search result: a neighbour the caller may not read is left out, never
shown. A chunk already shown by a better-ranked passage is not repeated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.access.acl import chunk_readable
from gateway.access.auth import Principal
from gateway.retrieval.ranking import Ranked
from gateway.retrieval.retriever import Retriever
from index.store.hits import ChunkHit
from index.store.neighbours import document_window, parent_chunks

__all__ = ["Expanded", "expand_passages", "unexpanded"]


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


async def expand_passages(
    retriever: Retriever,
    principal: Principal,
    ranked: Sequence[Ranked],
    mode: str,
    *,
    neighbours: int,
    parent_limit: int,
) -> list[Expanded]:
    """Each passage widened by ``mode`` (``neighbours`` or ``parent``), readable chunks only."""
    model = await retriever.text_model()
    partition = await retriever.partition(model.id)
    if partition is None:
        return unexpanded(ranked)
    shown: set[tuple] = set()
    out = []
    async with retriever.pool.acquire() as conn:
        for r in ranked:
            hit = r.chunk
            if mode == "parent":
                around = await parent_chunks(conn, partition, hit, parent_limit)
            else:
                around = await document_window(conn, partition, hit.key, neighbours, neighbours)
            kept = [
                c for c in around if c.key == hit.key or (c.key not in shown and chunk_readable(principal, c))
            ]
            if hit.key not in {c.key for c in kept}:  # deleted meanwhile: the hit as retrieved
                kept = sorted([*kept, hit], key=lambda c: c.chunk_index)
            shown.update(c.key for c in kept)
            out.append(Expanded(r, tuple(kept), mode))
    return out
