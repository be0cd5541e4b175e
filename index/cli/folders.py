"""What ``mnemo lexical`` and ``mnemo vectors`` share: each keeps one swapped folder per partition
(:mod:`index.follow.swap_folders`) written by one follower, and reports them the same way."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
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
    line: Callable[[dict[str, Any]], str],
    missing: str,
    foreign: str,
) -> int:
    """Each partition's current folder as ``describe`` reads it, given this store's identity (None:
    missing; else at least its ``seq`` and whether it is ``foreign``: another store's, or a layout
    readers do not search), with how many changes it is behind the store; JSON with ``--json``."""
    from index.follow.swap_folders import current_folder
    from index.store.change_feed import current_watermark, store_identity

    out: dict[str, Any] = {}
    async with database(args) as (pool, _url):
        async with pool.acquire() as conn:
            store = await store_identity(conn)
        for partition in await partitions(pool, args.model, f"mnemo {what}"):
            folder = current_folder(root, partition)
            found = None if folder is None else describe(folder, store)
            async with pool.acquire() as conn:
                head = await current_watermark(conn, partition)
            if found is None:
                out[partition.partition] = {"state": "missing", "store_seq": head.seq}
            else:
                behind = max(0, head.seq - found["seq"])
                out[partition.partition] = {
                    "state": "foreign" if found.pop("foreign") else "ready",
                    "folder": str(folder),
                    **found,
                    "store_seq": head.seq,
                    "behind": behind,
                }
    if args.json:
        print(json.dumps({"root": str(root), "partitions": out}, indent=2))
    else:
        print(f"{what} in {root}")
        for name, row in out.items():
            text = {"missing": missing, "foreign": foreign}.get(row["state"]) or line(row)
            print(f"  {name}: {text}")
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
