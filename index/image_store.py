"""The image side of the embeddings store: ``modality = 'image'`` rows and Mnemo's thumbnails.

An image row lives in its image model's partition under the record's key with
``component_tipo`` = the image component, ``lang`` = ``lg-nolan``, ``view``
(obverse, reverse, or ''), and ``chunk_index`` = the image's index within its
component. ``source_hash`` is the sha256 of the original bytes, ``source_text``
the context summary (title and metadata values: the hybrid leg's text),
``chunk_meta`` the view, thumbnail URL, title and role values.

Writes are multi-row ``unnest`` statements across records (the bulk job writes
a whole batch in one); the caller owns the transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

from .partitions import ModelPartition
from .store import as_vector, rows_of_records

__all__ = [
    "IMAGE_LANG",
    "ImageKey",
    "ImageRow",
    "StoredImage",
    "Thumbnail",
    "delete_stale_images",
    "delete_thumbnails",
    "get_thumbnail",
    "image_vectors",
    "stored_images",
    "upsert_images",
    "upsert_thumbnails",
]

Executor = asyncpg.Connection | asyncpg.Pool
RecordKey = tuple[str, int]
ImageKey = tuple[str, str, int]  # (component_tipo, view, image index) within a record
IMAGE_LANG = "lg-nolan"


@dataclass(frozen=True)
class StoredImage:
    content_hash: str
    summary: str
    lexical_text: str
    projects: tuple[int, ...]
    meta: dict[str, Any]


@dataclass
class ImageRow:
    """One image row to write (``embedding`` a float vector)."""

    section_tipo: str
    section_id: int
    component_tipo: str
    view: str
    image_index: int
    content_hash: str
    summary: str
    lexical_text: str
    embedding: Any
    projects: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> ImageKey:
        return (self.component_tipo, self.view, self.image_index)


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
) -> dict[RecordKey, dict[ImageKey, StoredImage]]:
    """The stored image rows of many records (one query), without vectors."""
    out: dict[RecordKey, dict[ImageKey, StoredImage]] = {key: {} for key in records}
    if not records:
        return out
    columns = """e.section_tipo, e.section_id, e.component_tipo, e.view, e.chunk_index, e.source_hash,
                 e.source_text, e.lexical_text, e.projects, e.chunk_meta"""
    rows = await rows_of_records(db, partition, records, columns, "image")
    for r in rows:
        out[(r["section_tipo"], r["section_id"])][(r["component_tipo"], r["view"], r["chunk_index"])] = (
            StoredImage(
                content_hash=r["source_hash"],
                summary=r["source_text"],
                lexical_text=r["lexical_text"],
                projects=tuple(r["projects"]),
                meta=json.loads(r["chunk_meta"]),
            )
        )
    return out


async def image_vectors(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey], hashes: Iterable[str]
) -> dict[str, np.ndarray]:
    """Stored vectors of these records' images by content hash (an unchanged image is not re-embedded)."""
    wanted = sorted(set(hashes))
    if not wanted or not records:
        return {}
    rows = await db.fetch(
        f"""
        SELECT DISTINCT ON (e.source_hash) e.source_hash, e.embedding
        FROM {partition.table} e
        JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
          ON e.section_tipo = k.section_tipo AND e.section_id = k.section_id
        WHERE e.modality = 'image' AND e.source_hash = ANY($3::text[])
        """,
        [k[0] for k in records],
        [k[1] for k in records],
        wanted,
    )
    return {r["source_hash"]: np.asarray(r["embedding"].to_numpy(), dtype=np.float32) for r in rows}


async def upsert_images(conn: asyncpg.Connection, partition: ModelPartition, rows: Sequence[ImageRow]) -> int:
    """Insert or replace image rows of any number of records in one statement."""
    if not rows:
        return 0
    await conn.execute(
        f"""
        INSERT INTO {partition.table} AS e (
            model, modality, section_tipo, section_id, component_tipo, lang, chunk_index, view,
            source_hash, source_text, lexical_text, embedding, projects, chunk_meta)
        SELECT $1, 'image', t.section_tipo, t.section_id, t.component_tipo, $2, t.image_index, t.view,
               t.content_hash, t.summary, t.lexical_text, t.embedding,
               ARRAY(SELECT jsonb_array_elements_text(t.projects)::int), t.meta
        FROM unnest($3::text[], $4::bigint[], $5::text[], $6::int[], $7::text[], $8::text[],
                    $9::text[], $10::text[], $11::vector[], $12::jsonb[], $13::jsonb[])
             AS t(section_tipo, section_id, component_tipo, image_index, view, content_hash,
                  summary, lexical_text, embedding, projects, meta)
        ON CONFLICT (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
        DO UPDATE SET source_hash = EXCLUDED.source_hash,
                      source_text = EXCLUDED.source_text,
                      lexical_text = EXCLUDED.lexical_text,
                      embedding = EXCLUDED.embedding,
                      projects = EXCLUDED.projects,
                      chunk_meta = EXCLUDED.chunk_meta,
                      updated_at = now()
        """,
        partition.model,
        IMAGE_LANG,
        [r.section_tipo for r in rows],
        [r.section_id for r in rows],
        [r.component_tipo for r in rows],
        [r.image_index for r in rows],
        [r.view for r in rows],
        [r.content_hash for r in rows],
        [r.summary for r in rows],
        [r.lexical_text for r in rows],
        [as_vector(r.embedding) for r in rows],
        [json.dumps(sorted(set(r.projects))) for r in rows],
        [json.dumps(r.meta, ensure_ascii=False) for r in rows],
    )
    return len(rows)


async def delete_stale_images(
    conn: asyncpg.Connection, partition: ModelPartition, record: RecordKey, keep: Iterable[ImageKey]
) -> int:
    """Delete a record's image rows (of this model) that are not in ``keep``."""
    kept = list(keep)
    status = await conn.execute(
        f"""
        DELETE FROM {partition.table} AS e
        WHERE e.section_tipo = $1 AND e.section_id = $2 AND e.modality = 'image'
          AND NOT EXISTS (
              SELECT 1 FROM unnest($3::text[], $4::text[], $5::int[]) AS k(component_tipo, view, idx)
              WHERE k.component_tipo = e.component_tipo AND k.view = e.view AND k.idx = e.chunk_index)
        """,
        record[0],
        record[1],
        [k[0] for k in kept],
        [k[1] for k in kept],
        [k[2] for k in kept],
    )
    return int(status.rsplit(" ", 1)[-1])


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


async def thumbnail_hashes(
    db: Executor, records: Sequence[RecordKey]
) -> dict[tuple[str, int, str, int], str]:
    """Which thumbnails exist for these records: (section, id, component, index) -> content hash."""
    if not records:
        return {}
    rows = await db.fetch(
        """SELECT t.section_tipo, t.section_id, t.component_tipo, t.image_index, t.content_hash
           FROM rag_thumbnails t
           JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
             ON t.section_tipo = k.section_tipo AND t.section_id = k.section_id""",
        [k[0] for k in records],
        [k[1] for k in records],
    )
    return {
        (r["section_tipo"], r["section_id"], r["component_tipo"], r["image_index"]): r["content_hash"]
        for r in rows
    }


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
