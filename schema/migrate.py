"""Apply the numbered SQL migrations in ``schema/migrations`` exactly once each.

The runner holds a session advisory lock while it works, so two processes that
start together (a gateway and a drain, two gateways) serialize instead of
racing; the second finds everything applied and does nothing. Each migration
runs in its own transaction together with the row that records it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

log = logging.getLogger(__name__)

# An arbitrary constant shared by every Mnemo process: the migration lock key.
MIGRATION_LOCK_KEY = 0x6D6E656D6F  # "mnemo"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
REQUIRED_EXTENSIONS = ("vector",)


class MigrationError(RuntimeError):
    """The database cannot be brought to the expected schema."""


class MissingExtensionError(MigrationError):
    """The PostgreSQL server does not provide an extension Mnemo needs."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    """The shipped migrations, in version order."""
    found = []
    for entry in resources.files("schema.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions: {versions}")
    return found


async def check_extensions(conn: asyncpg.Connection, required: tuple[str, ...] = REQUIRED_EXTENSIONS) -> None:
    """Fail with a specific message when the server cannot provide a needed extension."""
    rows = await conn.fetch(
        "SELECT name FROM pg_available_extensions WHERE name = ANY($1::text[])", list(required)
    )
    missing = sorted(set(required) - {r["name"] for r in rows})
    if missing:
        server = await conn.fetchval("SELECT version()")
        raise MissingExtensionError(
            f"the PostgreSQL server does not provide the extension(s) {', '.join(missing)} "
            f"({server}). Install pgvector (https://github.com/pgvector/pgvector) on the "
            "server, or unset RAG_DATABASE_URL to use Mnemo's embedded PostgreSQL."
        )


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply every pending migration on ``conn``; return the names applied (empty when up to date)."""
    migrations = load_migrations()
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await check_extensions(conn)
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    integer PRIMARY KEY,
                name       text NOT NULL,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        applied = {
            r["version"]: r for r in await conn.fetch("SELECT version, name, checksum FROM schema_migrations")
        }
        done: list[str] = []
        for migration in migrations:
            previous = applied.get(migration.version)
            if previous is not None:
                if previous["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} was edited after it was applied; "
                        "add a new migration instead of changing an applied one"
                    )
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
            label = f"{migration.version:04d}_{migration.name}"
            log.info("applied migration %s", label)
            done.append(label)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def migrate(database_url: str) -> list[str]:
    """Connect to ``database_url`` and apply pending migrations."""
    conn = await asyncpg.connect(database_url)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()
