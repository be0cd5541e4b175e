"""Migrations, the embeddings store's per-model provisioning, and the HNSW index, on real PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import numpy as np
import pytest
from pgvector import Vector

from schema import MigrationError, MissingExtensionError, apply_migrations, create_pool, migrate
from schema.migrate import check_extensions, load_migrations

CATALOG_SNAPSHOT = """
SELECT 'col' AS kind, table_name || '.' || column_name || ':' || data_type AS item
  FROM information_schema.columns WHERE table_schema = 'public'
UNION ALL
SELECT 'idx', indexname || ':' || indexdef FROM pg_indexes WHERE schemaname = 'public'
UNION ALL
SELECT 'fn', p.proname || ':' || md5(p.prosrc) FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' AND p.proname LIKE 'rag_%'
UNION ALL
SELECT 'ext', extname FROM pg_extension
ORDER BY 1, 2
"""


async def _snapshot(url: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(CATALOG_SNAPSHOT)]
    finally:
        await conn.close()


async def test_migrate_twice_changes_nothing_the_second_time(empty_database_url: str) -> None:
    first = await migrate(empty_database_url)
    assert first[:4] == ["0001_extensions", "0002_embeddings", "0003_queue", "0004_sections"]
    assert first == [f"{m.version:04d}_{m.name}" for m in load_migrations()] and "0012_bm25_length" in first
    before = await _snapshot(empty_database_url)
    assert await migrate(empty_database_url) == []
    assert await _snapshot(empty_database_url) == before
    assert ("ext", "vector") in before


async def test_concurrent_migrations_do_not_race(empty_database_url: str) -> None:
    results = await asyncio.gather(*(migrate(empty_database_url) for _ in range(3)))
    applied = [r for r in results if r]
    assert len(applied) == 1, "exactly one runner applies; the others find it done"
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(load_migrations())
    finally:
        await conn.close()


async def test_an_edited_applied_migration_is_refused(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 3")
        with pytest.raises(MigrationError, match="0003_queue was edited"):
            await apply_migrations(conn)
    finally:
        await conn.close()


async def test_a_server_without_the_extension_is_a_clear_error(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(MissingExtensionError, match=r"not_a_real_ext.*Install pgvector"):
            await check_extensions(conn, ("vector", "not_a_real_ext"))
    finally:
        await conn.close()


def _unit(dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


async def _insert(conn: asyncpg.Connection, model: str, section_id: int, vec: np.ndarray) -> None:
    await conn.execute(
        """INSERT INTO rag_embeddings (model, modality, section_tipo, section_id, component_tipo,
                                       source_hash, source_text, lexical_text, embedding)
           VALUES ($1, 'text', 'oh1', $2, 'rag:card', 'h', 'texto', 'texto', $3)""",
        model,
        section_id,
        Vector(vec),
    )


async def test_models_of_different_dimensions_coexist_and_use_hnsw(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        models = {"mini-384": 384, "bge-1024": 1024, "wide-2048": 2048}
        partitions = {
            m: await conn.fetchval("SELECT rag_provision_model($1, $2)", m, d) for m, d in models.items()
        }
        assert len(set(partitions.values())) == 3
        # provisioning again is a no-op returning the same partition
        assert await conn.fetchval("SELECT rag_provision_model('mini-384', 384)") == partitions["mini-384"]
        types = dict(await conn.fetch("SELECT model, vector_type FROM rag_models"))
        assert types == {"mini-384": "vector", "bge-1024": "vector", "wide-2048": "halfvec"}

        for model, dim in models.items():
            for i in range(20):
                await _insert(conn, model, i, _unit(dim, i))

        for model, dim in models.items():
            vtype = types[model]
            query = _unit(dim, 7)
            rows = await conn.fetch(
                f"""SELECT section_id, embedding FROM {partitions[model]}
                    ORDER BY embedding::{vtype}({dim}) <=> $1::{vtype}({dim}) LIMIT 3""",
                query,
            )
            assert rows[0]["section_id"] == 7
            assert np.allclose(rows[0]["embedding"].to_numpy(), query, atol=1e-3)

            # The planner answers a cosine top-k over the model's partition from its HNSW index.
            async with conn.transaction():
                await conn.execute("SET LOCAL enable_seqscan = off")
                plan = "\n".join(
                    r[0]
                    for r in await conn.fetch(
                        f"""EXPLAIN SELECT section_id FROM {partitions[model]}
                            ORDER BY embedding::{vtype}({dim}) <=> '{Vector(query).to_text()}'::{vtype}({dim})
                            LIMIT 5"""
                    )
                )
            assert f"{partitions[model]}_hnsw" in plan, plan


async def test_dimension_is_enforced_per_model(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        await conn.fetchval("SELECT rag_provision_model('m384', 384)")
        with pytest.raises(asyncpg.RaiseError, match="provisioned with dimension 384, not 512"):
            await conn.fetchval("SELECT rag_provision_model('m384', 512)")
        with pytest.raises(asyncpg.CheckViolationError):
            await _insert(conn, "m384", 1, _unit(512, 1))
        with pytest.raises(asyncpg.RaiseError, match=r"outside 1\.\.4000"):
            await conn.fetchval("SELECT rag_provision_model('huge', 5000)")
        # A row for a model with no partition has nowhere to go.
        with pytest.raises(asyncpg.CheckViolationError):
            await _insert(conn, "never-provisioned", 1, _unit(8, 1))


async def test_natural_key_is_unique_and_lexical_column_indexes(db_pool: asyncpg.Pool) -> None:
    async with db_pool.acquire() as conn:
        await conn.fetchval("SELECT rag_provision_model('m8', 8)")
        await _insert(conn, "m8", 1, _unit(8, 1))
        with pytest.raises(asyncpg.UniqueViolationError):
            await _insert(conn, "m8", 1, _unit(8, 2))
        hit = await conn.fetchval(
            "SELECT section_id FROM rag_embeddings WHERE lexical @@ plainto_tsquery('simple', 'texto')"
        )
        assert hit == 1


async def test_pool_connections_decode_vectors(database_url: str) -> None:
    pool = await create_pool(database_url, max_size=2)
    try:
        async with pool.acquire() as a, pool.acquire() as b:
            for conn in (a, b):
                value = await conn.fetchval("SELECT '[1,2,3]'::vector")
                assert value.to_list() == [1.0, 2.0, 3.0]
    finally:
        await pool.close()


async def test_vector_type_setting_picks_a_new_partitions_index_type(empty_database_url: str) -> None:
    """RAG_VECTOR_TYPE through the production path (open_database on an empty database): a new
    partition gets a halfvec HNSW index that dense queries use; an existing one keeps its type."""
    from index.store.partitions import ensure_partition
    from schema import DatabaseSettings, open_database

    async with open_database(DatabaseSettings(database_url=empty_database_url)) as auto:
        kept = await ensure_partition(auto.pool, "kept-384", 384)
    assert kept.vector_type == "vector"

    settings = DatabaseSettings(database_url=empty_database_url, vector_type="halfvec")
    async with open_database(settings) as db:
        half = await ensure_partition(db.pool, "half-384", 384)
        assert (half.vector_type, half.cast) == ("halfvec", "halfvec(384)")
        assert (await ensure_partition(db.pool, "kept-384", 384)).vector_type == "vector"
        async with db.pool.acquire() as conn:
            for i in range(20):
                await _insert(conn, "half-384", i, _unit(384, i))
            query = _unit(384, 7)
            async with conn.transaction():
                await conn.execute("SET LOCAL enable_seqscan = off")
                sql = f"SELECT section_id FROM {half.table} ORDER BY embedding::{half.cast} <=> $1::{half.cast} LIMIT 3"
                assert (await conn.fetch(sql, query))[0]["section_id"] == 7
                plan = "\n".join(
                    r[0]
                    for r in await conn.fetch("EXPLAIN " + sql.replace("$1", f"'{Vector(query).to_text()}'"))
                )
            assert f"{half.partition}_hnsw" in plan, plan


async def test_vector_type_refuses_what_pgvector_cannot_index(empty_database_url: str) -> None:
    from schema import DatabaseSettings, SettingsError, open_database

    with pytest.raises(SettingsError, match="RAG_VECTOR_TYPE must be one of auto, vector, halfvec"):
        DatabaseSettings(vector_type="float8").validate()
    async with open_database(DatabaseSettings(database_url=empty_database_url, vector_type="vector")) as db:
        with pytest.raises(asyncpg.RaiseError, match="at most 2000; use halfvec or auto"):
            await db.pool.fetchval("SELECT rag_provision_model('wide-2048', 2048)")
        async with db.pool.acquire() as conn:  # a value set by hand on the database is checked too
            await conn.execute("SET mnemo.vector_type = 'float8'")
            with pytest.raises(asyncpg.RaiseError, match="is float8, not one of auto, vector, halfvec"):
                await conn.fetchval("SELECT rag_provision_model('m8', 8)")
            await conn.execute("RESET mnemo.vector_type")


async def _toast_bytes(conn: asyncpg.Connection, table: str) -> int:
    return await conn.fetchval(
        "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = $1::regclass", table
    )


async def _layout(conn: asyncpg.Connection, table: str) -> tuple[str, list[str]]:
    """(the embedding column's storage, the table's storage parameters)."""
    storage = await conn.fetchval(
        "SELECT attstorage FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'embedding'", table
    )
    options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE oid = $1::regclass", table)
    return (storage.decode() if isinstance(storage, bytes) else storage), list(options or [])


async def test_a_rows_vector_and_text_stay_in_its_heap_tuple(empty_database_url: str) -> None:
    """0018's row layout, on a database created empty through the production path: a 1024-dimension
    vector beside 2 KB of text is stored inline (pgvector's default would move the vector to the
    TOAST table, which the exact dense path then reads row by row); a row too large for a page is
    still stored, out of line; a backfill's shadow is laid out like its partition; and a partition
    that existed before 0018 is given its layout by the migration."""
    from index.bulk.shadow import create_shadow, drop_shadow
    from index.store.partitions import ensure_partition
    from schema import DatabaseSettings, open_database

    text = " ".join(f"palabra{i}" for i in range(220))  # about 2 KB
    async with open_database(DatabaseSettings(database_url=empty_database_url)) as db:
        wide = await ensure_partition(db.pool, "bge-1024", 1024)
        async with db.pool.acquire() as conn:
            assert await _layout(conn, wide.table) == ("m", ["toast_tuple_target=8160"])
            for i in range(20):
                await conn.execute(
                    """INSERT INTO rag_embeddings (model, modality, section_tipo, section_id, component_tipo,
                                                   source_hash, source_text, lexical_text, embedding)
                       VALUES ('bge-1024', 'text', 'oh1', $1, 'rag:card', 'h', $2, $2, $3)""",
                    i,
                    text,
                    Vector(_unit(1024, i)),
                )
            assert await _toast_bytes(conn, wide.table) == 0
            huge = " ".join(f"palabra{i}" for i in range(2000))  # about 20 KB: cannot fit a page
            await conn.execute(
                """INSERT INTO rag_embeddings (model, modality, section_tipo, section_id, component_tipo,
                                               source_hash, source_text, lexical_text, embedding)
                   VALUES ('bge-1024', 'text', 'oh1', 999, 'rag:card', 'h', $1, $1, $2)""",
                huge,
                Vector(_unit(1024, 999)),
            )
            assert await _toast_bytes(conn, wide.table) > 0
            stored = await conn.fetchrow(
                f"SELECT source_text, embedding <=> $1 AS distance FROM {wide.table} WHERE section_id = 999",
                Vector(_unit(1024, 999)),
            )
            assert stored["source_text"] == huge
            assert stored["distance"] < 1e-6

            shadow = await create_shadow(conn, wide)
            assert await _layout(conn, shadow.table) == ("m", ["toast_tuple_target=8160"])
            await drop_shadow(conn, wide)

            # A partition from before 0018: the migration gives it the target (its column's storage
            # follows the parent's ALTER).
            await conn.execute(f"ALTER TABLE {wide.table} RESET (toast_tuple_target)")
            await conn.execute("ALTER TABLE rag_embeddings ALTER COLUMN embedding SET STORAGE EXTERNAL")
            assert await _layout(conn, wide.table) == ("e", [])
            await conn.execute("DELETE FROM schema_migrations WHERE version = 18")
            assert await apply_migrations(conn) == ["0018_row_layout"]
            assert await _layout(conn, wide.table) == ("m", ["toast_tuple_target=8160"])
