"""``mnemo migrate`` and ``mnemo db``: the schema package's commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

from .settings import DatabaseSettings, load_settings


def add_database_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared by every command that touches the database (they override RAG_* variables)."""
    parser.add_argument("--database-url", default=None, help="PostgreSQL URL (env RAG_DATABASE_URL)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="embedded state directory (env RAG_DATA_DIR)"
    )


def database_settings(args: argparse.Namespace) -> DatabaseSettings:
    return load_settings(DatabaseSettings, database_url=args.database_url, data_dir=args.data_dir)


async def _migrate(args: argparse.Namespace) -> int:
    from .database import open_database

    async with open_database(database_settings(args)) as db:
        applied = db.applied
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return 0


@contextlib.contextmanager
def stop_signal() -> Iterator[asyncio.Event]:
    """An event set by SIGINT or SIGTERM, with the handlers installed before the caller says
    it is ready: a signal sent right after a readiness line must stop, not kill, the command."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _db(args: argparse.Namespace) -> int:
    from .database import open_database

    async with open_database(database_settings(args)) as db:
        with stop_signal() as stop:
            where = f"embedded, data in {db.embedded.data_dir}" if db.embedded else "external server"
            print(f"database: {db.url} ({where}); migrations applied. Ctrl-C stops it.", flush=True)
            await stop.wait()
    print("database stopped", flush=True)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("migrate", help="apply pending schema migrations (idempotent)")
    add_database_flags(p)
    p.set_defaults(run=lambda a: asyncio.run(_migrate(a)))

    p = subparsers.add_parser("db", help="run the database alone in the foreground (migrated)")
    add_database_flags(p)
    p.set_defaults(run=lambda a: asyncio.run(_db(a)))
