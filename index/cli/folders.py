"""What ``mnemo lexical`` and ``mnemo vectors`` share: each keeps one swapped folder per partition
(:mod:`index.follow.swap_folders`) written by one follower, and reports them the same way."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from schema.cli import add_database_flags, database_settings, stop_signal

__all__ = ["add_folder_commands", "database", "follow", "partitions", "print_status"]


@contextlib.asynccontextmanager
async def database(args: argparse.Namespace) -> AsyncIterator[tuple[Any, str]]:
    """The command's pool and database URL (the follower's change listener connects by URL)."""
    from schema.database import open_database

    async with open_database(database_settings(args)) as db:
        yield db.pool, db.url


async def follow(
    args: argparse.Namespace, what: str, root: Path, writer_of: Callable[[Any, str], Any]
) -> int:
    """Run the folder's one writer (``writer_of(pool, url)``, a started and stopped follower) until
    SIGINT/SIGTERM; 1 when another writer holds the folder's lock."""
    from index.follow.swap_folders import WriterLocked

    async with database(args) as (pool, url):
        writer = writer_of(pool, url)
        with stop_signal() as stop:
            try:
                await writer.start()
            except WriterLocked as exc:
                print(f"mnemo {what} follow: {exc}", file=sys.stderr)
                return 1
            print(f"{what} writer: following the change feed into {root}; Ctrl-C stops it", flush=True)
            try:
                await stop.wait()
            finally:
                await writer.stop()
    print(f"{what} writer stopped", flush=True)
    return 0


async def partitions(pool: Any, model: str | None, command: str) -> list[Any]:
    """Every model partition, or ``model``'s alone (an unknown model exits with a message)."""
    from index.store.partitions import list_partitions

    found = [p for p in await list_partitions(pool) if model is None or p.model == model]
    if model is not None and not found:
        raise SystemExit(f"{command}: no partition for model {model!r}")
    return found


async def print_status(
    args: argparse.Namespace,
    root: Path,
    what: str,
    describe: Callable[[Path, str], dict[str, Any] | None],
    max_behind: int,
    line: Callable[[dict[str, Any]], str],
    hints: Mapping[str, str],
) -> int:
    """Each partition's folder in the one vocabulary (:mod:`index.follow.folder_state`, as
    ``/readyz`` and the console say it): its state, then ``line`` of a finished folder's account and
    the state's hint (what serves the partition meanwhile, what brings it back); JSON with ``--json``."""
    from index.follow.folder_state import folder_reports

    async with database(args) as (pool, _url):
        found = await partitions(pool, args.model, f"mnemo {what}")
        async with pool.acquire() as conn:
            out = await folder_reports(conn, root, found, describe, max_behind)
    if args.json:
        print(json.dumps({"root": str(root), "partitions": out}, indent=2))
    else:
        print(f"{what} in {root}")
        for name, row in out.items():
            said = [line(row)] if "seq" in row else []
            said += [hints[row["state"]]] if row["state"] in hints else []
            print(f"  {name}: {row['state']}: " + "; ".join(said))
    return 0


def add_folder_commands(
    subparsers: argparse._SubParsersAction, name: str, help_text: str, folder_help: str
) -> Callable[[str, str], argparse.ArgumentParser]:
    """The ``mnemo <name>`` group; returns a maker of its subcommands (each with ``--dir`` and the
    database flags)."""
    group = subparsers.add_parser(name, help=help_text)
    sub = group.add_subparsers(dest=f"{name}_command", metavar="WHAT", required=True)

    def parser(command: str, command_help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(command, help=command_help)
        p.add_argument("--dir", type=Path, default=None, help=folder_help)
        add_database_flags(p)
        return p

    return parser
