"""Whether the server's ``shared_buffers`` holds its HNSW indexes, said once at start.

A dense search walks its partition's HNSW index; a page outside ``shared_buffers`` is copied in
from the kernel's page cache (or read from disk) at each visit, the largest share of the dense
statement's CPU on a server left at PostgreSQL's 128 MB (``schema.embedded_config``). The embedded
server is sized for its host; a server of the operator's is not Mnemo's to change, so a gateway or
drain that opens it says what is short and what to set.
"""

from __future__ import annotations

import logging

import asyncpg

__all__ = ["BufferShortfall", "buffer_shortfall", "warn_if_short"]

log = logging.getLogger(__name__)

_SIZES = """
    SELECT (SELECT setting::bigint * current_setting('block_size')::bigint
              FROM pg_settings WHERE name = 'shared_buffers') AS buffers,
           (SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::bigint
              FROM pg_class c JOIN pg_am a ON a.oid = c.relam
             WHERE a.amname = 'hnsw' AND c.relkind = 'i') AS hnsw"""


class BufferShortfall(tuple[int, int]):
    """``(shared_buffers, HNSW indexes)`` in bytes, the indexes the larger."""

    def __str__(self) -> str:
        buffers, hnsw = self
        return (
            f"shared_buffers ({buffers >> 20} MiB) is smaller than this database's HNSW indexes "
            f"({hnsw >> 20} MiB): dense searches copy index pages in at each visit (CPU per search "
            "rises with the shortfall); set RAG_EMBEDDED_SHARED_BUFFERS for the embedded server, or "
            "the server's shared_buffers (docs/deploy.md, 'The database server's memory')"
        )


async def buffer_shortfall(conn: asyncpg.Connection) -> BufferShortfall | None:
    """The shortfall when the database's HNSW indexes are larger than ``shared_buffers``, else None."""
    row = await conn.fetchrow(_SIZES)
    buffers, hnsw = int(row["buffers"]), int(row["hnsw"])
    return BufferShortfall((buffers, hnsw)) if hnsw > buffers else None


async def warn_if_short(pool: asyncpg.Pool) -> BufferShortfall | None:
    """Log :func:`buffer_shortfall` as a warning (once: the caller runs it at start); the shortfall."""
    async with pool.acquire() as conn:
        shortfall = await buffer_shortfall(conn)
    if shortfall is not None:
        log.warning("%s", shortfall)
    return shortfall
