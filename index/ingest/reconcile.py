"""Reconcile: bring a section's index in line with the archive's list of record ids.

The archive is the source of truth. Given the ids it holds for a section (and,
optionally, the records themselves), ids the store holds but the archive does
not are queued for deletion; ids the archive holds but the store lacks (and
that are not already queued for indexing) are queued for indexing when their
record is given, and reported as ``missing`` otherwise, for the archive to
push. A record whose texts are all empty stores nothing and therefore shows
as missing too: pushing it again is harmless (it indexes to nothing).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from index.ingest import queue
from index.ingest.intake import IntakeCode, IntakeError, enqueue_records
from index.store import store
from index.store.sections import validate_section_tipo
from index.store.validation import FieldError

__all__ = ["ReconcileReport", "parse_archive_listing", "reconcile_section"]


@dataclass
class ReconcileReport:
    section_tipo: str
    archive: int = 0
    stored: int = 0
    delete_enqueued: list[int] = field(default_factory=list)
    index_enqueued: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def reconcile_section(
    pool: asyncpg.Pool,
    section_tipo: str,
    ids: Iterable[int],
    records: Sequence[dict[str, Any]] = (),
) -> ReconcileReport:
    """Queue the corrections for one section; ``records`` (validated like intake) may carry
    the archive's documents for ids the store lacks. Their ids count as archive ids."""
    try:
        validate_section_tipo(section_tipo)
    except FieldError as exc:
        raise IntakeError(IntakeCode.INVALID_RECORD, "section_tipo", exc.message) from exc
    by_id: dict[int, dict[str, Any]] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict) or record.get("section_tipo") != section_tipo:
            raise IntakeError(
                IntakeCode.INVALID_RECORD, f"records[{i}].section_tipo", f"must be {section_tipo!r}"
            )
        if isinstance(record.get("section_id"), int):
            by_id[record["section_id"]] = record
    archive = {int(i) for i in ids} | set(by_id)
    stored = await store.section_ids(pool, section_tipo)
    queued = await pool.fetch(
        "SELECT section_id, operation FROM rag_index_queue WHERE section_tipo = $1", section_tipo
    )
    queued_index = {r["section_id"] for r in queued if r["operation"] == "index"}
    queued_delete = {r["section_id"] for r in queued if r["operation"] == "delete"}

    report = ReconcileReport(section_tipo, archive=len(archive), stored=len(stored))
    extra = sorted(stored - archive - queued_delete)
    absent = sorted(archive - stored - queued_index)
    report.index_enqueued = [i for i in absent if i in by_id]
    report.missing = [i for i in absent if i not in by_id]
    if report.index_enqueued:
        await enqueue_records(pool, [by_id[i] for i in report.index_enqueued])
    await queue.enqueue(pool, [queue.Job(section_tipo, i, "delete") for i in extra])
    report.delete_enqueued = extra
    return report


def parse_archive_listing(text: str) -> tuple[list[int], list[dict[str, Any]]]:
    """Ids and records from a listing: a JSON array (of ids or records), or one id or one
    JSON record per line. Blank lines and ``#`` comments are skipped."""
    stripped = text.strip()
    items: list[Any]
    if stripped.startswith("["):
        items = json.loads(stripped)
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"line {n}: not an id or a JSON record: {line[:60]!r}") from exc
    ids: list[int] = []
    records: list[dict[str, Any]] = []
    for n, item in enumerate(items, 1):
        if isinstance(item, bool) or not isinstance(item, int | dict):
            raise ValueError(f"item {n}: expected a record id or a record object, got {item!r:.60}")
        if isinstance(item, dict):
            records.append(item)
        else:
            ids.append(item)
    return ids, records
