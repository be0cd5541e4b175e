"""Connecting to the vector store: URL resolution, pools with pgvector codecs, start-up."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import asyncpg
from pgvector.asyncpg import register_vector

from .buffers import warn_if_short
from .embedded import EmbeddedPostgres
from .migrate import MigrationError, migrate
from .settings import DatabaseSettings

# What a server that stops, restarts or cuts a session raises: the connection is gone (OSError,
# class 08, asyncpg's own "connection closed"), the server is shutting down or starting (57P0x), or
# a hot-standby recovery conflict cancelled the statement (40001). Each is worth one re-run elsewhere
# or later (a replica's read goes to the primary; a caller's request is answered 503, retryable).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.SerializationError,
    # a session the server cut while asyncpg was between messages: its protocol state is broken
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def database_unreachable(exc: BaseException) -> bool:
    """``exc`` (or every exception a task group gathered in it) is the database's connection failing.

    Only one of :data:`CONNECTION_ERRORS` raised inside asyncpg counts: an ``OSError`` from a
    missing media file or a ``TimeoutError`` of a sidecar call is not the database's.
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(database_unreachable(e) for e in exc.exceptions)
    return isinstance(exc, CONNECTION_ERRORS) and _raised_in_asyncpg(exc)


def _raised_in_asyncpg(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("asyncpg."):
            return True
        tb = tb.tb_next
    return False


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


class SessionConnection(asyncpg.Connection):
    """A pooled connection that knows the settings its session was opened with.

    They travel in the startup packet (asyncpg's ``server_settings``), so they are the session's
    own defaults: ``RESET ALL`` (asyncpg's reset on release) returns to them. A read that needs
    them can then skip its ``SET LOCAL`` and the transaction that scopes it, one round trip
    instead of three (see :func:`index.search.read_settings.fetch_with_local_settings`).
    """

    session_settings: Mapping[str, str] = MappingProxyType({})


def session_settings(conn: asyncpg.Connection) -> Mapping[str, str]:
    """The settings ``conn``'s session holds from its start: ``create_pool(session=...)``'s, read
    through a pool's connection proxy too; empty for any other connection."""
    held = getattr(conn, "session_settings", None)
    return held if isinstance(held, Mapping) else MappingProxyType({})


class SessionSettingsLost(RuntimeError):
    """A connection's session does not hold the settings its pool opened it with."""


async def verify_session_settings(conn: asyncpg.Connection, session: Mapping[str, str]) -> None:
    """Raise :class:`SessionSettingsLost` unless ``conn``'s session holds ``session``.

    Run once per pooled connection: something between Mnemo and PostgreSQL that drops start-up
    parameters (PgBouncer's ``ignore_startup_parameters``) would otherwise leave every leg on the
    server's defaults without a word.
    """
    if not session:
        return
    names = list(session)
    held = await conn.fetchval(
        "SELECT ARRAY(SELECT current_setting(u.n, true)"
        " FROM unnest($1::text[]) WITH ORDINALITY AS u(n, i) ORDER BY u.i)",
        names,
    )
    lost = {n: v for n, v, h in zip(names, session.values(), held, strict=True) if h != v}
    if lost:
        raise SessionSettingsLost(
            f"the database session does not hold the settings it was opened with ({lost}); "
            "a connection pooler between Mnemo and PostgreSQL must pass start-up parameters through"
        )


async def _init_session_connection(conn: asyncpg.Connection, *, session: Mapping[str, str]) -> None:
    await init_connection(conn)
    await verify_session_settings(conn, session)
    conn.session_settings = session


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release without a reset query (asyncpg has already rolled back any open transaction)."""


async def create_pool(
    database_url: str,
    *,
    max_size: int = 10,
    min_size: int = 1,
    reset_session: bool = True,
    vector_type: str | None = None,
    session: Mapping[str, str] | None = None,
) -> asyncpg.Pool:
    """A pool whose every connection decodes ``vector``/``halfvec``/``sparsevec`` values.

    The ``vector`` extension must exist in the database (run migrations first).

    ``reset_session=False`` drops asyncpg's reset query on release (``pg_advisory_unlock_all``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``): a round trip plus server work on every release,
    0.4-0.8 ms on a 2-core machine, which a search pays once per leg. Only for pools whose users
    leave no session state behind: settings only as ``SET LOCAL`` inside a transaction, no
    advisory locks, ``LISTEN``, cursors outside transactions or temporary objects (the gateway's
    retrieval reads). An open transaction is still rolled back on release.

    ``vector_type`` (``RAG_VECTOR_TYPE``) is the session's ``mnemo.vector_type``: the HNSW element
    type of a partition this pool's writers provision (see migration 0017); None leaves the
    database's own setting (default ``auto``).

    ``session``: settings every connection opens its session with (``{"hnsw.ef_search": "100"}``),
    which its connections then report as their :func:`session_settings`.
    """
    server_settings = dict(session or {})
    if vector_type is not None:
        server_settings["mnemo.vector_type"] = vector_type
    held = MappingProxyType(dict(session or {}))
    pool = await asyncpg.create_pool(
        database_url,
        min_size=min(min_size, max_size),
        max_size=max_size,
        init=functools.partial(_init_session_connection, session=held),
        reset=None if reset_session else _keep_session,
        server_settings=server_settings or None,
        connection_class=SessionConnection,
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
        embedded = EmbeddedPostgres(settings.data_dir / "pg", shared_buffers=settings.embedded_shared_buffers)
        # initdb and pg_ctl take seconds: never on the event loop.
        url = await asyncio.to_thread(embedded.start)
    try:
        # Migrate before the pool: the pool's codecs need the `vector` type the first
        # migration creates (a fresh production database has none).
        applied = await migrate(url) if run_migrations else []
        pool = await create_pool(url, max_size=settings.pool_size, vector_type=settings.vector_type)
        try:
            await warn_if_short(pool)
            yield Database(url=url, pool=pool, embedded=embedded, applied=applied)
        finally:
            await pool.close()
    finally:
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
