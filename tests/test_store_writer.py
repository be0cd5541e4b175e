"""The one writer of ``rag_embeddings`` rows (:mod:`index.store.store`), text and image, on real PostgreSQL.

Every path that stores vectors writes through ``upsert_rows`` / ``prune_rows`` (``copy_rows`` seeds
partitions in tests and benchmarks), so these properties hold for the drain, the image steps and
the bulk jobs alike: what is written reads back as written, in one statement for any mix of records
and modalities; a prune touches only its own record and modality; a row without a vector is refused
before anything is written; and the writer's column list is every column a writer can set.
"""

from __future__ import annotations

from dataclasses import fields

import asyncpg
import numpy as np
import pytest

from index.store.image_rows import image_row
from index.store.partitions import ModelPartition, ensure_partition
from index.store.store import (
    COLUMNS,
    EmbeddingRow,
    StoredRow,
    copy_rows,
    prune_rows,
    stored_rows,
    stored_vectors,
    to_sparsevec,
    upsert_rows,
)

DIM = 4
A, B = ("oh1", 1), ("oh1", 2)


def _vec(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def _text(record: tuple[str, int], index: int, text: str, **extra: object) -> EmbeddingRow:
    return EmbeddingRow(
        "text", *record, "rag:card", "lg-spa", index, f"h-{record[1]}-{index}-{text}", text, text.lower(),
        _vec(index), projects=(1, 2), chunk_meta={"contributors": ["oh22"], "title": "Ánfora"}, **extra,
    )  # fmt: skip


def _rows() -> list[EmbeddingRow]:
    """Two records, both modalities, one row with sparse weights, a parent key and a token count."""
    coin = image_row(
        A,
        ("rsc29", "obverse", 0),
        content_hash="img-a0",
        title="Coin",
        roles={"material": {"tipo": "rsc30", "kind": "categorical", "value": "silver"}},
        projects=(1,),
        thumb_url=None,
        embedding=_vec(9),
    )
    return [
        _text(A, 0, "Primera", sparse={5: 0.5, 250_001: 1.0}, parent_key="p0", token_count=3),
        _text(A, 1, "Segunda"),
        coin,
        _text(B, 0, "Otra"),
    ]


async def _read(pool: asyncpg.Pool, partition: ModelPartition) -> dict[tuple[object, ...], StoredRow]:
    """Every stored row by (modality, record, slot)."""
    out: dict[tuple[object, ...], StoredRow] = {}
    for modality in ("text", "image"):
        for record, slots in (await stored_rows(pool, partition, [A, B], modality)).items():
            out.update({(modality, record, slot): row for slot, row in slots.items()})
    return out


async def test_the_column_list_is_every_column_a_writer_can_set(db_pool: asyncpg.Pool) -> None:
    # A migration that adds a column fails here until the one writer writes it.
    columns = await db_pool.fetch(
        "SELECT column_name, is_generated FROM information_schema.columns WHERE table_name = 'rag_embeddings'"
    )
    settable = {c["column_name"] for c in columns if c["is_generated"] == "NEVER"}
    assert set(COLUMNS) == settable - {"created_at", "updated_at"}
    assert len(COLUMNS) == len(set(COLUMNS))
    # ... and the row type has exactly a field for each (the model comes from the partition).
    assert {f.name for f in fields(EmbeddingRow)} == set(COLUMNS) - {"model"}


async def test_rows_of_any_records_and_modalities_read_back_as_written(db_pool: asyncpg.Pool) -> None:
    partition = await ensure_partition(db_pool, "writer-test-4", DIM)
    rows = _rows()
    async with db_pool.acquire() as conn, conn.transaction():
        assert await upsert_rows(conn, partition, rows) == len(rows)
    stored = await _read(db_pool, partition)
    assert set(stored) == {(r.modality, r.record, r.slot) for r in rows}
    for row in rows:
        found = stored[(row.modality, row.record, row.slot)]
        assert found.matches(row) and found.token_count == row.token_count
    image = rows[2]
    assert image.slot == ("rsc29", "lg-nolan", "obverse", 0)
    assert (
        image.chunk_meta["thumb_url"] == "/v1/thumbnails/oh1/1/rsc29/0" and image.chunk_meta["own_thumbnail"]
    )

    vectors = await stored_vectors(db_pool, partition, [A], "text", [rows[0].source_hash, "unknown"])
    dense, sparse = vectors[rows[0].source_hash]
    assert list(vectors) == [rows[0].source_hash]
    assert np.allclose(dense.to_numpy(), rows[0].embedding) and sparse == to_sparsevec(rows[0].sparse)
    assert await stored_vectors(db_pool, partition, [A], "text", [image.source_hash]) == {}  # other modality


async def test_a_rewrite_replaces_in_place_and_a_prune_keeps_to_its_record_and_modality(
    db_pool: asyncpg.Pool,
) -> None:
    partition = await ensure_partition(db_pool, "writer-test-4", DIM)
    rows = _rows()
    edited = _text(A, 0, "Primera, corregida")
    async with db_pool.acquire() as conn, conn.transaction():
        await upsert_rows(conn, partition, rows)
        await upsert_rows(conn, partition, [edited])
        # Record A now produces only its first text chunk: the second goes, its image stays, B stays.
        assert await prune_rows(conn, partition, A, "text", [edited.slot]) == 1
    stored = await _read(db_pool, partition)
    assert set(stored) == {("text", A, edited.slot), ("image", A, rows[2].slot), ("text", B, rows[3].slot)}
    first = stored[("text", A, edited.slot)]
    assert first.matches(edited) and not first.matches(rows[0])

    async with db_pool.acquire() as conn, conn.transaction():
        assert await prune_rows(conn, partition, A, "image", []) == 1
    assert ("image", A, rows[2].slot) not in await _read(db_pool, partition)


async def test_a_row_without_a_vector_is_refused_before_anything_is_written(db_pool: asyncpg.Pool) -> None:
    partition = await ensure_partition(db_pool, "writer-test-4", DIM)
    unembedded = _text(B, 1, "Sin vector")
    unembedded.embedding = None
    async with db_pool.acquire() as conn:
        with pytest.raises(ValueError, match=r"text row \('oh1', 2\).*has no vector"):
            await upsert_rows(conn, partition, [_text(B, 0, "Otra"), unembedded])
    assert await _read(db_pool, partition) == {}


async def test_a_bulk_copy_stores_what_the_upsert_stores(db_pool: asyncpg.Pool) -> None:
    upserted = await ensure_partition(db_pool, "writer-test-4", DIM)
    copied = await ensure_partition(db_pool, "writer-copy-4", DIM)
    rows = _rows()
    async with db_pool.acquire() as conn:
        await upsert_rows(conn, upserted, rows)
        assert await copy_rows(conn, copied, rows) == len(rows)
    assert await _read(db_pool, copied) == await _read(db_pool, upserted)
