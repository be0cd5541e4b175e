"""``mnemo sections`` (section descriptors) and ``mnemo reconcile`` (corrections from the
archive's id list)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from index.cli.common import (
    open_pool,
    print_json,
)
from inference.eventloop import command
from schema.cli import add_database_flags


async def _sections_put(args: argparse.Namespace) -> int:
    from index.store.sections import DescriptorError, SectionStore

    async with open_pool(args) as pool:
        try:
            descriptor = await SectionStore(pool).put(args.section, json.loads(args.file.read_text()))
        except DescriptorError as exc:
            print(f"invalid descriptor: {exc}", file=sys.stderr)
            return 2
    print_json(descriptor)
    return 0


async def _sections_get(args: argparse.Namespace) -> int:
    from index.store.sections import SectionStore

    async with open_pool(args) as pool:
        descriptor = await SectionStore(pool).get(args.section)
    if descriptor is None:
        print(f"section {args.section!r} has no descriptor", file=sys.stderr)
        return 1
    print_json(descriptor)
    return 0


async def _reconcile(args: argparse.Namespace) -> int:
    from index.ingest.intake import IntakeError
    from index.ingest.reconcile import parse_archive_listing, reconcile_section

    try:
        ids, records = parse_archive_listing(args.file.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    async with open_pool(args) as pool:
        try:
            report = await reconcile_section(pool, args.section, ids, records)
        except IntakeError as exc:
            print(f"{exc.code}: {exc}", file=sys.stderr)
            return 2
    print_json(report.as_dict())
    return 0


def register_sections(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("sections", help="section descriptors (embed groups, chunking)")
    s_sub = s.add_subparsers(dest="sections_command", metavar="WHAT", required=True)
    p = s_sub.add_parser("put", help="store a section's descriptor from a JSON file")
    p.add_argument("section", help="section tipo")
    p.add_argument("file", type=Path)
    add_database_flags(p)
    p.set_defaults(run=command(_sections_put, "mnemo"))
    p = s_sub.add_parser("get", help="print a section's descriptor")
    p.add_argument("section", help="section tipo")
    add_database_flags(p)
    p.set_defaults(run=command(_sections_get, "mnemo"))


def register_reconcile(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "reconcile", help="queue index/delete corrections for a section from the archive's id list"
    )
    p.add_argument("section", help="section tipo")
    p.add_argument("file", type=Path, help="ids (one per line or a JSON array) and/or JSONL records")
    add_database_flags(p)
    p.set_defaults(run=command(_reconcile, "mnemo"))
