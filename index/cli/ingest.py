"""``mnemo ingest``: queue records for indexing, from a JSONL file (``records``), a collection's
images (``images``, :mod:`index.cli.images`) or the demo collection (``demo``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from index.cli.common import (
    EXIT_SIDECAR_UNAVAILABLE,
    add_sidecar_flags,
    ingest_settings,
    open_pool,
    open_sidecar,
    print_report,
)
from index.cli.images import register_ingest_images
from inference.eventloop import command, run
from schema.cli import add_database_flags


def _ingest_records_command(args: argparse.Namespace) -> int:
    path: Path = args.file
    if not path.is_file():
        print(f"no such file: {path}", file=sys.stderr)
        return 2
    with path.open("rb") as fh:
        total = sum(1 for line in fh if line.strip())
    return run(_ingest_records(args, path, total))


async def _ingest_records(args: argparse.Namespace, path: Path, total: int) -> int:
    from tqdm import tqdm

    from index.ingest.intake import enqueue_valid
    from inference.strict_json import JsonRejected, loads_strict

    queued = 0
    rejected: list[str] = []
    async with open_pool(args) as pool:
        with (
            path.open(encoding="utf-8") as fh,
            tqdm(total=total, unit="rec", desc="ingest", disable=args.no_progress) as bar,
        ):
            batch: list[Any] = []
            lines: list[int] = []

            async def flush() -> None:
                nonlocal queued
                if not batch:
                    return
                n, bad = await enqueue_valid(pool, batch)
                queued += n
                rejected.extend(f"line {lines[i]}: {e.code}: {e}" for i, e in bad)
                bar.update(len(batch))
                batch.clear()
                lines.clear()

            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    # The same parser and limits as POST /v1/records (NUL and lone surrogates
                    # included, which PostgreSQL would refuse for the whole batch).
                    batch.append(loads_strict(line.encode("utf-8"), forbid_nul=True))
                    lines.append(number)
                except JsonRejected as exc:
                    code = "request.invalid_text" if exc.reason == "invalid_text" else "request.invalid_json"
                    rejected.append(f"line {number}: {code}: {exc}")
                    bar.update(1)
                if len(batch) >= args.batch:
                    await flush()
            await flush()
        print(f"{total} records read, {queued} queued, {len(rejected)} rejected", flush=True)
        for message in rejected[:20]:
            print("  " + message, flush=True)
        if len(rejected) > 20:
            print(f"  ... and {len(rejected) - 20} more", flush=True)
        if args.drain:
            from index.ingest.drain import drain_once

            async with open_sidecar(args) as (client, sidecar):
                report = await drain_once(pool, client, ingest_settings(args), text_model=sidecar.text_model)
                print_report(report)
                if report.unavailable:
                    return EXIT_SIDECAR_UNAVAILABLE
    return 1 if rejected else 0


async def _ingest_demo(args: argparse.Namespace) -> int:
    from index.demo import load_demo

    async with open_pool(args) as pool:
        n = await load_demo(pool)
    print(f"demo collection: {n} records queued (the drain indexes them)", flush=True)
    return 0


def register_ingest(subparsers: argparse._SubParsersAction) -> None:
    ingest = subparsers.add_parser("ingest", help="queue records for indexing (backfills, the demo)")
    ingest_sub = ingest.add_subparsers(dest="ingest_command", metavar="WHAT", required=True)
    p = ingest_sub.add_parser("records", help="queue the records of a JSONL file (one record per line)")
    p.add_argument("file", type=Path, help="JSONL file, one record object per line")
    p.add_argument("--batch", type=int, default=500, help="records per enqueue statement (default 500)")
    p.add_argument("--drain", action="store_true", help="drain the queue afterwards")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_database_flags(p)
    add_sidecar_flags(p)
    p.set_defaults(run=_ingest_records_command)
    register_ingest_images(ingest_sub)
    p = ingest_sub.add_parser("demo", help="store the demo sections and queue the demo collection")
    add_database_flags(p)
    p.set_defaults(run=command(_ingest_demo, "mnemo"))
