"""``mnemo vectors follow | rebuild | status``: the CPU vector cache's snapshots on disk.

``follow`` is the one writer (:mod:`index.vectors.writer`): run one per host that serves gateways
with ``RAG_FAISS_CACHE=mmap`` (a second one, or a rebuild while it runs, is refused by the writer
lock). ``rebuild`` loads a partition from the store into a new snapshot and swaps it in; ``status``
prints each partition's snapshot, watermark and how many changes it is behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from index.cli.folders import add_folder_commands, database, follow, partitions, print_status
from inference.eventloop import command
from schema.cli import database_settings

__all__ = ["register"]


def _settings(args: argparse.Namespace) -> tuple[Path, int]:
    from index.settings import IngestSettings
    from schema.settings import load_settings

    settings = load_settings(IngestSettings, vector_dir=args.dir)
    return settings.vector_root(database_settings(args).data_dir), settings.vector_snapshot_changes


async def _follow(args: argparse.Namespace) -> int:
    from index.vectors.writer import VectorWriter

    root, changes = _settings(args)
    return await follow(
        args, "vectors", root, lambda pool, url: VectorWriter(pool, url, root, snapshot_changes=changes)
    )


async def _rebuild(args: argparse.Namespace) -> int:
    from index.follow.swap_folders import WriterLocked
    from index.vectors.writer import VectorWriter

    root, changes = _settings(args)
    async with database(args) as (pool, url):
        writer = VectorWriter(pool, url, root, snapshot_changes=changes)
        try:
            for partition in await partitions(pool, args.model, "mnemo vectors"):
                try:
                    built = await writer.rebuild(partition)
                except WriterLocked as exc:
                    print(f"mnemo vectors rebuild: {exc}", file=sys.stderr)
                    return 1
                print(f"{partition.partition}: {built.live} vectors in {built.folder}")
        finally:
            await writer.stop()
    return 0


async def _status(args: argparse.Namespace) -> int:
    from index.vectors.files import describe

    root, changes = _settings(args)
    return await print_status(
        args,
        root,
        "vector snapshots",
        describe,
        changes,
        lambda row: f"{row['vectors']} vectors, seq {row['seq']} ({row['behind']} changes behind)",
        {
            "behind": "past RAG_VECTOR_SNAPSHOT_CHANGES: readers apply every change since it privately "
            "until `mnemo vectors follow` writes a new one",
            "building": "a build is writing its first snapshot; pgvector serves it meanwhile",
            "missing": "pgvector serves it; run `mnemo vectors follow` or rebuild",
            "foreign": "another store's (pgvector serves it; `mnemo vectors follow` rebuilds it)",
        },
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_folder_commands(
        subparsers,
        "vectors",
        "the CPU vector cache's snapshots that gateway workers map (follow, rebuild, status)",
        "the vector folder (env RAG_VECTOR_DIR)",
    )
    p = parser(
        "follow", "the one writer: map or build each snapshot, follow the feed, rewrite past a threshold"
    )
    p.set_defaults(run=command(_follow, "mnemo vectors follow"))
    p = parser("rebuild", "load partitions from the store into new snapshots and swap them in")
    p.add_argument("--model", default=None, help="only this model's partition")
    p.set_defaults(run=command(_rebuild, "mnemo vectors rebuild"))
    p = parser("status", "each partition's snapshot: vectors, watermark, changes behind the store")
    p.add_argument("--model", default=None, help="only this model's partition")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(run=command(_status, "mnemo vectors status"))
