"""The gateway's subcommands: ``mnemo up`` (the whole stack in the foreground)."""

from __future__ import annotations

import argparse
import asyncio

from schema.cli import add_database_flags, database_settings, wait_for_stop_signal


async def _up(args: argparse.Namespace) -> int:
    from schema.database import open_database

    async with open_database(database_settings(args)) as db:
        where = (
            f"embedded PostgreSQL, data in {db.embedded.data_dir}" if db.embedded else "external PostgreSQL"
        )
        print("Mnemo is up:", flush=True)
        print(f"  database  {db.url}  ({where}, migrations applied)", flush=True)
        print("Ctrl-C stops everything started here.", flush=True)
        await wait_for_stop_signal()
    print("Mnemo stopped.", flush=True)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("up", help="start the database, sidecar and gateway in the foreground")
    add_database_flags(p)
    p.set_defaults(run=lambda a: asyncio.run(_up(a)))
