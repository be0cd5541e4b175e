"""Fairness: a per-principal token bucket and in-flight bound in front of the sidecar and the language model.

Every metered action (they are the ones that call the sidecar or the language model) passes
:meth:`FairLimiter.acquire` first, so a flooding principal is shed with its own 429 ``rate_limited``
while other principals' calls go through untouched. It lives in the gateway's process: each worker
of ``mnemo gateway --workers N`` holds its own buckets with 1/N of the settings
(:meth:`gateway.budgets.ledger.Budgets.configured`); the budgets in :mod:`gateway.budgets.ledger` are the
database's and exact across workers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.base.errors import ApiError

__all__ = ["FairLimiter"]


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0


class FairLimiter:
    """Per-principal token bucket (``rate``/s, ``burst``) and in-flight bound (``concurrency``).

    In-memory, one event loop: no locks needed. A principal's state is forgotten once it has nothing
    in flight and its bucket has refilled (at its last release, or by :meth:`prune` once the map
    holds :data:`PRUNE_AT` principals), so the map holds only recently active principals.
    """

    PRUNE_AT = 4096

    def __init__(
        self, rate: float, burst: int, concurrency: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self.concurrency = rate, burst, concurrency
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    @property
    def active(self) -> int:
        return len(self._buckets)

    def acquire(self, key: str) -> None:
        """Admit one call for ``key`` or raise 429 ``rate_limited`` (with how long to wait)."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None and len(self._buckets) >= self.PRUNE_AT:
            self.prune()
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        elif self.rate > 0:
            bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
        if self.concurrency and bucket.in_flight >= self.concurrency:
            raise ApiError(
                "rate_limited",
                f"This principal already has {bucket.in_flight} calls in flight (the most allowed)",
                retry_after=1,
            )
        if self.rate > 0:
            if bucket.tokens < 1.0:
                wait = max(1, math.ceil((1.0 - bucket.tokens) / self.rate))
                raise ApiError(
                    "rate_limited", f"This principal is above {self.rate:g} calls/s", retry_after=wait
                )
            bucket.tokens -= 1.0
        bucket.in_flight += 1

    def release(self, key: str) -> None:
        bucket = self._buckets[key]
        bucket.in_flight -= 1
        if self._idle(bucket, self._clock()):
            del self._buckets[key]

    def prune(self) -> None:
        """Forget every principal with nothing in flight and a full bucket (it would start afresh)."""
        now = self._clock()
        for key in [k for k, b in self._buckets.items() if self._idle(b, now)]:
            del self._buckets[key]

    def _idle(self, bucket: _Bucket, now: float) -> bool:
        full = self.rate <= 0 or bucket.tokens + (now - bucket.stamp) * self.rate >= self.burst
        return bucket.in_flight == 0 and full
