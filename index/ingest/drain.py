"""Draining the ingestion queue with workers: :func:`drain_once` (one worker's pass),
:func:`drain_parallel` (several at once) and :class:`DrainLoop` (forever).

A :class:`DrainWorker` is one claimant of the queue: it leases ready records
(``FOR UPDATE SKIP LOCKED``, see :mod:`index.ingest.queue`), indexes them and renews
its leases with a heartbeat. Any number of workers, in one process (``mnemo
drain --workers N``), in several, on several hosts, and the gateway's own drain,
share the queue: no lock serializes them, and a record is leased to one worker
at a time. A worker killed with ``kill -9`` stops renewing; once its leases
expire, the next claim of any worker takes its records. A live worker whose pass
was interrupted (the database restarted under it) gives its own stale leases
back at the start of its next pass, so an outage of seconds delays its records
by seconds, not by ``lease_seconds``.

A pass claims batches until none is ready. Inside a worker, batches are
pipelined: while batch *n*'s records are written, batch *n+1* is claimed,
chunked and embedded, so the sidecar and the store work at the same time. Per
record, the store write and the queue completion share one transaction that
first checks the lease is still this worker's: a killed pass leaves the
record's rows as they were and the record queued, and a worker whose lease was
taken over writes nothing. A record that fails spends an attempt (backoff,
then parked); a sidecar outage spends none: the pass stops, the records keep
the error, and the loop pauses before it tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg

from index.ingest import drain_registry, queue
from index.ingest.drain_pass import DrainReport, drain_once, drain_parallel
from index.ingest.drain_worker import DrainWorker, stale_after_s
from index.ingest.metrics import IngestMetrics
from index.retry_log import log_retry
from index.settings import IngestSettings, MediaSettings
from inference.client import SidecarClient
from schema.database import database_unreachable

# The pass (index.ingest.drain_pass) and the worker (index.ingest.drain_worker) live in their own modules; they
# are named here too, so callers import the whole drain from this one module.
__all__ = ["DrainLoop", "DrainReport", "DrainWorker", "drain_once", "drain_parallel", "stale_after_s"]

log = logging.getLogger(__name__)

# A crashed loop restarts after DRAIN_RESTART_BASE_S * 2^(crashes - 1) seconds, at most the cap.
DRAIN_RESTART_BASE_S = 1.0
DRAIN_RESTART_CAP_S = 60.0


class DrainLoop:
    """The background drain: a pass of its ``workers`` (default ``RAG_INGEST_DRAIN_WORKERS``)
    every ``drain_interval`` seconds (or at once when woken), paused for ``outage_pause``
    seconds after a sidecar outage. Its workers stay registered, heartbeating, for as long as
    :meth:`run` runs. It never dies on an error: the error is logged, kept in :meth:`status`
    and the next pass tries again."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        client: SidecarClient,
        settings: IngestSettings,
        *,
        text_model: str | None = None,
        image_model: str | None = None,
        media: MediaSettings | None = None,
        metrics: IngestMetrics | None = None,
        workers: int | None = None,
        role: str = "drain",
    ) -> None:
        self.pool = pool
        self.workers = settings.drain_workers if workers is None else workers
        if self.workers < 1:
            raise ValueError(f"a drain loop needs at least one worker, not {self.workers}")
        self.role = role
        self._workers: list[DrainWorker] | None = None  # while run() holds them
        self.client = client
        self.settings = settings
        self.text_model = text_model
        self.image_model = image_model
        self.media = media
        self.metrics = metrics or IngestMetrics()
        self._wake = asyncio.Event()
        self.last_report: DrainReport | None = None
        self.last_error: str | None = None
        # As the last pass that asked the sidecar found it: a pass that claimed nothing (records
        # waiting out an outage pause) must not report it back (the metric follows the same rule).
        self.sidecar_available = True
        self.last_pass_at: datetime | None = None
        self.paused_until: datetime | None = None
        self.passes = 0
        self.outages = 0  # passes in a row stopped by an outage (the database's or the sidecar's)
        self.claims_given_back = 0  # over every pass (DrainReport.claims_given_back)
        self.crashes = 0
        self.last_crash: str | None = None
        self.restart_at: datetime | None = None  # set while a crashed loop waits to restart

    def wake(self) -> None:
        """Start the next pass now (intake calls this after enqueueing)."""
        self._wake.set()

    def status(self) -> dict[str, Any]:
        """For health and ``/v1/queue/stats``: is the drain paused by an outage, and why."""
        paused = self.paused_until is not None and self.paused_until > datetime.now(UTC)
        state = "crashed" if self.restart_at is not None else "paused" if paused else "running"
        return {
            "state": state,
            "crashes": self.crashes,
            "last_crash": self.last_crash,
            "restart_at": self.restart_at.isoformat() if self.restart_at else None,
            "sidecar_available": self.sidecar_available,
            "paused_until": self.paused_until.isoformat() if paused and self.paused_until else None,
            "last_error": self.last_error,
            "last_pass_at": self.last_pass_at.isoformat() if self.last_pass_at else None,
            "passes": self.passes,
            "workers": [w.id for w in self._workers or ()],
        }

    async def pass_once(self) -> DrainReport:
        """One drain pass of every worker (:meth:`drain`), its error kept instead of raised,
        then refresh the queue and worker gauges."""
        try:
            report = await self.drain()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            if database_unreachable(exc):  # restarting or away: retried (_run logs it), no one's bug
                report = DrainReport(error=f"the database did not answer ({type(exc).__name__}: {exc})")
            else:
                log.exception("drain pass failed")
                report = DrainReport(error=f"{type(exc).__name__}: {exc}")
        self.passes += 1
        self.claims_given_back += report.claims_given_back
        self.last_report = report
        self.last_pass_at = datetime.now(UTC)
        if report.sidecar_seen is not None:
            self.sidecar_available = report.sidecar_seen
        if report.error or report.processed:  # an empty pass keeps the last pass's error on show
            self.last_error = report.error
        self.metrics.observe_report(report)
        with contextlib.suppress(Exception):
            self.metrics.observe_stats(await queue.stats(self.pool, self.settings.max_attempts))
            self.metrics.observe_workers(
                await drain_registry.list_workers(self.pool, stale_after_s=stale_after_s(self.settings))
            )
        return report

    async def drain(self) -> DrainReport:
        """One pass of every worker until no record is ready (errors raise, as for
        :func:`drain_parallel`). Outside :meth:`run`, the workers are registered for this
        pass alone (``mnemo drain --once``)."""
        async with contextlib.AsyncExitStack() as stack:
            return await drain_parallel(
                self.pool,
                self.client,
                self.settings,
                self._workers or await self._start_workers(stack),
                text_model=self.text_model,
                image_model=self.image_model,
                media=self.media,
            )

    async def _start_workers(self, stack: contextlib.AsyncExitStack) -> list[DrainWorker]:
        return [
            await stack.enter_async_context(DrainWorker(self.pool, self.settings, role=self.role, index=i))
            for i in range(self.workers)
        ]

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Drain until cancelled (or ``stop`` is set)."""
        stop = stop or asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            self._workers = await self._start_workers(stack)
            try:
                await self._run(stop)
            finally:
                self._workers = None

    async def _run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            report = await self.pass_once()
            if report.unavailable or (report.error and not report.processed):
                delay = self.settings.outage_pause
                self.outages += 1
                log_retry(log, "drain pass", report.error, self.outages, delay)
                self.paused_until = datetime.fromtimestamp(time.time() + delay, UTC)
                await _sleep_or(stop, delay)  # new records do not end an outage pause
            else:
                if self.outages:
                    log.info("drain: a pass ran again after %d failed", self.outages)
                    self.outages = 0
                self.paused_until = None
                await _sleep_or(stop, self.settings.drain_interval, self._wake)

    async def supervise(self, stop: asyncio.Event | None = None) -> None:
        """:meth:`run`, restarted with exponential backoff when it dies of an unexpected error.

        A pass's own errors never end :meth:`run`; this catches what would (a bug, a failing
        metrics call) so that a dead drain is visible (``status()``, ``/readyz``, the
        ``mnemo_ingest_drain_*`` metrics) and comes back by itself instead of silently
        leaving records queued until the gateway restarts.
        """
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.run(stop)
                return
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:
                self.crashes += 1
                self.last_crash = f"{type(exc).__name__}: {exc}"
                delay = min(DRAIN_RESTART_BASE_S * 2 ** (self.crashes - 1), DRAIN_RESTART_CAP_S)
                log.exception("the drain loop crashed (%d so far); restarting in %.0fs", self.crashes, delay)
                self.restart_at = datetime.fromtimestamp(time.time() + delay, UTC)
                self.metrics.observe_crash()
                try:
                    await _sleep_or(stop, delay)
                finally:
                    self.restart_at = None
                    self.metrics.observe_restart()


async def _sleep_or(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    events = [stop] + ([wake] if wake is not None else [])
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
