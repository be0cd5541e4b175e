"""What every in-process index beside the store shares: load each partition, then follow the feed.

The FAISS cache (:mod:`index.vectors.cache`) and the Tantivy index its writer keeps
(:mod:`index.lexical.writer`) are both derived copies of the store's partitions, rebuilt from it
alone and kept current by the change feed (:mod:`index.store.change_feed`). :class:`FeedFollower` is that
lifecycle, once: start loads every partition in the background (a failed load is logged and
marked, and the SQL leg serves that partition), then a follower applies the feed on every
notification, after every reconnect, and every ``poll_s`` regardless; a failed apply is retried and
the answers stay exact meanwhile (each search re-reads the keys changed after its partition's
watermark).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import asyncpg

from index.retry_log import log_retry
from index.store.change_feed import ChangeListener
from index.store.partitions import ModelPartition, list_partitions

log = logging.getLogger(__name__)

__all__ = ["FeedFollower"]

# What a load or an apply may fail with and be retried (or left to the SQL leg) instead of crashing.
# InternalClientError: asyncpg's "another operation is in progress" on a pooled connection that a
# server restart cut mid-query (a loaded suite run killed the follower with it).
RETRYABLE = (
    OSError,
    ValueError,
    RuntimeError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


SYNC_RETRY_S = 0.5  # a failed sync is tried again this much later


class FeedFollower(ABC):
    """Loads every partition and follows the change feed; subclasses say how to load and apply."""

    label = "index"  # in log lines: "faiss cache", "lexical index"
    serves = "the SQL leg"  # what answers for a partition this index does not hold
    states: tuple[str, ...] = ("loading", "ready", "failed")  # a held partition's states
    metrics: Any  # the subclass's metrics, with a ``partitions`` gauge by state

    def __init__(self, pool: asyncpg.Pool, database_url: str, poll_s: float) -> None:
        self.pool = pool
        self.database_url = database_url
        self.poll_s = poll_s
        self.partitions: dict[str, Any] = {}
        self.listener: ChangeListener | None = None
        self._wake = asyncio.Event()
        self._dirty: set[str | None] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._lag_since: float | None = None  # first unapplied notification

    @property
    @abstractmethod
    def enabled(self) -> bool: ...

    @abstractmethod
    async def load(self, partition: ModelPartition) -> Any:
        """Build a partition's copy from the store."""

    @abstractmethod
    async def sync(self, models: Iterable[str] | None = None) -> int:
        """Apply the feed to the partitions of ``models`` (None: all); returns the keys applied."""

    def _set_state(self, held: Any, state: str) -> None:
        """Set a held partition's state and the per-state partition gauge (``metrics.partitions``)."""
        held.state = state
        for s in self.states:
            self.metrics.partitions.labels(s).set(sum(p.state == s for p in self.partitions.values()))

    async def start(self, *, listen: bool = True) -> None:
        """Start loading every partition in the background and following the feed (returns at once)."""
        if not self.enabled:
            return
        if listen:
            self.listener = ChangeListener(self.database_url, self.notify)
            self.listener.start()
        self._tasks.append(asyncio.create_task(self._load_all(), name=f"{self.label}-load"))

    async def stop(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def stop_listening(self) -> None:
        """Stop following the feed (the index keeps serving, correct but increasingly behind)."""
        if self.listener is not None:
            await self.listener.stop()
            self.listener = None
        for task in self._tasks[1:]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        del self._tasks[1:]

    def notify(self, model: str | None) -> None:
        """A change was committed (``model``), or anything may have been missed (None)."""
        if self._lag_since is None:
            self._lag_since = time.monotonic()
        self._dirty.add(model)
        self._wake.set()

    async def _load_all(self) -> None:
        for partition in await list_partitions(self.pool):
            if partition.partition not in self.partitions:  # one loaded before start() stays as it is
                await self._load_logged(partition)
        self._tasks.append(asyncio.create_task(self._follow(), name=f"{self.label}-sync"))

    async def _load_logged(self, partition: ModelPartition) -> None:
        """Load one partition; a failure is logged and the partition marked failed (the SQL leg serves it)."""
        try:
            await self.load(partition)
        except RETRYABLE:
            log.exception("%s: loading %s failed; %s serves it", self.label, partition.partition, self.serves)
            held = self.partitions.get(partition.partition)
            if held is not None:
                self._set_state(held, "failed")

    async def _load_new(self, models: Iterable[str]) -> None:
        """Load the partitions of ``models`` that are not held yet (first seen after start)."""
        known = {held.partition.model for held in self.partitions.values()}
        missing = set(models) - known
        if missing:
            for partition in await list_partitions(self.pool):
                if partition.model in missing:
                    await self._load_logged(partition)

    async def _follow(self) -> None:
        """Apply the feed: on every notification, after reconnects, and every ``poll_s`` regardless."""
        failed = 0  # syncs in a row that failed
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            try:
                await self.sync(None if None in dirty or not dirty else {m for m in dirty if m is not None})
            except Exception as exc:
                # Answers stay exact meanwhile (each search re-reads the pending keys); the lag shows.
                # Anything else is logged with its traceback, and the follower still lives on: a
                # dead follower would leave the index behind with nothing to say so.
                failed += 1
                if isinstance(exc, RETRYABLE):
                    log_retry(log, f"{self.label} sync", exc, failed, SYNC_RETRY_S)
                else:
                    log.exception("%s: sync failed unexpectedly; retrying", self.label)
                self._dirty |= dirty or {None}
                await asyncio.sleep(SYNC_RETRY_S)
                self._wake.set()
            else:
                failed = 0
