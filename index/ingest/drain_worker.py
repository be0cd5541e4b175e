"""One claimant of the ingestion queue (:class:`DrainWorker`): its lease identity, its heartbeat,
its counters, and the claims an interrupted pass left. The passes (:mod:`index.ingest.drain_pass`) and
the loop (:mod:`index.ingest.drain`) run on workers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import deque
from types import TracebackType

import asyncpg

from index.ingest import drain_registry, queue
from index.retry_log import log_retry
from index.settings import IngestSettings
from schema.database import database_unreachable

__all__ = ["RATE_WINDOW_S", "DrainWorker", "stale_after_s"]

log = logging.getLogger(__name__)

# records/s of a worker is measured over this trailing window of heartbeats.
RATE_WINDOW_S = 60.0


class DrainWorker:
    """One claimant of the queue: its lease identity, its heartbeat and its counters.

    ``async with`` registers it (``rag_drain_workers``) and starts the heartbeat, which
    renews the leases of the records it is processing (:attr:`holding`) every third of
    ``lease_seconds`` and publishes its throughput; on exit it gives its leases back (the
    records are claimable at once) and unregisters.
    The id names the role, host and process, plus a random tag (a pid is not unique
    across containers)."""

    def __init__(self, pool: asyncpg.Pool, settings: IngestSettings, *, role: str = "drain", index: int = 0):
        self.pool = pool
        self.role = role
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.id = f"{role}@{self.host}:{self.pid}#{index}-{secrets.token_hex(3)}"
        self.lease = queue.Lease(self.id, settings.lease_seconds)
        self.records_done = 0
        self.records_failed = 0
        self.chunks_embedded = 0
        # The records this worker is processing: only their leases are renewed.
        self.holding: set[tuple[str, int]] = set()
        # A pass ended (an error, the database gone) still holding claims: the next pass gives
        # them back first, so this live worker takes its records again at once instead of
        # leaving them to expire (lease_seconds) after an outage of a second.
        self.left_claims = False
        self._samples: deque[tuple[float, int]] = deque()
        self._beating: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DrainWorker:
        await drain_registry.register(self.pool, self.id, role=self.role, host=self.host, pid=self.pid)
        self._beating = asyncio.create_task(self._beat(), name=f"mnemo-drain-heartbeat-{self.id}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        try:
            released = await queue.release_all(self.pool, self.id)
            await drain_registry.unregister(self.pool, self.id)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            # Not fatal: the leases expire by themselves after lease_seconds.
            log.warning("drain worker %s could not give its leases back: %s", self.id, error)
        else:
            if released:
                log.info("drain worker %s gave back %d leases", self.id, released)

    def sample(self) -> drain_registry.WorkerSample:
        """The counters now, with records/s over the last :data:`RATE_WINDOW_S` seconds."""
        now = time.monotonic()
        self._samples.append((now, self.records_done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        first_t, first_n = self._samples[0]
        rate = (self.records_done - first_n) / (now - first_t) if now > first_t else 0.0
        return drain_registry.WorkerSample(self.records_done, self.records_failed, self.chunks_embedded, rate)

    async def give_back_left_claims(self) -> int:
        """Release the leases an earlier pass of this worker left (between passes it works on
        nothing, so every lease under its id is stale); returns how many. Raises, and tries again
        at the next pass, while the database is away."""
        if not self.left_claims:
            return 0
        released = await queue.release_all(self.pool, self.id)
        self.left_claims = False
        if released:
            log.info(
                "drain worker %s gave back %d records its interrupted pass had claimed", self.id, released
            )
        return released

    async def heartbeat(self) -> None:
        """Renew the leases of the records this worker is processing and publish its counters."""
        await queue.renew_leases(self.pool, self.lease, sorted(self.holding))
        await drain_registry.heartbeat(self.pool, self.id, self.sample())

    async def _beat(self) -> None:
        interval = self.lease.seconds / 3
        failed = 0  # beats in a row that failed
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never die: a worker without a heartbeat loses its leases
                # The next beat tries again; a lease lost meanwhile is caught by queue.hold.
                failed += 1
                if database_unreachable(exc):
                    log_retry(log, f"drain worker {self.id} heartbeat", exc, failed, interval)
                else:
                    log.exception("drain worker %s heartbeat failed", self.id)
            else:
                failed = 0


def stale_after_s(settings: IngestSettings) -> float:
    """A worker whose heartbeat is older than this is shown as not alive: it missed the
    renewals of a whole lease (it beats every third of one)."""
    return settings.lease_seconds
