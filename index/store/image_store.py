"""The image side of the store: reading image rows by image key, and Mnemo's thumbnails.

Image rows are written by :mod:`index.store.store` like every row (built by
:func:`index.store.image_rows.image_row`); this module reads them back keyed the way
the image paths address an image, ``(component_tipo, view, index)``, and owns
the ``rag_thumbnails`` table: the thumbnails Mnemo made, written in the same
transaction as their rows and served by the gateway behind the row's ACL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from index.store import store
from index.store.executor import Executor
from index.store.image_rows import IMAGE_LANG, ImageKey
from index.store.partitions import ModelPartition
from index.store.store import RecordKey, StoredRow

__all__ = [
    "Thumbnail",
    "delete_thumbnails",
    "get_thumbnail",
    "image_projects",
    "image_vectors",
    "stored_images",
    "upsert_thumbnails",
]


@dataclass(frozen=True)
class Thumbnail:
    section_tipo: str
    section_id: int
    component_tipo: str
    image_index: int
    content_hash: str
    data: bytes


async def stored_images(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey]
) -> dict[RecordKey, dict[ImageKey, StoredRow]]:
    """The stored image rows of many records (one query), without vectors, by image key."""
    stored = await store.stored_rows(db, partition, records, "image")
    return {
        record: {(s.component_tipo, s.view, s.chunk_index): s for s in slots.values()}
        for record, slots in stored.items()
    }


async def image_vectors(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey], hashes: Iterable[str]
) -> dict[str, np.ndarray]:
    """Stored vectors of these records' images by content hash (an unchanged image is not re-embedded)."""
    found = await store.stored_vectors(db, partition, records, "image", hashes)
    return {h: np.asarray(dense.to_numpy(), dtype=np.float32) for h, (dense, _) in found.items()}


async def image_projects(
    db: Executor, section_tipo: str, section_id: int, component_tipo: str, image_index: int
) -> tuple[int, ...] | None:
    """The projects of an image's row in any image model's partition (each holds the same ones),
    or None when no model stores that image: what a thumbnail's ACL decides on."""
    row = await db.fetchrow(
        """SELECT projects FROM rag_embeddings
           WHERE modality = 'image' AND section_tipo = $1 AND section_id = $2
             AND component_tipo = $3 AND lang = $4 AND chunk_index = $5
           LIMIT 1""",
        section_tipo,
        section_id,
        component_tipo,
        IMAGE_LANG,
        image_index,
    )
    return None if row is None else tuple(row["projects"])


async def upsert_thumbnails(conn: Executor, thumbs: Sequence[Thumbnail]) -> int:
    if not thumbs:
        return 0
    await conn.execute(
        """
        INSERT INTO rag_thumbnails (section_tipo, section_id, component_tipo, image_index, content_hash, data)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], $6::bytea[])
        ON CONFLICT (section_tipo, section_id, component_tipo, image_index)
        DO UPDATE SET content_hash = EXCLUDED.content_hash, data = EXCLUDED.data, created_at = now()
        """,
        [t.section_tipo for t in thumbs],
        [t.section_id for t in thumbs],
        [t.component_tipo for t in thumbs],
        [t.image_index for t in thumbs],
        [t.content_hash for t in thumbs],
        [t.data for t in thumbs],
    )
    return len(thumbs)


async def delete_thumbnails(
    conn: Executor, record: RecordKey, keep: Mapping[tuple[str, int], str] | None = None
) -> int:
    """Delete a record's thumbnails, except those in ``keep`` ((component, index) -> content hash)."""
    kept = dict(keep or {})
    status = await conn.execute(
        """
        DELETE FROM rag_thumbnails AS t
        WHERE t.section_tipo = $1 AND t.section_id = $2
          AND NOT EXISTS (
              SELECT 1 FROM unnest($3::text[], $4::int[], $5::text[]) AS k(component_tipo, idx, h)
              WHERE k.component_tipo = t.component_tipo AND k.idx = t.image_index
                AND k.h = t.content_hash)
        """,
        record[0],
        record[1],
        [k[0] for k in kept],
        [k[1] for k in kept],
        list(kept.values()),
    )
    return int(status.rsplit(" ", 1)[-1])


async def get_thumbnail(
    db: Executor, section_tipo: str, section_id: int, component_tipo: str, image_index: int
) -> tuple[bytes, str] | None:
    """(bytes, mime) of a stored thumbnail, or None."""
    row = await db.fetchrow(
        """SELECT data, mime FROM rag_thumbnails
           WHERE section_tipo = $1 AND section_id = $2 AND component_tipo = $3 AND image_index = $4""",
        section_tipo,
        section_id,
        component_tipo,
        image_index,
    )
    return None if row is None else (bytes(row["data"]), row["mime"])
