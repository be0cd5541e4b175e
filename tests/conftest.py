"""Session-wide real services: one embedded PostgreSQL per test session.

Each test that needs a database gets its own, cloned from a migrated template
(``CREATE DATABASE ... TEMPLATE``), so no test depends on another's rows and
migrations run once.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from schema import EmbeddedPostgres, create_pool, migrate

pytest_plugins = [
    "tests.fixtures.sidecar",
    "tests.fixtures.gateway",
    "tests.fixtures.browser",
    "tests.scheduling",
]

# pyproject's per-test bound (300 s) is a hang guard sized for ordinary tests. A test marked
# ``slow`` runs whole benchmark suites, clusters or model stacks: on a loaded 2-core machine one such
# body took over 300 s (every bench suite in small, load average about 50), which failed a good
# run. Their guard is longer; a test's own ``timeout`` mark still wins.
SLOW_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))


TEMPLATE_DB = "mnemo_template"
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def outside_basetemp() -> Iterator[Path]:
    """A fresh folder outside pytest's basetemp, removed afterwards, for an embedded PostgreSQL's data.

    The server runs as another user (``pgserver``), who must traverse every parent folder. A pytest
    session starting on the same machine sets its basetemp root (``/tmp/pytest-of-<user>``) back to
    mode 0700, which cuts a server under it off from its own files mid-run; it also prunes old
    basetemp folders."""
    root = Path(tempfile.mkdtemp(prefix="mnemo-test-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    # Not under pytest's basetemp (see outside_basetemp).
    root = Path(tempfile.mkdtemp(prefix="mnemo-test-pg-"))
    server = EmbeddedPostgres(root / "data")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_db(pg_server: EmbeddedPostgres) -> str:
    conn = await asyncpg.connect(pg_server.url)
    try:
        await conn.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    finally:
        await conn.close()
    await migrate(pg_server.url_for(TEMPLATE_DB))
    return TEMPLATE_DB


async def _create_database(server: EmbeddedPostgres, template: str) -> str:
    name = f"t_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    finally:
        await conn.close()
    return name


async def _drop_database(server: EmbeddedPostgres, name: str) -> None:
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await conn.close()


@pytest.fixture
async def database_url(pg_server: EmbeddedPostgres, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test alone."""
    name = await _create_database(pg_server, template_db)
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_database(pg_server, name)


@pytest.fixture
async def empty_database_url(pg_server: EmbeddedPostgres) -> AsyncIterator[str]:
    """A fresh database with no migrations applied."""
    name = await _create_database(pg_server, "template0")
    try:
        yield pg_server.url_for(name)
    finally:
        await _drop_database(pg_server, name)


@pytest.fixture
async def db_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()
