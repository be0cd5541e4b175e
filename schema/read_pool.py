"""The retrieval read pool: a streaming replica when one is configured and fresh, the primary otherwise.

``RAG_DATABASE_READ_URL`` names a hot standby. :class:`ReadPool` stands where the gateway's retrieval
pool stood (the asyncpg methods retrieval uses: ``acquire``, ``fetch``, ``fetchrow``, ``fetchval``,
``execute``) and routes each read:

- to the replica while a background check (every ``RAG_READ_CHECK_INTERVAL`` seconds) finds it
  reachable and no more than ``RAG_READ_MAX_LAG`` seconds behind the primary. Lag is 0 when the
  replica has replayed the primary's current WAL position, else the age of its last replayed
  transaction (conservative: a replica catching up after a quiet spell reads as lagging for a moment);
- to the primary otherwise. Every read sent to the primary while a replica is configured is counted
  (``fallbacks``), so a replica that is silently unused shows on ``/metrics`` and ``/readyz``.

A replica that goes down mid-read (its connection cut) is marked unusable at once. A single
statement (``fetch`` and friends) is re-run on the primary here; a caller holding a connection from
:meth:`ReadPool.acquire` gets :class:`ReplicaLost` and re-runs its read, which then goes to the primary
(the gateway's dispatcher does this for every read action), so a stopped replica never fails a search.
Writes, the queue, sections and read-your-writes routes never come here: they use the primary pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from .database import CONNECTION_ERRORS, create_pool

__all__ = ["ReadPool", "ReplicaLost", "ReplicaStatus", "replica_lost"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_LAG_SQL = """
SELECT pg_is_in_recovery() AS in_recovery,
       pg_wal_lsn_diff($1::text::pg_lsn, pg_last_wal_replay_lsn()) AS behind_bytes,
       extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 AS replay_age_s
"""


class ReplicaLost(Exception):
    """The replica's connection was lost during a read; re-run the read (it now goes to the primary)."""


def replica_lost(exc: BaseException) -> bool:
    """``exc`` is, or a task group's exception group holds, a :class:`ReplicaLost`."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(ReplicaLost) is not None
    return isinstance(exc, ReplicaLost)


@dataclass(frozen=True)
class ReplicaStatus:
    """What ``/readyz`` shows of the read replica."""

    configured: bool
    in_use: bool = False
    lag_s: float | None = None
    max_lag_s: float | None = None
    fallbacks: int = 0
    replica_reads: int = 0
    error: str | None = None
    checked_s_ago: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


class ReadPool:
    """Routes retrieval reads to a fresh replica, or to the primary's read pool."""

    def __init__(
        self,
        primary: asyncpg.Pool,
        replica_url: str | None = None,
        *,
        max_size: int = 10,
        session: Mapping[str, str] | None = None,
        max_lag_s: float = 10.0,
        check_interval_s: float = 1.0,
    ) -> None:
        self.primary = primary
        self.replica_url = replica_url
        self.max_size = max_size
        self.session = dict(session or {})  # the replica pool's session settings, as the primary's
        self.max_lag_s = max_lag_s
        self.check_interval_s = check_interval_s
        self._replica: asyncpg.Pool | None = None
        self._in_use = False
        self._lag_s: float | None = None
        self._error: str | None = None
        self._checked_at: float | None = None
        self.fallbacks = 0
        self.replica_reads = 0
        self._monitor: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """First check now (a fresh replica serves from the first request), then in the background."""
        if self.replica_url is None:
            return
        await self.check()
        self._monitor = asyncio.create_task(self._watch(), name="read-replica-monitor")

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        if self._replica is not None:
            await self._replica.close()
        await self.primary.close()

    # -- health ----------------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            await self.check()

    async def check(self) -> ReplicaStatus:
        """Measure the replica's lag behind the primary and decide whether reads go to it."""
        try:
            position = await self.primary.fetchval("SELECT pg_current_wal_lsn()::text", timeout=5)
            if self._replica is None:
                self._replica = await create_pool(
                    self.replica_url or "",
                    max_size=self.max_size,
                    min_size=0,
                    reset_session=False,
                    session=self.session,
                )
            row = await self._replica.fetchrow(_LAG_SQL, position, timeout=5)
            assert row is not None
            if not row["in_recovery"] or row["behind_bytes"] <= 0:
                lag = 0.0  # caught up (or not a standby at all: then it is the primary itself)
            else:
                lag = row["replay_age_s"] if row["replay_age_s"] is not None else math.inf
            was = self._in_use
            self._lag_s, self._error = lag, None
            self._in_use = lag <= self.max_lag_s
            if was != self._in_use:
                log.warning(
                    "read replica %s (lag %.2f s)", "in use" if self._in_use else "too far behind", lag
                )
        except Exception as exc:  # down, starting, unreachable: reads go to the primary meanwhile
            self._mark_down(exc)
        self._checked_at = time.monotonic()
        return self.status()

    def _mark_down(self, exc: BaseException) -> None:
        if self._in_use:
            log.warning("read replica unusable, reading from the primary: %s", exc)
        self._in_use, self._lag_s, self._error = False, None, f"{type(exc).__name__}: {exc}"

    def status(self) -> ReplicaStatus:
        if self.replica_url is None:
            return ReplicaStatus(configured=False)
        ago = None if self._checked_at is None else time.monotonic() - self._checked_at
        return ReplicaStatus(
            True,
            self._in_use,
            self._lag_s,
            self.max_lag_s,
            self.fallbacks,
            self.replica_reads,
            self._error,
            ago,
        )

    # -- reads -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one read: the replica's when it is in use, else the primary's."""
        replica = self._replica if self._in_use else None
        if replica is not None:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(replica.acquire())
                except CONNECTION_ERRORS as exc:
                    self._mark_down(exc)
                else:
                    self.replica_reads += 1
                    try:
                        yield conn
                    except CONNECTION_ERRORS as exc:
                        self._mark_down(exc)
                        raise ReplicaLost(str(exc)) from exc
                    return
        if self.replica_url is not None:
            self.fallbacks += 1
        async with self.primary.acquire() as conn:
            yield conn

    async def _read(self, call: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        try:
            async with self.acquire() as conn:
                return await call(conn)
        except ReplicaLost:  # one statement: re-run it, now on the primary
            async with self.acquire() as conn:
                return await call(conn)

    # asyncpg's signatures (keyword options such as ``timeout`` or ``column`` pass through).
    async def fetch(self, query: str, *args: Any, **options: Any) -> list[asyncpg.Record]:
        return await self._read(lambda conn: conn.fetch(query, *args, **options))

    async def fetchrow(self, query: str, *args: Any, **options: Any) -> asyncpg.Record | None:
        return await self._read(lambda conn: conn.fetchrow(query, *args, **options))

    async def fetchval(self, query: str, *args: Any, **options: Any) -> Any:
        return await self._read(lambda conn: conn.fetchval(query, *args, **options))

    async def execute(self, query: str, *args: Any, **options: Any) -> str:
        return await self._read(lambda conn: conn.execute(query, *args, **options))
