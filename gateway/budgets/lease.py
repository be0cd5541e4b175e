"""Leased counting for a principal without a limit: one ledger write per lease, not per call.

A search costs one unit of ``query_embeddings``, and reserving it is a write transaction on the
primary: about half a millisecond of CPU between the gateway and PostgreSQL at 32 callers, every
search of one principal updating the same ledger row, the updates queueing on its lock. A principal
whose meter has no limit (an admin by default, or one given ``mnemo budgets set ... --unlimited``)
is only counted, never refused, so a worker may count ahead: it reserves ``RAG_BUDGET_LEASE`` units
at once (a lease) and hands them to that principal's next calls itself.

The ledger never counts less than was spent:

- a lease's units are in the ledger from the moment it is taken; each call's unit comes out of it;
- unused units go back (one adjustment in the lease's own window) once the lease has been idle
  ``RAG_BUDGET_LEASE_IDLE`` seconds, when its window ends, and when the gateway stops;
- a failed call's unit goes back into the lease (or, the lease gone, to the ledger), as a refund;
- a worker killed while holding a lease leaves its unused units counted (fewer than
  ``RAG_BUDGET_LEASE`` per principal and meter): the safe side, as a settle that cannot reach the
  database.

A principal with a limit is reserved call by call, exactly as before: a lease is taken only after
the ledger answered "no limit" for that principal and meter, and a lease whose answer names a limit
(an operator set one since) keeps only the calling unit and gives the rest back at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.base.errors import ApiError
from gateway.budgets.ledger import Ledger, Reservation, window_of
from index.lru import Lru

__all__ = ["Leases"]

log = logging.getLogger(__name__)

# Principals and meters whose last ledger answer is remembered (limit or none); a forgotten one is
# reserved call by call until the ledger answers again.
KNOWN_PRINCIPALS = 4096


@dataclass
class _Lease:
    taken: Reservation  # the ledger's answer to the lease itself (units = the lease's size)
    remaining: int
    last_used: float  # monotonic seconds


class Leases:
    """One gateway worker's leases, per principal and meter, over ``ledger``."""

    def __init__(
        self, ledger: Ledger, size: int, idle_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if size < 1 or idle_s <= 0:
            raise ValueError(f"leases: size >= 1 and idle_s > 0, not {size}, {idle_s}")
        self.ledger = ledger
        self.size = size
        self.idle_s = idle_s
        self._clock = clock
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._unlimited: Lru[tuple[str, str], bool] = Lru(KNOWN_PRINCIPALS)

    def learn(self, reservation: Reservation) -> None:
        """Remember whether the ledger's answer named a limit for its principal and meter."""
        self._unlimited.put((reservation.principal, reservation.meter), reservation.limit is None)

    def may_lease(self, principal: str, meter: str, units: int) -> bool:
        """Whether a call's ``units`` may come from a lease: one unit, of a principal and meter the
        ledger last answered with no limit, leases on (``RAG_BUDGET_LEASE`` > 1)."""
        return self.size > 1 and units == 1 and self._unlimited.get((principal, meter)) is True

    def take(self, principal: str, meter: str) -> Reservation | None:
        """One unit from the principal's lease of ``meter`` in the current window; None: none left."""
        lease = self._leases.get((principal, meter))
        if lease is None or lease.remaining < 1:
            return None
        start, _ = window_of(self.ledger.clock(), self.ledger.window_s)
        if lease.taken.window_start != start:
            return None  # the window ended: the idle sweep gives the rest back to its own window
        lease.remaining -= 1
        lease.last_used = self._clock()
        return self._unit(lease.taken, lease.remaining)

    async def grant(self, principal: str, role: str, meter: str) -> Reservation | None:
        """A new lease of ``meter`` for ``principal``, with this call's unit out of it; None when the
        ledger refused the lease (a limit set since, too close): the caller reserves its one unit."""
        key = (principal, meter)
        try:
            taken = await self.ledger.reserve(principal, role, meter, self.size)
        except ApiError as exc:
            if exc.code != "budget_exhausted":
                raise
            self._unlimited.put(key, False)
            return None
        if taken.limit is not None:  # an operator set a limit since: keep this call's unit only
            self._unlimited.put(key, False)
            await self.ledger.adjust(taken, -(self.size - 1))
            return dataclasses.replace(taken, units=1, used=taken.used - (self.size - 1))
        earlier = self._leases.get(key)
        self._leases[key] = _Lease(taken, self.size - 1, self._clock())
        if earlier is not None:  # a call beside this one took a lease too, or the window ended
            await self._give_back(earlier)
        return self._unit(taken, self.size - 1)

    def give_back_unit(self, reservation: Reservation) -> bool:
        """A failed call's leased unit back into its lease; False when that lease is gone (the
        caller refunds it in the ledger)."""
        lease = self._leases.get((reservation.principal, reservation.meter))
        if lease is None or lease.taken.window_start != reservation.window_start:
            return False
        lease.remaining += 1
        return True

    async def return_idle(self, *, everything: bool = False) -> int:
        """Give back the unused units of every lease idle ``idle_s`` or more, or whose window ended
        (``everything``: of every lease, as the gateway stops); the units given back."""
        now, epoch = self._clock(), self.ledger.clock()
        done = [
            key
            for key, lease in self._leases.items()
            if everything
            or now - lease.last_used >= self.idle_s
            or lease.taken.window_end.timestamp() <= epoch
        ]
        returned = 0
        for key in done:
            returned += await self._give_back(self._leases.pop(key))
        return returned

    async def _give_back(self, lease: _Lease) -> int:
        units, lease.remaining = lease.remaining, 0
        if units:
            await self.ledger.adjust(lease.taken, -units)
        return units

    @staticmethod
    def _unit(taken: Reservation, remaining: int) -> Reservation:
        """One call's unit of a lease: ``used`` as the ledger would say had the call reserved alone."""
        return dataclasses.replace(taken, units=1, used=taken.used - remaining, leased=True)
