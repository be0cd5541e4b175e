"""The write side of the embeddings store, used by the indexer and the drain.

Writes go straight to the model's partition table (no partition routing) and
are multi-row statements over ``unnest`` arrays: one upsert and one stale-tail
delete per record, whatever its chunk count. The caller owns the transaction,
so a record is written whole or not at all.

Sparse weights are stored as pgvector ``sparsevec`` values of dimension
:data:`SPARSE_DIMENSION`. A sparse vector's dimension is the vocabulary size
of the model that produced it, and ``<#>`` only compares vectors of equal
dimension, so queries must build theirs with the same constant. 250002 is the
XLM-RoBERTa vocabulary that bge-m3 (and its tiny test stand-in) use; a token id
at or beyond it is a loud error, never a silent drop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np
from pgvector import SparseVector, Vector

from .partitions import ModelPartition

__all__ = [
    "SPARSE_DIMENSION",
    "ChunkRow",
    "StoredChunk",
    "as_vector",
    "delete_record",
    "delete_stale",
    "rows_of_records",
    "section_ids",
    "stored_chunks",
    "stored_vectors",
    "to_sparsevec",
    "upsert_chunks",
]

Executor = asyncpg.Connection | asyncpg.Pool
RecordKey = tuple[str, int]  # (section_tipo, section_id)
ChunkKey = tuple[str, str, int]  # (component_tipo, lang, chunk_index)

SPARSE_DIMENSION = 250_002
# pgvector's limit on the non-zero entries of one sparsevec.
SPARSE_MAX_NNZ = 16_000


@dataclass(frozen=True)
class StoredChunk:
    """What the store holds for one text chunk (without its vectors)."""

    source_hash: str
    source_text: str
    lexical_text: str
    parent_key: str | None
    token_count: int | None
    projects: tuple[int, ...]
    chunk_meta: dict[str, Any]


@dataclass
class ChunkRow:
    """One text row to write. ``embedding`` is a float vector; ``sparse`` token-id weights."""

    component_tipo: str
    lang: str
    chunk_index: int
    parent_key: str | None
    source_hash: str
    source_text: str
    lexical_text: str
    embedding: Any  # np.ndarray | pgvector.Vector
    sparse: Any = None  # dict[int, float] | SparseVector | None
    token_count: int | None = None
    chunk_meta: dict[str, Any] = field(default_factory=dict)


def to_sparsevec(weights: Mapping[int, float] | SparseVector | None) -> SparseVector | None:
    """Token-id weights as a ``sparsevec`` of :data:`SPARSE_DIMENSION` (zeros dropped)."""
    if weights is None or isinstance(weights, SparseVector):
        return weights
    kept = {int(k): float(v) for k, v in weights.items() if float(v) != 0.0}
    bad = [k for k in kept if not 0 <= k < SPARSE_DIMENSION]
    if bad:
        raise ValueError(
            f"sparse token id {bad[0]} is outside the stored sparse dimension {SPARSE_DIMENSION}"
        )
    if len(kept) > SPARSE_MAX_NNZ:  # keep the heaviest weights pgvector can hold
        kept = dict(sorted(kept.items(), key=lambda kv: -kv[1])[:SPARSE_MAX_NNZ])
    return SparseVector(kept, SPARSE_DIMENSION)


def as_vector(value: Any) -> Vector:
    """A pgvector ``Vector`` for a write, from one or from any float sequence."""
    return value if isinstance(value, Vector) else Vector(np.asarray(value, dtype=np.float32))


async def rows_of_records(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey], columns: str, modality: str
) -> list[asyncpg.Record]:
    """``columns`` (alias ``e``) of the ``modality`` rows of many records, in one query."""
    return await db.fetch(
        f"""
        SELECT {columns}
        FROM {partition.table} e
        JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
          ON e.section_tipo = k.section_tipo AND e.section_id = k.section_id
        WHERE e.modality = $3
        """,
        [k[0] for k in records],
        [k[1] for k in records],
        modality,
    )


async def stored_chunks(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey]
) -> dict[RecordKey, dict[ChunkKey, StoredChunk]]:
    """The stored text chunks of many records (one query), keyed by record then chunk."""
    out: dict[RecordKey, dict[ChunkKey, StoredChunk]] = {key: {} for key in records}
    if not records:
        return out
    columns = """e.section_tipo, e.section_id, e.component_tipo, e.lang, e.chunk_index, e.source_hash,
                 e.source_text, e.lexical_text, e.parent_key, e.token_count, e.projects, e.chunk_meta"""
    rows = await rows_of_records(db, partition, records, columns, "text")
    for r in rows:
        out[(r["section_tipo"], r["section_id"])][(r["component_tipo"], r["lang"], r["chunk_index"])] = (
            StoredChunk(
                source_hash=r["source_hash"],
                source_text=r["source_text"],
                lexical_text=r["lexical_text"],
                parent_key=r["parent_key"],
                token_count=r["token_count"],
                projects=tuple(r["projects"]),
                chunk_meta=json.loads(r["chunk_meta"]),
            )
        )
    return out


async def stored_vectors(
    db: Executor, partition: ModelPartition, record: RecordKey, hashes: Sequence[str]
) -> dict[str, tuple[Vector, SparseVector | None]]:
    """Stored vectors of a record's chunks by source hash: a chunk that only moved
    (same text, new position) reuses its vector instead of being embedded again."""
    if not hashes:
        return {}
    rows = await db.fetch(
        f"""
        SELECT DISTINCT ON (source_hash) source_hash, embedding, sparse
        FROM {partition.table}
        WHERE section_tipo = $1 AND section_id = $2 AND modality = 'text'
          AND source_hash = ANY($3::text[])
        """,
        record[0],
        record[1],
        list(hashes),
    )
    return {r["source_hash"]: (as_vector(r["embedding"]), r["sparse"]) for r in rows}


async def upsert_chunks(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    record: RecordKey,
    projects: Sequence[int],
    rows: Sequence[ChunkRow],
) -> int:
    """Insert or replace a record's text rows in one statement; returns the row count."""
    if not rows:
        return 0
    await conn.execute(
        f"""
        INSERT INTO {partition.table} AS e (
            model, modality, section_tipo, section_id, component_tipo, lang, chunk_index, view,
            parent_key, source_hash, source_text, lexical_text, embedding, sparse, token_count,
            projects, chunk_meta)
        SELECT $1, 'text', $2, $3, t.component_tipo, t.lang, t.chunk_index, '',
               t.parent_key, t.source_hash, t.source_text, t.lexical_text, t.embedding, t.sparse,
               t.token_count, $4::int[], t.chunk_meta
        FROM unnest($5::text[], $6::text[], $7::int[], $8::text[], $9::text[], $10::text[],
                    $11::text[], $12::vector[], $13::sparsevec[], $14::int[], $15::jsonb[])
             AS t(component_tipo, lang, chunk_index, parent_key, source_hash, source_text,
                  lexical_text, embedding, sparse, token_count, chunk_meta)
        ON CONFLICT (model, section_tipo, section_id, component_tipo, lang, view, chunk_index)
        DO UPDATE SET parent_key = EXCLUDED.parent_key,
                      source_hash = EXCLUDED.source_hash,
                      source_text = EXCLUDED.source_text,
                      lexical_text = EXCLUDED.lexical_text,
                      embedding = EXCLUDED.embedding,
                      sparse = EXCLUDED.sparse,
                      token_count = EXCLUDED.token_count,
                      projects = EXCLUDED.projects,
                      chunk_meta = EXCLUDED.chunk_meta,
                      updated_at = now()
        """,
        partition.model,
        record[0],
        record[1],
        list(projects),
        [r.component_tipo for r in rows],
        [r.lang for r in rows],
        [r.chunk_index for r in rows],
        [r.parent_key for r in rows],
        [r.source_hash for r in rows],
        [r.source_text for r in rows],
        [r.lexical_text for r in rows],
        [as_vector(r.embedding) for r in rows],
        [to_sparsevec(r.sparse) for r in rows],
        [r.token_count for r in rows],
        [json.dumps(r.chunk_meta, ensure_ascii=False) for r in rows],
    )
    return len(rows)


async def delete_stale(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    record: RecordKey,
    keep: Mapping[tuple[str, str], int],
) -> int:
    """Delete a record's text rows beyond what it now produces, in one statement.

    ``keep`` maps (component_tipo, lang) to that document's chunk count; rows of
    other documents (removed groups or languages) and rows past the count go.
    """
    status = await conn.execute(
        f"""
        DELETE FROM {partition.table} AS e
        WHERE e.section_tipo = $1 AND e.section_id = $2 AND e.modality = 'text'
          AND NOT EXISTS (
              SELECT 1 FROM unnest($3::text[], $4::text[], $5::int[]) AS k(component_tipo, lang, n)
              WHERE k.component_tipo = e.component_tipo AND k.lang = e.lang AND e.chunk_index < k.n)
        """,
        record[0],
        record[1],
        [k[0] for k in keep],
        [k[1] for k in keep],
        list(keep.values()),
    )
    return int(status.rsplit(" ", 1)[-1])


async def delete_record(conn: Executor, record: RecordKey) -> int:
    """Delete every row of a record, in every model's partition and modality."""
    status = await conn.execute(
        "DELETE FROM rag_embeddings WHERE section_tipo = $1 AND section_id = $2", record[0], record[1]
    )
    return int(status.rsplit(" ", 1)[-1])


async def section_ids(db: Executor, section_tipo: str) -> set[int]:
    """Distinct record ids the store holds for a section (any model, any modality)."""
    rows = await db.fetch(
        "SELECT DISTINCT section_id FROM rag_embeddings WHERE section_tipo = $1", section_tipo
    )
    return {r["section_id"] for r in rows}
