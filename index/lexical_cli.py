"""``mnemo lexical follow | rebuild | status``: the lexical leg's Tantivy indexes on disk.

``follow`` is the one writer (:mod:`index.tantivy_writer`): run one per host that serves gateways
with ``RAG_LEXICAL_INDEX=auto`` (the default) or ``tantivy`` (a second one, or a rebuild while it
runs, is refused by the writer lock); ``mnemo up`` starts it. ``rebuild`` builds a partition's index from the store into a new folder and swaps it
in; ``status`` prints each partition's folder, watermark and how many changes it is behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from inference.eventloop import command
from schema.cli import add_database_flags, database_settings, stop_signal

__all__ = ["register"]


def _root(args: argparse.Namespace) -> Path:
    from schema.settings import load_settings

    from .settings import IngestSettings

    settings = load_settings(IngestSettings, lexical_dir=args.dir)
    return settings.lexical_root(database_settings(args).data_dir)


@contextlib.asynccontextmanager
async def _pool(args: argparse.Namespace) -> AsyncIterator[tuple[Any, str]]:
    from schema.database import open_database

    async with open_database(database_settings(args)) as db:
        yield db.pool, db.url


async def _partitions(pool: Any, model: str | None) -> list[Any]:
    from .partitions import list_partitions

    found = [p for p in await list_partitions(pool) if model is None or p.model == model]
    if model is not None and not found:
        raise SystemExit(f"mnemo lexical: no partition for model {model!r}")
    return found


async def _follow(args: argparse.Namespace) -> int:
    from .tantivy_files import WriterLocked
    from .tantivy_writer import LexicalWriter

    root = _root(args)
    async with _pool(args) as (pool, url):
        writer = LexicalWriter(pool, url, root)
        with stop_signal() as stop:
            try:
                await writer.start()
            except WriterLocked as exc:
                print(f"mnemo lexical follow: {exc}", file=sys.stderr)
                return 1
            print(f"lexical writer: following the change feed into {root}; Ctrl-C stops it", flush=True)
            try:
                await stop.wait()
            finally:
                await writer.stop()
    print("lexical writer stopped", flush=True)
    return 0


async def _rebuild(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .tantivy_files import WriterLocked
    from .tantivy_writer import LexicalWriter

    root = _root(args)
    async with _pool(args) as (pool, url):
        writer = LexicalWriter(pool, url, root)
        try:
            for partition in await _partitions(pool, args.model):
                total = await pool.fetchval(
                    f"SELECT count(*) FROM {partition.table} WHERE modality = 'text' AND model = $1",
                    partition.model,
                )
                with tqdm(total=total, unit="row", desc=partition.partition, disable=args.no_progress) as bar:
                    try:
                        built = await writer.rebuild(partition, bar.update)
                    except WriterLocked as exc:
                        print(f"mnemo lexical rebuild: {exc}", file=sys.stderr)
                        return 1
                print(f"{partition.partition}: {built.committed.documents} documents in {built.folder}")
        finally:
            await writer.stop()
    return 0


async def _status(args: argparse.Namespace) -> int:
    from .change_feed import current_watermark
    from .tantivy_files import current_folder, read_state

    root = _root(args)
    out: dict[str, Any] = {}
    async with _pool(args) as (pool, _url):
        for partition in await _partitions(pool, args.model):
            folder = current_folder(root, partition)
            state = None if folder is None else read_state(folder)
            async with pool.acquire() as conn:
                head = await current_watermark(conn, partition)
            out[partition.partition] = (
                {"state": "missing", "store_seq": head.seq}
                if state is None
                else {
                    "state": "ready",
                    "folder": str(folder),
                    "seq": state.watermark.seq,
                    "store_seq": head.seq,
                    "behind": max(0, head.seq - state.watermark.seq),
                    "documents": state.documents,
                    "classes": len(state.classes),
                }
            )
    if args.json:
        print(json.dumps({"root": str(root), "partitions": out}, indent=2))
    else:
        print(f"lexical indexes in {root}")
        for name, row in out.items():
            if row["state"] == "missing":
                print(f"  {name}: missing (the SQL leg serves it; run `mnemo lexical rebuild`)")
            else:
                print(
                    f"  {name}: {row['documents']} documents, seq {row['seq']} ({row['behind']} changes behind)"
                )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    lexical = subparsers.add_parser(
        "lexical", help="the lexical leg's Tantivy indexes (follow, rebuild, status)"
    )
    sub = lexical.add_subparsers(dest="lexical_command", metavar="WHAT", required=True)

    def parser(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--dir", type=Path, default=None, help="the lexical folder (env RAG_LEXICAL_DIR)")
        add_database_flags(p)
        return p

    p = parser("follow", "the one writer: build missing indexes, then follow the change feed")
    p.set_defaults(run=command(_follow, "mnemo lexical follow"))
    p = parser("rebuild", "build indexes from the store into a new folder and swap them in")
    p.add_argument("--model", default=None, help="only this model's partition")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=command(_rebuild, "mnemo lexical rebuild"))
    p = parser("status", "each partition's index: documents, watermark, changes behind the store")
    p.add_argument("--model", default=None, help="only this model's partition")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(run=command(_status, "mnemo lexical status"))
