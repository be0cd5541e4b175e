"""The embeddings store: the one writer (and reader) of ``rag_embeddings`` rows, text and image.

Every path that stores vectors builds :class:`EmbeddingRow` values and writes
them here: the drain's indexer (text), the drain's image step, the bulk image
job and its Ray variant, and the tests and benchmarks that seed a partition.
So the row's shape, its column list (:data:`COLUMNS`) and the SQL that writes
it exist once; a new column is one entry in ``_COLUMNS`` and one field.

Writes go straight to the model's partition table (no partition routing) and
are multi-row statements over ``unnest`` arrays: one upsert for any number of
rows of any records, and one stale-row delete per record. The caller owns the
transaction, so a record is written whole or not at all.

Sparse weights are stored as pgvector ``sparsevec`` values of dimension
:data:`SPARSE_DIMENSION`. A sparse vector's dimension is the vocabulary size
of the model that produced it, and ``<#>`` only compares vectors of equal
dimension, so queries must build theirs with the same constant. 250002 is the
XLM-RoBERTa vocabulary that bge-m3 (and its tiny test stand-in) use; a token id
at or beyond it is a loud error, never a silent drop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import asyncpg
import numpy as np
from pgvector import SparseVector, Vector

from index.store.executor import Executor
from index.store.partitions import ModelPartition

__all__ = [
    "COLUMNS",
    "SPARSE_DIMENSION",
    "EmbeddingRow",
    "RecordKey",
    "SlotKey",
    "StoredRow",
    "StoredVectors",
    "as_vector",
    "copy_rows",
    "delete_record",
    "prune_rows",
    "read_rows",
    "section_ids",
    "stored_rows",
    "stored_vectors",
    "to_sparsevec",
    "upsert_rows",
]

RecordKey = tuple[str, int]  # (section_tipo, section_id)
SlotKey = tuple[str, str, str, int]  # (component_tipo, lang, view, chunk_index): a row's place in its record
StoredVectors = tuple[Vector, SparseVector | None]

SPARSE_DIMENSION = 250_002
# pgvector's limit on the non-zero entries of one sparsevec.
SPARSE_MAX_NNZ = 16_000


@dataclass
class EmbeddingRow:
    """One row to write, of either modality.

    Text rows: ``component_tipo`` ``rag:<group>`` (or a component), ``lang`` the
    document's language, ``view`` ''. Image rows (:func:`index.store.image_rows.image_row`):
    ``lang`` ``lg-nolan``, ``view`` obverse/reverse/'', ``chunk_index`` the image's
    index, ``source_hash`` the sha256 of the original bytes, ``source_text`` the
    context summary. ``embedding`` is a float vector (None until embedded: writing
    such a row is an error), ``sparse`` token-id weights.
    """

    modality: str  # "text" | "image"
    section_tipo: str
    section_id: int
    component_tipo: str
    lang: str
    chunk_index: int
    source_hash: str
    source_text: str
    lexical_text: str
    embedding: Any  # np.ndarray | pgvector.Vector | None
    view: str = ""
    parent_key: str | None = None
    sparse: Any = None  # dict[int, float] | SparseVector | None
    token_count: int | None = None
    projects: Sequence[int] = ()
    chunk_meta: dict[str, Any] = field(default_factory=dict)

    @property
    def record(self) -> RecordKey:
        return (self.section_tipo, self.section_id)

    @property
    def slot(self) -> SlotKey:
        return (self.component_tipo, self.lang, self.view, self.chunk_index)


# The written columns after ``model``, in the table's order, with the element type each one travels
# as in an ``unnest`` array. ``projects`` travels as int[] literals ('{1,2}'): unnest would flatten a
# two-dimensional int[] into single integers.
_COLUMNS: tuple[tuple[str, str], ...] = (
    ("modality", "text"),
    ("section_tipo", "text"),
    ("section_id", "bigint"),
    ("component_tipo", "text"),
    ("lang", "text"),
    ("chunk_index", "int"),
    ("view", "text"),
    ("parent_key", "text"),
    ("source_hash", "text"),
    ("source_text", "text"),
    ("lexical_text", "text"),
    ("embedding", "vector"),
    ("sparse", "sparsevec"),
    ("token_count", "int"),
    ("projects", "text"),
    ("chunk_meta", "jsonb"),
)
COLUMNS: tuple[str, ...] = ("model", *(name for name, _ in _COLUMNS))
_KEY = ("model", "section_tipo", "section_id", "component_tipo", "lang", "view", "chunk_index")
_PROJECTS = COLUMNS.index("projects")

# Everything after ``INSERT INTO <partition> AS e``: the one statement that writes rows.
_UPSERT = """({columns})
SELECT $1, {selected}
FROM unnest({arrays}) AS t({names})
ON CONFLICT ({key}) DO UPDATE SET {updates}, updated_at = now()
""".format(
    columns=", ".join(COLUMNS),
    selected=", ".join(f"t.{n}::int[]" if n == "projects" else f"t.{n}" for n, _ in _COLUMNS),
    arrays=", ".join(f"${i}::{kind}[]" for i, (_, kind) in enumerate(_COLUMNS, 2)),
    names=", ".join(n for n, _ in _COLUMNS),
    key=", ".join(_KEY),
    # A slot keeps its modality: only what the row says about its content is replaced.
    updates=", ".join(f"{n} = EXCLUDED.{n}" for n in COLUMNS if n not in _KEY and n != "modality"),
)


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


def _projects(projects: Sequence[int]) -> list[int]:
    return [int(p) for p in projects]


def _json(meta: Mapping[str, Any]) -> str:
    return json.dumps(meta, ensure_ascii=False)


# How a field's value becomes what asyncpg takes for its column (the others go as they are).
_TO_DB: dict[str, Callable[[Any], Any]] = {
    "embedding": as_vector,
    "sparse": to_sparsevec,
    "projects": _projects,
    "chunk_meta": _json,
}


def _values(model: str, row: EmbeddingRow) -> tuple[Any, ...]:
    """A row's values in :data:`COLUMNS` order, as asyncpg takes them."""
    if row.embedding is None:
        raise ValueError(
            f"{row.modality} row {row.record} {row.slot} has no vector (hash {row.source_hash[:12]})"
        )
    out: list[Any] = [model]
    for name, _ in _COLUMNS:
        value = getattr(row, name)
        out.append(_TO_DB[name](value) if name in _TO_DB else value)
    return tuple(out)


async def upsert_rows(
    conn: asyncpg.Connection, partition: ModelPartition, rows: Sequence[EmbeddingRow]
) -> int:
    """Insert or replace rows of any records and modalities in one statement; returns the row count."""
    if not rows:
        return 0
    columns = [list(c) for c in zip(*(_values(partition.model, r) for r in rows), strict=True)]
    columns[_PROJECTS] = ["{" + ",".join(map(str, p)) + "}" for p in columns[_PROJECTS]]
    await conn.execute(f"INSERT INTO {partition.table} AS e {_UPSERT}", partition.model, *columns[1:])
    return len(rows)


async def copy_rows(conn: asyncpg.Connection, partition: ModelPartition, rows: Iterable[EmbeddingRow]) -> int:
    """Bulk-load new rows with ``COPY`` (no conflict handling): for seeding a partition fast."""
    records = [_values(partition.model, r) for r in rows]
    await conn.copy_records_to_table(partition.partition, records=records, columns=list(COLUMNS))
    return len(records)


async def prune_rows(
    conn: asyncpg.Connection,
    partition: ModelPartition,
    record: RecordKey,
    modality: str,
    keep: Iterable[SlotKey],
) -> int:
    """Delete the record's ``modality`` rows of this model whose slot is not in ``keep``.

    After a rewrite this removes the stale tail of a shortened document, and the
    groups, languages or images the record no longer has. Returns the count.
    """
    kept = list(keep)
    status = await conn.execute(
        f"""
        DELETE FROM {partition.table} AS e
        WHERE e.section_tipo = $1 AND e.section_id = $2 AND e.modality = $3
          AND NOT EXISTS (
              SELECT 1 FROM unnest($4::text[], $5::text[], $6::text[], $7::int[])
                   AS k(component_tipo, lang, view, chunk_index)
              WHERE k.component_tipo = e.component_tipo AND k.lang = e.lang AND k.view = e.view
                AND k.chunk_index = e.chunk_index)
        """,
        record[0],
        record[1],
        modality,
        *([k[i] for k in kept] for i in range(4)),
    )
    return int(status.rsplit(" ", 1)[-1])


@dataclass(frozen=True)
class StoredRow:
    """What the store holds for one row, without its vectors."""

    component_tipo: str
    lang: str
    view: str
    chunk_index: int
    source_hash: str
    source_text: str
    lexical_text: str
    parent_key: str | None
    token_count: int | None
    projects: tuple[int, ...]
    chunk_meta: dict[str, Any]

    @property
    def slot(self) -> SlotKey:
        return (self.component_tipo, self.lang, self.view, self.chunk_index)

    def matches(self, row: EmbeddingRow) -> bool:
        """Whether writing ``row`` would change nothing a reader sees. The vector is not compared:
        an unchanged source hash means unchanged embedded content. Nor is the token count, which a
        rewrite only refines."""
        return (
            self.source_hash == row.source_hash
            and self.source_text == row.source_text
            and self.lexical_text == row.lexical_text
            and self.parent_key == row.parent_key
            and self.projects == tuple(row.projects)
            and self.chunk_meta == row.chunk_meta
        )


_STORED = tuple(f.name for f in fields(StoredRow))  # the columns a StoredRow is read from

# The rows of many records: ``e`` joined to the (section_tipo, section_id) arrays $1, $2.
_OF_RECORDS = """
FROM {table} e
JOIN unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
  ON e.section_tipo = k.section_tipo AND e.section_id = k.section_id
WHERE e.modality = $3
"""


async def stored_rows(
    db: Executor, partition: ModelPartition, records: Sequence[RecordKey], modality: str
) -> dict[RecordKey, dict[SlotKey, StoredRow]]:
    """The stored ``modality`` rows of many records (one query), keyed by record then slot."""
    out: dict[RecordKey, dict[SlotKey, StoredRow]] = {key: {} for key in records}
    if not records:
        return out
    rows = await db.fetch(
        f"SELECT e.section_tipo, e.section_id, {', '.join('e.' + n for n in _STORED)}"
        + _OF_RECORDS.format(table=partition.table),
        [k[0] for k in records],
        [k[1] for k in records],
        modality,
    )
    for r in rows:
        values = {n: r[n] for n in _STORED}
        values.update(projects=tuple(r["projects"]), chunk_meta=json.loads(r["chunk_meta"]))
        stored = StoredRow(**values)
        out[(r["section_tipo"], r["section_id"])][stored.slot] = stored
    return out


async def stored_vectors(
    db: Executor,
    partition: ModelPartition,
    records: Sequence[RecordKey],
    modality: str,
    hashes: Iterable[str],
) -> dict[str, StoredVectors]:
    """Stored (dense, sparse) vectors of these records' ``modality`` rows by source hash: content
    that only moved or whose metadata changed reuses its vector instead of being embedded again."""
    wanted = sorted(set(hashes))
    if not wanted or not records:
        return {}
    rows = await db.fetch(
        "SELECT DISTINCT ON (e.source_hash) e.source_hash, e.embedding, e.sparse"
        + _OF_RECORDS.format(table=partition.table)
        + " AND e.source_hash = ANY($4::text[])",
        [k[0] for k in records],
        [k[1] for k in records],
        modality,
        wanted,
    )
    return {r["source_hash"]: (as_vector(r["embedding"]), r["sparse"]) for r in rows}


async def read_rows(
    db: Executor, partition: ModelPartition, modality: str, section_tipo: str | None = None
) -> dict[RecordKey, list[EmbeddingRow]]:
    """Whole stored rows, vectors included, as :class:`EmbeddingRow` (what :func:`upsert_rows` and
    :func:`copy_rows` take back), grouped by record in key order: for copying or re-writing a
    partition's rows (benchmarks, backfills), never for a search path."""
    rows = await db.fetch(
        f"SELECT {', '.join(n for n in COLUMNS if n != 'model')} FROM {partition.table} "
        "WHERE modality = $1 AND ($2::text IS NULL OR section_tipo = $2) "
        "ORDER BY section_tipo, section_id, component_tipo, lang, view, chunk_index",
        modality,
        section_tipo,
    )
    out: dict[RecordKey, list[EmbeddingRow]] = {}
    for r in rows:
        values = {n: r[n] for n in COLUMNS if n != "model"}
        values.update(projects=tuple(r["projects"]), chunk_meta=json.loads(r["chunk_meta"]))
        row = EmbeddingRow(**values)
        out.setdefault(row.record, []).append(row)
    return out


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
