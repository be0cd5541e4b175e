"""A stored chunk's surroundings: its neighbours in the same document and its parent section.

Small-to-big retrieval and ``read_chunk`` read around a hit: the chunks of the
same document (record, component, language) with nearby ``chunk_index``, or
those sharing its ``parent_key`` (a heading section, a transcription's media).
These return rows as they are stored; the gateway's ACL gate checks each one.
"""

from __future__ import annotations

from index.store.executor import Executor
from index.store.hits import _COLUMNS, _IDENTITY_ORDER, ChunkHit, ChunkKey, _chunk
from index.store.partitions import ModelPartition

__all__ = ["document_window", "parent_chunks"]


async def document_window(
    db: Executor, partition: ModelPartition, key: ChunkKey, before: int, after: int
) -> list[ChunkHit]:
    """The chunks of ``key``'s document from ``chunk_index - before`` to ``chunk_index + after``, in order.

    Empty when the chunk itself is not stored (its neighbours alone are never returned).
    """
    section_tipo, section_id, component_tipo, lang, index = key
    rows = await db.fetch(
        f"""SELECT {_COLUMNS} FROM {partition.table} e
            WHERE e.modality = 'text' AND e.section_tipo = $1 AND e.section_id = $2
              AND e.component_tipo = $3 AND e.lang = $4 AND e.chunk_index BETWEEN $5 AND $6
              AND EXISTS (SELECT 1 FROM {partition.table} s
                          WHERE s.modality = 'text' AND s.section_tipo = $1 AND s.section_id = $2
                            AND s.component_tipo = $3 AND s.lang = $4 AND s.chunk_index = $7)
            ORDER BY e.chunk_index""",
        section_tipo,
        section_id,
        component_tipo,
        lang,
        index - max(0, before),
        index + max(0, after),
        index,
    )
    return [_chunk(r, 0.0) for r in rows]


async def parent_chunks(
    db: Executor, partition: ModelPartition, chunk: ChunkHit, limit: int
) -> list[ChunkHit]:
    """The chunks sharing ``chunk``'s parent section in its document, the ``limit`` nearest, in order.

    A chunk without a parent key is its own parent.
    """
    if not chunk.parent_key:
        return [chunk]
    rows = await db.fetch(
        f"""SELECT * FROM (
                SELECT {_COLUMNS} FROM {partition.table} e
                WHERE e.modality = 'text' AND e.section_tipo = $1 AND e.section_id = $2
                  AND e.component_tipo = $3 AND e.lang = $4 AND e.parent_key = $5
                ORDER BY abs(e.chunk_index - $6), e.chunk_index
                LIMIT {int(limit)}) near
            ORDER BY {_IDENTITY_ORDER}""",
        chunk.section_tipo,
        chunk.section_id,
        chunk.component_tipo,
        chunk.lang,
        chunk.parent_key,
        chunk.chunk_index,
    )
    return [_chunk(r, 0.0) for r in rows]
