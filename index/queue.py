"""The durable ingestion queue (``rag_index_queue``): one row per record awaiting work.

- **Coalescing**: a newer push for a record replaces its pending payload and
  bumps ``version``; the drain completes a row only if the version it processed
  is still current, so an edit that lands mid-drain is never lost.
- **Backoff**: a failing record waits ``2^attempts`` minutes (capped) and is
  *parked* once ``attempts`` reaches the maximum, keeping its last error until
  ``retry`` (or a newer push) unparks it.
- **Outages**: a sidecar outage is not the record's fault; :func:`note_outage`
  records the error without spending an attempt.

The drain is single-flighted by a session advisory lock (:data:`DRAIN_LOCK_KEY`)
held by whoever drains, so claiming needs no row locks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import asyncpg

__all__ = [
    "DRAIN_LOCK_KEY",
    "OUTAGE_PREFIX",
    "Job",
    "QueueItem",
    "QueueStats",
    "backoff_seconds",
    "claim_ready",
    "complete",
    "enqueue",
    "fail",
    "list_entries",
    "note_outage",
    "retry",
    "stats",
]

Executor = asyncpg.Connection | asyncpg.Pool
Operation = Literal["index", "delete"]

# pg_try_advisory_lock key of the drain ("mnemo" + "drain" folded into a bigint).
DRAIN_LOCK_KEY = 0x6D6E656D6F_0D
# last_error of a record that waits on the sidecar rather than failing.
OUTAGE_PREFIX = "sidecar unavailable: "


@dataclass(frozen=True)
class Job:
    """A unit of work to enqueue: index a record (with its payload) or delete it."""

    section_tipo: str
    section_id: int
    operation: Operation
    payload: dict[str, Any] | None = None


@dataclass(frozen=True)
class QueueItem:
    """A claimed queue row, with the version the drain must see again to complete it."""

    section_tipo: str
    section_id: int
    operation: Operation
    payload: dict[str, Any] | None
    version: int
    attempts: int


@dataclass(frozen=True)
class QueueStats:
    """Counts over the queue. ``pending`` = ``ready`` + ``blocked`` (backing off);
    ``failed`` records are parked; ``oldest_age_s`` is the age of the oldest pending
    row (None when nothing is pending); ``waiting_on_sidecar`` counts pending rows
    whose last attempt met a sidecar outage."""

    pending: int
    ready: int
    blocked: int
    failed: int
    oldest_age_s: float | None
    waiting_on_sidecar: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def backoff_seconds(attempts: int, cap: float) -> float:
    """Delay before the next try after ``attempts`` failures: 2^attempts minutes, capped."""
    return float(min(60.0 * 2.0 ** min(attempts, 32), cap))


async def enqueue(db: Executor, jobs: Sequence[Job]) -> int:
    """Queue jobs in one statement, coalescing with what is already queued per record.

    Within ``jobs`` the last one per record wins. A re-queued record starts
    afresh: attempts reset, ready now, last error cleared. Returns the number of
    distinct records queued.
    """
    latest: dict[tuple[str, int], Job] = {}
    for job in jobs:
        latest.pop((job.section_tipo, job.section_id), None)
        latest[(job.section_tipo, job.section_id)] = job
    if not latest:
        return 0
    batch = list(latest.values())
    await db.execute(
        """
        INSERT INTO rag_index_queue AS q (section_tipo, section_id, operation, payload)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::jsonb[])
        ON CONFLICT (section_tipo, section_id) DO UPDATE SET
            operation = EXCLUDED.operation,
            payload = EXCLUDED.payload,
            version = q.version + 1,
            attempts = 0,
            next_attempt_at = now(),
            last_error = NULL,
            updated_at = now()
        """,
        [j.section_tipo for j in batch],
        [j.section_id for j in batch],
        [j.operation for j in batch],
        [None if j.payload is None else json.dumps(j.payload) for j in batch],
    )
    return len(batch)


async def claim_ready(
    db: Executor, limit: int, max_attempts: int, *, section_tipos: Sequence[str] | None = None
) -> list[QueueItem]:
    """Up to ``limit`` ready rows, longest-waiting first (the caller holds the drain lock).

    ``section_tipos`` narrows the claim to those sections (a scoped pass, e.g. ``mnemo eval``
    indexing its own section beside a gateway whose queue holds other work)."""
    rows = await db.fetch(
        """
        SELECT section_tipo, section_id, operation, payload, version, attempts
        FROM rag_index_queue
        WHERE attempts < $2 AND next_attempt_at <= now()
          AND ($3::text[] IS NULL OR section_tipo = ANY($3::text[]))
        ORDER BY next_attempt_at, created_at, section_tipo, section_id
        LIMIT $1
        """,
        limit,
        max_attempts,
        None if section_tipos is None else list(section_tipos),
    )
    return [
        QueueItem(
            r["section_tipo"],
            r["section_id"],
            r["operation"],
            None if r["payload"] is None else json.loads(r["payload"]),
            r["version"],
            r["attempts"],
        )
        for r in rows
    ]


async def complete(conn: asyncpg.Connection, item: QueueItem) -> bool:
    """Remove the row if it still holds the processed version (call inside the write
    transaction). False means a newer push arrived: the row stays for the next pass."""
    status = await conn.execute(
        "DELETE FROM rag_index_queue WHERE section_tipo = $1 AND section_id = $2 AND version = $3",
        item.section_tipo,
        item.section_id,
        item.version,
    )
    return status.endswith(" 1")


async def fail(db: Executor, item: QueueItem, error: str, *, max_attempts: int, backoff_cap: float) -> bool:
    """Spend an attempt: back off, or park at ``max_attempts``. True when now parked.

    A newer version of the record (pushed meanwhile) is left untouched.
    """
    attempts = item.attempts + 1
    await db.execute(
        """
        UPDATE rag_index_queue
        SET attempts = $4, last_error = $5, updated_at = now(),
            next_attempt_at = now() + make_interval(secs => $6)
        WHERE section_tipo = $1 AND section_id = $2 AND version = $3
        """,
        item.section_tipo,
        item.section_id,
        item.version,
        attempts,
        error[:4000],
        backoff_seconds(attempts, backoff_cap),
    )
    return attempts >= max_attempts


async def note_outage(db: Executor, items: Sequence[QueueItem], error: str) -> None:
    """Record a sidecar outage on rows without spending attempts (they stay ready)."""
    if not items:
        return
    await db.execute(
        """
        UPDATE rag_index_queue AS q SET last_error = $3, updated_at = now()
        FROM unnest($1::text[], $2::bigint[]) AS k(section_tipo, section_id)
        WHERE q.section_tipo = k.section_tipo AND q.section_id = k.section_id
        """,
        [i.section_tipo for i in items],
        [i.section_id for i in items],
        (OUTAGE_PREFIX + error)[:4000],
    )


async def stats(db: Executor, max_attempts: int) -> QueueStats:
    """pending / ready / blocked / failed / oldest age / waiting on the sidecar, in one query."""
    row = await db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE attempts < $1) AS pending,
               count(*) FILTER (WHERE attempts < $1 AND next_attempt_at <= now()) AS ready,
               count(*) FILTER (WHERE attempts < $1 AND next_attempt_at > now()) AS blocked,
               count(*) FILTER (WHERE attempts >= $1) AS failed,
               extract(epoch FROM now() - min(created_at) FILTER (WHERE attempts < $1))::float8
                   AS oldest_age_s,
               count(*) FILTER (WHERE attempts < $1 AND starts_with(last_error, $2))
                   AS waiting_on_sidecar
        FROM rag_index_queue
        """,
        max_attempts,
        OUTAGE_PREFIX,
    )
    assert row is not None
    return QueueStats(
        pending=row["pending"],
        ready=row["ready"],
        blocked=row["blocked"],
        failed=row["failed"],
        oldest_age_s=row["oldest_age_s"],
        waiting_on_sidecar=row["waiting_on_sidecar"],
    )


async def retry(
    db: Executor,
    *,
    section_tipo: str | None = None,
    section_id: int | None = None,
    include_blocked: bool = False,
    max_attempts: int,
) -> int:
    """Make parked rows (and, with ``include_blocked``, backing-off ones) ready now with
    fresh attempts. Filters narrow it to a section or one record. Returns rows changed.
    The last error stays visible until the record succeeds or is pushed again."""
    status = await db.execute(
        """
        UPDATE rag_index_queue SET attempts = 0, next_attempt_at = now(), updated_at = now()
        WHERE (attempts >= $1 OR ($2 AND next_attempt_at > now()))
          AND ($3::text IS NULL OR section_tipo = $3)
          AND ($4::bigint IS NULL OR section_id = $4)
        """,
        max_attempts,
        include_blocked,
        section_tipo,
        section_id,
    )
    return int(status.rsplit(" ", 1)[-1])


async def list_entries(
    db: Executor, *, max_attempts: int, failed_only: bool = False, limit: int = 50
) -> list[dict[str, Any]]:
    """Queue rows for people: state, attempts, next try and last error (no payloads)."""
    rows = await db.fetch(
        """
        SELECT section_tipo, section_id, operation, version, attempts, last_error,
               next_attempt_at, created_at,
               CASE WHEN attempts >= $1 THEN 'failed'
                    WHEN next_attempt_at > now() THEN 'blocked' ELSE 'ready' END AS state
        FROM rag_index_queue
        WHERE NOT $2 OR attempts >= $1
        ORDER BY (attempts >= $1) DESC, next_attempt_at, created_at
        LIMIT $3
        """,
        max_attempts,
        failed_only,
        limit,
    )
    return [dict(r) for r in rows]
