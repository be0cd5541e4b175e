"""The durable ingestion queue (``rag_index_queue``): one row per record awaiting work.

- **Coalescing**: a newer push for a record replaces its pending payload and
  bumps ``version``; the drain completes a row only if the version it processed
  is still current, so an edit that lands mid-drain is never lost.
- **Backoff**: a failing record waits ``2^attempts`` minutes (capped) and is
  *parked* once ``attempts`` reaches the maximum, keeping its last error until
  ``retry`` (or a newer push) unparks it.
- **Outages**: a sidecar outage is not the record's fault; :func:`note_outage`
  records the error without spending an attempt.
- **Leases**: any number of drain workers (processes, hosts) share the queue.
  :func:`claim_ready` takes ready rows with ``FOR UPDATE SKIP LOCKED`` and
  stamps them with a lease (its owner, and an expiry on the database's clock,
  ``clock_timestamp()``, so a statement that waited on a lock does not date it
  back). The owner renews the leases of the records it works on. A leased row
  is claimed by no one else until its owner releases it (done, failed, outage)
  or the lease expires (the owner was killed: it stopped renewing). A newer
  push keeps the lease, so one record is never processed by two workers at once;
  the holder's :func:`complete` then finds a newer version, leaves the row and
  releases it for the next claim. Inside the write transaction, :func:`hold`
  row-locks the lease, so a worker whose lease expired and was taken over
  writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import asyncpg

from index.store.executor import Executor

__all__ = [
    "OUTAGE_PREFIX",
    "Job",
    "Lease",
    "QueueItem",
    "QueueStats",
    "backoff_seconds",
    "claim_ready",
    "complete",
    "enqueue",
    "fail",
    "hold",
    "list_entries",
    "note_outage",
    "release_all",
    "renew_leases",
    "renew_owner",
    "retry",
    "stats",
]

Operation = Literal["index", "delete"]

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
class Lease:
    """Who claims (a worker's id, unique across hosts) and for how long a claim holds."""

    owner: str
    seconds: float


@dataclass(frozen=True)
class QueueItem:
    """A claimed queue row, with the version the drain must see again to complete it and
    the lease owner that must still hold it."""

    section_tipo: str
    section_id: int
    operation: Operation
    payload: dict[str, Any] | None
    version: int
    attempts: int
    lease_owner: str


@dataclass(frozen=True)
class QueueStats:
    """Counts over the queue. ``pending`` = ``ready`` + ``blocked`` (backing off);
    ``failed`` records are parked; ``oldest_age_s`` is the age of the oldest pending
    row (None when nothing is pending); ``waiting_on_sidecar`` counts pending rows
    whose last attempt met a sidecar outage. ``leased`` rows are being processed by a
    worker now; ``expired_leases`` were held by a worker that stopped renewing them
    (killed): any worker's next claim takes them over."""

    pending: int
    ready: int
    blocked: int
    failed: int
    oldest_age_s: float | None
    waiting_on_sidecar: int
    leased: int = 0
    expired_leases: int = 0

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
    db: Executor,
    limit: int,
    max_attempts: int,
    *,
    lease: Lease,
    section_tipos: Sequence[str] | None = None,
) -> list[QueueItem]:
    """Lease up to ``limit`` ready rows to ``lease.owner``, longest-waiting first.

    A row is claimable when it is ready and nobody holds a live lease on it; rows that
    another claim has locked this instant are skipped (``SKIP LOCKED``), so concurrent
    workers get disjoint batches without waiting on each other. ``section_tipos``
    narrows the claim to those sections (a scoped pass, e.g. ``mnemo eval`` indexing
    its own section beside a gateway whose queue holds other work)."""
    rows = await db.fetch(
        """
        WITH claimable AS (
            SELECT section_tipo, section_id
            FROM rag_index_queue
            WHERE attempts < $2 AND next_attempt_at <= now()
              AND (lease_until IS NULL OR lease_until <= now())
              AND ($3::text[] IS NULL OR section_tipo = ANY($3::text[]))
            ORDER BY next_attempt_at, created_at, section_tipo, section_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE rag_index_queue AS q
        SET lease_owner = $4, lease_until = clock_timestamp() + make_interval(secs => $5)
        FROM claimable c
        WHERE q.section_tipo = c.section_tipo AND q.section_id = c.section_id
        RETURNING q.section_tipo, q.section_id, q.operation, q.payload, q.version, q.attempts,
                  q.next_attempt_at, q.created_at
        """,
        limit,
        max_attempts,
        None if section_tipos is None else list(section_tipos),
        lease.owner,
        lease.seconds,
    )
    # UPDATE ... RETURNING keeps no order: restore the claim's.
    rows = sorted(
        rows, key=lambda r: (r["next_attempt_at"], r["created_at"], r["section_tipo"], r["section_id"])
    )
    return [
        QueueItem(
            r["section_tipo"],
            r["section_id"],
            r["operation"],
            None if r["payload"] is None else json.loads(r["payload"]),
            r["version"],
            r["attempts"],
            lease.owner,
        )
        for r in rows
    ]


async def renew_leases(db: Executor, lease: Lease, keys: Sequence[tuple[str, int]]) -> int:
    """Extend the leases ``lease.owner`` holds on ``keys`` (the records it is processing: a
    worker's heartbeat). Returns rows renewed. A lease its owner no longer works on (a pass
    that died between claim and write) is not renewed, so it expires and is taken over.

    Rows locked right now are skipped rather than waited for: the owner's own write
    transaction locks the row it writes (and nobody can claim it meanwhile), and a push
    locks its row for an instant; the next beat renews them. Waiting instead would
    stall the beat behind a long write, and the expiry is computed from the clock when
    the row is updated, not when the statement began."""
    if not keys:
        return 0
    status = await db.execute(
        """
        WITH mine AS (
            SELECT q.section_tipo, q.section_id
            FROM rag_index_queue q
            JOIN unnest($3::text[], $4::bigint[]) AS k(section_tipo, section_id)
              ON q.section_tipo = k.section_tipo AND q.section_id = k.section_id
            WHERE q.lease_owner = $1
            FOR UPDATE OF q SKIP LOCKED
        )
        UPDATE rag_index_queue AS q SET lease_until = clock_timestamp() + make_interval(secs => $2)
        FROM mine WHERE q.section_tipo = mine.section_tipo AND q.section_id = mine.section_id
        """,
        lease.owner,
        lease.seconds,
        [k[0] for k in keys],
        [k[1] for k in keys],
    )
    return int(status.rsplit(" ", 1)[-1])


async def renew_owner(db: Executor, lease: Lease) -> int:
    """Extend every lease ``lease.owner`` holds (a backfill holds its whole scope at once).
    Rows locked right now are skipped, as in :func:`renew_leases`."""
    status = await db.execute(
        """
        WITH mine AS (
            SELECT section_tipo, section_id FROM rag_index_queue WHERE lease_owner = $1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE rag_index_queue AS q SET lease_until = clock_timestamp() + make_interval(secs => $2)
        FROM mine WHERE q.section_tipo = mine.section_tipo AND q.section_id = mine.section_id
        """,
        lease.owner,
        lease.seconds,
    )
    return int(status.rsplit(" ", 1)[-1])


async def release_all(db: Executor, owner: str) -> int:
    """Give back every lease ``owner`` holds (a worker stopping): the rows are claimable at once."""
    status = await db.execute(
        "UPDATE rag_index_queue SET lease_owner = NULL, lease_until = NULL WHERE lease_owner = $1", owner
    )
    return int(status.rsplit(" ", 1)[-1])


async def _release(db: Executor, items: Sequence[QueueItem]) -> None:
    """Give back the leases of ``items`` that their owner still holds."""
    if not items:
        return
    await db.execute(
        """
        UPDATE rag_index_queue AS q SET lease_owner = NULL, lease_until = NULL
        FROM unnest($1::text[], $2::bigint[], $3::text[]) AS k(section_tipo, section_id, owner)
        WHERE q.section_tipo = k.section_tipo AND q.section_id = k.section_id
          AND q.lease_owner = k.owner
        """,
        [i.section_tipo for i in items],
        [i.section_id for i in items],
        [i.lease_owner for i in items],
    )


async def hold(conn: asyncpg.Connection, item: QueueItem) -> bool:
    """Row-lock the record's queue row if ``item``'s owner still holds its lease (call first
    inside the write transaction). False: the lease expired and another worker claimed the
    record, so this worker must write nothing. True: until the transaction ends, no one
    can claim the row (even if the lease expires meanwhile)."""
    held = await conn.fetchval(
        """
        SELECT 1 FROM rag_index_queue
        WHERE section_tipo = $1 AND section_id = $2 AND lease_owner = $3
        FOR UPDATE
        """,
        item.section_tipo,
        item.section_id,
        item.lease_owner,
    )
    return held is not None


async def complete(conn: asyncpg.Connection, item: QueueItem) -> bool:
    """Remove the row if it still holds the processed version (call inside the write
    transaction, after :func:`hold`). False means a newer push arrived: the row stays,
    its lease released, for the next claim."""
    status = await conn.execute(
        "DELETE FROM rag_index_queue WHERE section_tipo = $1 AND section_id = $2 AND version = $3",
        item.section_tipo,
        item.section_id,
        item.version,
    )
    if status.endswith(" 1"):
        return True
    await _release(conn, [item])
    return False


async def fail(db: Executor, item: QueueItem, error: str, *, max_attempts: int, backoff_cap: float) -> bool:
    """Spend an attempt and release the lease: back off, or park at ``max_attempts``. True
    when now parked.

    A newer version of the record (pushed meanwhile) is left untouched but for the lease,
    and so is a record whose lease another worker took over.
    """
    attempts = item.attempts + 1
    await db.execute(
        """
        UPDATE rag_index_queue
        SET attempts = $4, last_error = $5, updated_at = now(),
            next_attempt_at = now() + make_interval(secs => $6),
            lease_owner = NULL, lease_until = NULL
        WHERE section_tipo = $1 AND section_id = $2 AND version = $3 AND lease_owner = $7
        """,
        item.section_tipo,
        item.section_id,
        item.version,
        attempts,
        error[:4000],
        backoff_seconds(attempts, backoff_cap),
        item.lease_owner,
    )
    await _release(db, [item])
    return attempts >= max_attempts


async def note_outage(db: Executor, items: Sequence[QueueItem], error: str) -> None:
    """Record a sidecar outage on rows without spending attempts (they stay ready) and
    release their leases."""
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
    await _release(db, items)


async def stats(db: Executor, max_attempts: int) -> QueueStats:
    """pending / ready / blocked / failed / oldest age / waiting on the sidecar / leases, in one
    query."""
    row = await db.fetchrow(
        """
        SELECT count(*) FILTER (WHERE attempts < $1) AS pending,
               count(*) FILTER (WHERE attempts < $1 AND next_attempt_at <= now()) AS ready,
               count(*) FILTER (WHERE attempts < $1 AND next_attempt_at > now()) AS blocked,
               count(*) FILTER (WHERE attempts >= $1) AS failed,
               extract(epoch FROM now() - min(created_at) FILTER (WHERE attempts < $1))::float8
                   AS oldest_age_s,
               count(*) FILTER (WHERE attempts < $1 AND starts_with(last_error, $2))
                   AS waiting_on_sidecar,
               count(*) FILTER (WHERE lease_until > now()) AS leased,
               count(*) FILTER (WHERE lease_until <= now()) AS expired_leases
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
        leased=row["leased"],
        expired_leases=row["expired_leases"],
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
    """Queue rows for people: state, attempts, next try, last error and lease (no payloads)."""
    rows = await db.fetch(
        """
        SELECT section_tipo, section_id, operation, version, attempts, last_error,
               next_attempt_at, created_at, lease_owner, lease_until,
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
