"""The drain workers' registry (``rag_drain_workers``): who drains now, with what throughput.

Every drain worker (a `mnemo drain` worker, or the gateway's) registers a row,
refreshes it with its heartbeat (counters and a recent records/s) and removes it
when it stops. A killed worker's row stops being refreshed: it shows as stale
until it is pruned. The leases themselves live on the queue rows
(:mod:`index.ingest.queue`); :func:`list_workers` joins the two so an operator sees
each worker's held leases beside its throughput.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from index.store.executor import Executor

__all__ = ["WorkerRow", "WorkerSample", "heartbeat", "list_workers", "register", "unregister"]


# A stopped worker's row is kept this long for the record, then pruned at the next registration.
PRUNE_AFTER_S = 86_400.0


@dataclass(frozen=True)
class WorkerSample:
    """A worker's counters at one heartbeat, and its records/s over the last window."""

    records_done: int
    records_failed: int
    chunks_embedded: int
    records_per_s: float


@dataclass(frozen=True)
class WorkerRow:
    """One registered worker. ``alive``: its heartbeat is recent (within ``stale_after_s``);
    ``leases``: queue rows it holds under a live lease."""

    worker_id: str
    role: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    leases: int
    records_done: int
    records_failed: int
    chunks_embedded: int
    records_per_s: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: timestamps as ISO 8601 strings."""
        return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(self).items()}


async def register(db: Executor, worker_id: str, *, role: str, host: str, pid: int) -> None:
    """Add the worker's row (and prune rows of workers gone for a day)."""
    await db.execute(
        "DELETE FROM rag_drain_workers WHERE heartbeat_at < now() - make_interval(secs => $1)",
        PRUNE_AFTER_S,
    )
    await db.execute(
        """
        INSERT INTO rag_drain_workers (worker_id, role, host, pid) VALUES ($1, $2, $3, $4)
        ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = now()
        """,
        worker_id,
        role,
        host,
        pid,
    )


async def heartbeat(db: Executor, worker_id: str, sample: WorkerSample) -> None:
    """Refresh the worker's row with its counters."""
    await db.execute(
        """
        UPDATE rag_drain_workers
        SET heartbeat_at = now(), records_done = $2, records_failed = $3, chunks_embedded = $4,
            records_per_s = $5
        WHERE worker_id = $1
        """,
        worker_id,
        sample.records_done,
        sample.records_failed,
        sample.chunks_embedded,
        sample.records_per_s,
    )


async def unregister(db: Executor, worker_id: str) -> None:
    await db.execute("DELETE FROM rag_drain_workers WHERE worker_id = $1", worker_id)


async def list_workers(db: Executor, *, stale_after_s: float) -> list[WorkerRow]:
    """Registered workers with the live leases each holds, alive ones first."""
    rows = await db.fetch(
        """
        SELECT w.*, w.heartbeat_at > now() - make_interval(secs => $1) AS alive,
               (SELECT count(*) FROM rag_index_queue q
                WHERE q.lease_owner = w.worker_id AND q.lease_until > now()) AS leases
        FROM rag_drain_workers w
        ORDER BY alive DESC, w.role, w.started_at, w.worker_id
        """,
        stale_after_s,
    )
    return [WorkerRow(**{f.name: r[f.name] for f in fields(WorkerRow)}) for r in rows]
