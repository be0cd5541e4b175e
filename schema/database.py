"""Connecting to the vector store: URL resolution, pools with pgvector codecs, start-up."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
from pgvector.asyncpg import register_vector

from .embedded import EmbeddedPostgres
from .migrate import MigrationError, migrate
from .settings import DatabaseSettings


async def init_connection(conn: asyncpg.Connection) -> None:
    """Per-connection set-up for every pooled connection: the pgvector codecs.

    The codecs need the ``vector`` type, which the first migration creates: on a database
    that was never migrated, say so instead of asyncpg's "unknown type: public.vector".
    """
    try:
        await register_vector(conn)
    except ValueError as exc:
        if "unknown type" not in str(exc):
            raise
        raise MigrationError(
            "the database has no pgvector types yet (the `vector` extension is not created in it): "
            "run `mnemo migrate` first, or start the gateway, which migrates on start"
        ) from exc


async def create_pool(database_url: str, *, max_size: int = 10, min_size: int = 1) -> asyncpg.Pool:
    """A pool whose every connection decodes ``vector``/``halfvec``/``sparsevec`` values.

    The ``vector`` extension must exist in the database (run migrations first).
    """
    pool = await asyncpg.create_pool(
        database_url, min_size=min(min_size, max_size), max_size=max_size, init=init_connection
    )
    assert pool is not None
    return pool


@dataclass
class Database:
    """A migrated database: its URL, a pool, and the embedded server when Mnemo runs one."""

    url: str
    pool: asyncpg.Pool
    embedded: EmbeddedPostgres | None = None
    applied: list[str] = field(default_factory=list)  # migrations this start applied


@contextlib.asynccontextmanager
async def open_database(
    settings: DatabaseSettings, *, run_migrations: bool = True
) -> AsyncIterator[Database]:
    """Resolve the database (embedded when ``RAG_DATABASE_URL`` is unset), migrate, pool.

    Both paths share everything after URL resolution, so the embedded default
    and a production server behave the same.
    """
    embedded: EmbeddedPostgres | None = None
    if settings.database_url:
        url = settings.database_url
    else:
        embedded = EmbeddedPostgres(settings.data_dir / "pg")
        # initdb and pg_ctl take seconds: never on the event loop.
        url = await asyncio.to_thread(embedded.start)
    try:
        # Migrate before the pool: the pool's codecs need the `vector` type the first
        # migration creates (a fresh production database has none).
        applied = await migrate(url) if run_migrations else []
        pool = await create_pool(url, max_size=settings.pool_size)
        try:
            yield Database(url=url, pool=pool, embedded=embedded, applied=applied)
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
