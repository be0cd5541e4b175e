"""``mnemo lexical follow | rebuild | status``: the lexical leg's Tantivy indexes on disk.

``follow`` is the one writer (:mod:`index.lexical.writer`): run one per host that serves gateways
with ``RAG_LEXICAL_INDEX=auto`` (the default) or ``tantivy`` (a second one, or a rebuild while it
runs, is refused by the writer lock); ``mnemo up`` starts it. ``rebuild`` builds a partition's index from the store into a new folder and swaps it
in; ``status`` prints each partition's folder, watermark and how many changes it is behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from index.cli.folders import add_folder_commands, database, follow, partitions, print_status
from inference.eventloop import command
from schema.cli import database_settings

if TYPE_CHECKING:
    from index.lexical.writer import LexicalWriter
    from index.settings import IngestSettings

__all__ = ["register"]


def _settings(args: argparse.Namespace) -> IngestSettings:
    from index.settings import IngestSettings
    from schema.settings import load_settings

    return load_settings(IngestSettings, lexical_dir=args.dir)


def _root(args: argparse.Namespace) -> Path:
    return _settings(args).lexical_root(database_settings(args).data_dir)


def _writer(args: argparse.Namespace, pool: Any, url: str) -> LexicalWriter:
    """The lexical writer of the configured folder, its memory ``RAG_LEXICAL_WRITER_MEMORY``."""
    from index.lexical.writer import LexicalWriter, WriterConfig

    config = WriterConfig(heap_bytes=_settings(args).lexical_writer_memory * 2**20)
    return LexicalWriter(pool, url, _root(args), config)


async def _follow(args: argparse.Namespace) -> int:
    return await follow(args, "lexical", _root(args), lambda pool, url: _writer(args, pool, url))


async def _rebuild(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from index.lexical.files import WriterLocked

    async with database(args) as (pool, url):
        writer = _writer(args, pool, url)
        try:
            for partition in await partitions(pool, args.model, "mnemo lexical"):
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
    from index.lexical.files import describe

    return await print_status(
        args,
        _root(args),
        "lexical indexes",
        describe,
        _settings(args).lexical_max_behind,
        lambda row: f"{row['documents']} documents, seq {row['seq']} ({row['behind']} changes behind)",
        {
            "behind": "the SQL leg serves it until `mnemo lexical follow` catches up (RAG_LEXICAL_MAX_BEHIND)",
            "building": "a build is writing its first index; the SQL leg serves it meanwhile",
            "missing": "the SQL leg serves it; run `mnemo lexical follow` or rebuild",
            "foreign": "another store's or an older format's (the SQL leg serves it; `mnemo lexical follow` "
            "rebuilds it)",
        },
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_folder_commands(
        subparsers,
        "lexical",
        "the lexical leg's Tantivy indexes (follow, rebuild, status)",
        "the lexical folder (env RAG_LEXICAL_DIR)",
    )
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
