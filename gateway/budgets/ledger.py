"""Per-principal budgets and fairness: a ledger in PostgreSQL, reserve before spending, settle after.

One module for the whole of it, so that a call's path through its budget stays in one place:
:class:`Ledger` (the table and its statements), :class:`Leases` (a principal without a limit
counted one ledger write per lease), :class:`Budgets` and :class:`Metering` (one call: the fairness
limiter, then its reservations, settled or refunded), and the ask generation's hold and settle.

What is metered (:data:`METERS`): ``ask`` runs, the language model's prompt and
completion tokens (the provider's reported usage; the extractive provider's are
estimated the same way the context budget is), query embeddings (text and
image), and the input tokens of the gateway's ``POST /v1/embeddings``
(:mod:`gateway.web.embeddings`, settled to the sidecar's reported usage). Each principal (the token's ``sub``) has, per meter and per window (a
UTC day by default, ``RAG_BUDGET_WINDOW``), the limit of its role
(``RAG_BUDGET_LIMITS``) unless ``mnemo budgets set`` gave it its own.

The rules, which :mod:`tests.test_budgets` checks as properties:

- **reserve** ``n`` units is one statement (``INSERT ... ON CONFLICT DO UPDATE
  SET used = used + n WHERE used + n <= limit``): it succeeds whole or not at
  all, so concurrent callers can never push ``used`` past the limit;
- **settle** a reservation with what the call really used: the difference is
  refunded (a shorter answer) or charged (a provider reporting more than its
  estimate; that one charge is not capped, the ledger records the truth);
- **refund** everything a call reserved when it fails: a caller pays for
  answers, not for the service's failures;
- a refund lands in the window the units were reserved in, so a call that
  straddles midnight cannot mint units in the new window.

Failing closed: a metered action whose reservation cannot reach the database
fails with the gateway's coded 503 (``service.unavailable``, the same code an
unreachable database gives every route); unmetered reads (``read_chunk``,
``embed_groups``) never touch the ledger. A settle that cannot reach the
database after a served call leaves the reservation charged (the safe side),
with a warning and ``mnemo_budget_ledger_errors``.

Fairness (:class:`gateway.budgets.fairness.FairLimiter`) sheds a flooding principal with its own
429s before any metered call; the admin routes are :mod:`gateway.budgets.routes`.

**Leases** (:class:`Leases`): a principal without a limit is counted one ledger write per lease, not
one per call.

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

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aiohttp import web

from gateway.access.auth import Principal
from gateway.base.budget_settings import METERS, ROLES, BudgetSettings
from gateway.base.errors import ApiError
from gateway.base.metrics import Metrics
from gateway.budgets.fairness import FairLimiter
from index.beside import running_beside
from index.lru import Lru
from schema.database import database_unreachable

__all__ = [
    "ASK_GRANT",
    "BUDGETS_KEY",
    "METERS",
    "ROLES",
    "Budgets",
    "GenerationHold",
    "Leases",
    "Ledger",
    "Metering",
    "Reservation",
    "exhausted",
    "hold_generation",
    "metered",
    "role_of",
    "settle_generation",
    "window_of",
]

log = logging.getLogger(__name__)

ASK_GRANT = "ask"  # the value of the token's ``grants`` claim that lets a non-admin call ``ask``


def role_of(principal: Principal) -> str:
    """The role whose default limits apply: ``admin`` for admin tokens, else ``user``."""
    return "admin" if principal.admin else "user"


def window_of(now: float, window_s: int) -> tuple[datetime, datetime]:
    """(start, end) of the window holding ``now`` (epoch seconds): aligned to the UTC epoch, so a
    window of 86400 s is the UTC day."""
    start = math.floor(now / window_s) * window_s
    return datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(start + window_s, UTC)


@dataclass(frozen=True)
class Reservation:
    """Units taken from one meter's budget in one window; ``used``/``limit`` as the ledger answered."""

    principal: str
    role: str
    meter: str
    units: int
    window_start: datetime
    window_end: datetime
    used: int
    limit: int | None  # None: unlimited (counted only)
    leased: bool = False  # one unit of a worker's lease (:class:`Leases`), not reserved alone

    def adjusted(self, units: int, used: int, *, leased: bool | None = None) -> Reservation:
        """This reservation with ``units`` and ``used`` in place of its own (a settle's correction,
        a lease's single unit)."""
        return Reservation(
            self.principal, self.role, self.meter, units, self.window_start, self.window_end, used, self.limit,
            self.leased if leased is None else leased,
        )  # fmt: skip


# The reservation: one statement. The limit is the principal's override when it has one (NULL there:
# unlimited), else the role's default ($5, NULL: unlimited). A first reservation inserts the row only
# when n itself fits; later ones add n only while used + n stays within the limit. Refused: no row.
_RESERVE = """
WITH lim AS (
    SELECT CASE WHEN o.principal IS NULL THEN $5::bigint ELSE o.max_units END AS max_units
    FROM (SELECT 1) AS one
    LEFT JOIN rag_budget_overrides o ON o.principal = $1 AND o.meter = $2
)
INSERT INTO rag_budget_ledger AS l (principal, meter, window_start, used, role)
SELECT $1, $2, $3, $4, $6 FROM lim WHERE lim.max_units IS NULL OR $4 <= lim.max_units
ON CONFLICT (principal, meter, window_start) DO UPDATE
    SET used = l.used + EXCLUDED.used, role = EXCLUDED.role, updated_at = now()
    WHERE (SELECT max_units FROM lim) IS NULL OR l.used + EXCLUDED.used <= (SELECT max_units FROM lim)
RETURNING l.used, (SELECT max_units FROM lim) AS max_units
"""
# What a refused reservation reports: the use so far and the limit that refused it.
_STANDING = """
SELECT COALESCE((SELECT used FROM rag_budget_ledger
                 WHERE principal = $1 AND meter = $2 AND window_start = $3), 0) AS used,
       CASE WHEN o.principal IS NULL THEN $4::bigint ELSE o.max_units END AS max_units
FROM (SELECT 1) AS one
LEFT JOIN rag_budget_overrides o ON o.principal = $1 AND o.meter = $2
"""
# Settle: a signed adjustment of the reserved window's row (negative: refund), never below zero.
_ADJUST = """
UPDATE rag_budget_ledger SET used = GREATEST(used + $4, 0), updated_at = now()
WHERE principal = $1 AND meter = $2 AND window_start = $3
"""


class Ledger:
    """The budget ledger (``rag_budget_ledger``) and the per-principal overrides."""

    def __init__(
        self, pool: asyncpg.Pool, settings: BudgetSettings, clock: Callable[[], float] = time.time
    ) -> None:
        self._pool = pool
        self.window_s = settings.window
        self.role_limits = settings.role_limits
        self.clock = clock  # epoch seconds: windows are UTC (a test moves it across windows)

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool the ledger writes through (the gateway's: its own, see ``gateway.web.app``)."""
        return self._pool

    def default_limit(self, role: str, meter: str) -> int | None:
        return self.role_limits.get((role, meter))

    async def reserve(self, principal: str, role: str, meter: str, units: int) -> Reservation:
        """Take ``units`` of ``meter``, or raise 429 ``budget_exhausted`` (nothing taken)."""
        if meter not in METERS or units < 0:
            raise ValueError(f"reserve: meter {meter!r}, units {units}")  # a programming error
        now = self.clock()
        start, end = window_of(now, self.window_s)
        default = self.default_limit(role, meter)
        row = await self._pool.fetchrow(_RESERVE, principal, meter, start, units, default, role)
        if row is not None:
            return Reservation(principal, role, meter, units, start, end, row["used"], row["max_units"])
        standing = await self._pool.fetchrow(_STANDING, principal, meter, start, default)
        raise exhausted(meter, standing["used"], standing["max_units"], end, now)

    async def adjust(self, reservation: Reservation, delta: int) -> None:
        """Add ``delta`` (negative: refund) to the reservation's own window."""
        if delta:
            await self._pool.execute(
                _ADJUST, reservation.principal, reservation.meter, reservation.window_start, delta
            )


def exhausted(meter: str, used: int, limit: int | None, reset_at: datetime, now: float) -> ApiError:
    """429 ``budget_exhausted``: which meter, its use and limit, and when the window resets."""
    wait = max(1, math.ceil(reset_at.timestamp() - now))
    return ApiError(
        "budget_exhausted",
        f"The {meter} budget of this window is spent ({used} of {limit}); it resets at {reset_at.isoformat()}",
        retry_after=wait,
        details={"meter": meter, "used": used, "limit": limit, "reset_at": reset_at.isoformat()},
    )


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
            return self._unit(taken, self.size - 1, leased=False)
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
    def _unit(taken: Reservation, remaining: int, *, leased: bool = True) -> Reservation:
        """One call's unit of a lease: ``used`` as the ledger would say had the call reserved alone."""
        return taken.adjusted(1, taken.used - remaining, leased=leased)


# -- one call's metering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budgets:
    """The app's budget services: the ledger, the limiter and the settings they follow."""

    settings: BudgetSettings
    ledger: Ledger
    limiter: FairLimiter
    metrics: Metrics
    leases: Leases

    @classmethod
    def configured(
        cls,
        pool: asyncpg.Pool,
        settings: BudgetSettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        *,
        workers: int = 1,
    ) -> Budgets:
        """``workers``: the processes serving the port, each holding ``1/workers`` of every
        principal's rate, burst and in-flight bound (rounded up), so ``RAG_FAIR_*`` are per gateway.
        A flood's many connections spread over the workers; one caller's single connection stays
        on one worker and gets that worker's share (a share, never more than the whole)."""
        limiter = FairLimiter(
            settings.fair_rate / workers,
            math.ceil(settings.fair_burst / workers),
            math.ceil(settings.fair_concurrency / workers),
        )
        ledger = Ledger(pool, settings, clock)
        return cls(settings, ledger, limiter, metrics, Leases(ledger, settings.lease, settings.lease_idle))

    async def return_idle_leases(self, *, everything: bool = False) -> None:
        """:meth:`Leases.return_idle`, a ledger that cannot be reached logged and counted like a
        settle's (the units stay charged: the safe side)."""
        try:
            await self.leases.return_idle(everything=everything)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            self.metrics.budget_ledger_errors.labels("settle").inc()
            log.warning("budget: could not give back leased units: %s", exc)

    @contextlib.asynccontextmanager
    async def leases_returned(self) -> AsyncIterator[None]:
        """While open, idle leases are given back every half ``RAG_BUDGET_LEASE_IDLE``; on exit,
        every lease (the gateway stops)."""

        async def sweep() -> None:
            while True:
                await asyncio.sleep(self.leases.idle_s / 2)
                await self.return_idle_leases()

        try:
            async with running_beside(sweep, "budget-leases"):
                yield
        finally:
            await self.return_idle_leases(everything=True)

    def limited(self, principal: Principal) -> bool:
        """Whether the fairness limiter applies: not to admins (unless ``RAG_FAIR_ADMINS``), never to
        the principals ``RAG_FAIR_EXEMPT`` names."""
        if principal.sub in self.settings.fair_exempt:
            return False
        return self.settings.fair_admins or not principal.admin


BUDGETS_KEY: web.AppKey[Budgets] = web.AppKey("budgets", Budgets)


@dataclass
class Metering:
    """One call's reservations. Reserve before spending, settle with what was used; a failed call
    is refunded whole (:meth:`refund_all`)."""

    budgets: Budgets
    principal: Principal
    reservations: list[Reservation] = field(default_factory=list)

    @property
    def role(self) -> str:
        return role_of(self.principal)

    async def reserve(self, meter: str, units: int) -> Reservation | None:
        """Take ``units`` of ``meter`` (None with budgets off); 429 ``budget_exhausted`` past the limit."""
        if not self.budgets.settings.enabled:
            return None
        budgets, sub = self.budgets, self.principal.sub
        metrics = budgets.metrics
        try:
            reservation = None
            if budgets.leases.may_lease(sub, meter, units):
                reservation = budgets.leases.take(sub, meter) or await budgets.leases.grant(
                    sub, self.role, meter
                )
            if reservation is None:
                reservation = await budgets.ledger.reserve(sub, self.role, meter, units)
                budgets.leases.learn(reservation)
        except ApiError as exc:
            if exc.code == "budget_exhausted":
                metrics.budget_exhausted.labels(meter, self.role).inc()
            raise
        except Exception as exc:
            if database_unreachable(exc):
                metrics.budget_ledger_errors.labels("reserve").inc()
            raise  # the edge turns an unreachable database into the coded 503: fail closed
        metrics.budget_units.labels(meter, self.role).inc(units)
        self.reservations.append(reservation)
        return reservation

    def reservation(self, meter: str) -> Reservation | None:
        """This call's reservation of ``meter`` (None: budgets off, or the call reserved none)."""
        return next((r for r in self.reservations if r.meter == meter), None)

    async def settle(self, reservation: Reservation | None, used: int) -> Reservation | None:
        """Correct ``reservation`` to ``used`` units: refund the rest, or charge the excess."""
        if reservation is None:
            return None
        delta = max(0, used) - reservation.units
        await self._adjust(reservation, delta)
        settled = reservation.adjusted(reservation.units + delta, reservation.used + delta)
        self.reservations[self.reservations.index(reservation)] = settled
        return settled

    async def refund_all(self) -> None:
        """The call failed: give back every unit it reserved."""
        reservations, self.reservations = self.reservations, []
        for reservation in reservations:
            await self._adjust(reservation, -reservation.units)

    async def _adjust(self, reservation: Reservation, delta: int) -> None:
        if not delta:
            return
        metrics = self.budgets.metrics
        if (
            reservation.leased
            and delta == -reservation.units
            and self.budgets.leases.give_back_unit(reservation)
        ):
            metrics.budget_refunded_units.labels(reservation.meter, reservation.role).inc(-delta)
            return
        try:
            await self.budgets.ledger.adjust(reservation, delta)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            # The call is over; failing it now would not un-spend anything. The ledger keeps the
            # reservation (the safe side for the budget) and says so.
            metrics.budget_ledger_errors.labels("settle").inc()
            log.warning(
                "budget: could not settle %s for %s (%+d units): %s",
                reservation.meter,
                reservation.principal,
                delta,
                exc,
            )
            return
        if delta < 0:
            metrics.budget_refunded_units.labels(reservation.meter, reservation.role).inc(-delta)
        else:
            metrics.budget_units.labels(reservation.meter, reservation.role).inc(delta)

    def headers(self) -> dict[str, str]:
        """IETF ``RateLimit-Policy`` / ``RateLimit`` fields (draft-ietf-httpapi-ratelimit-headers) for
        the limited meters this call reserved: quota and window per policy, remaining units and the
        seconds until the window resets."""
        policies, states = [], []
        now = self.budgets.ledger.clock()
        seen = set()
        for r in self.reservations:
            if r.limit is None or r.meter in seen:
                continue
            seen.add(r.meter)
            policies.append(f'"{r.meter}";q={r.limit};w={self.budgets.settings.window}')
            reset = max(0, math.ceil(r.window_end.timestamp() - now))
            states.append(f'"{r.meter}";r={max(0, r.limit - r.used)};t={reset}')
        if not policies:
            return {}
        return {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(states)}


def check_ask_grant(settings: BudgetSettings, principal: Principal) -> None:
    """``ask`` needs the ``grants: ["ask"]`` claim (admins always may) unless ``RAG_ASK_GRANT=open``."""
    if settings.ask_grant == "open" or principal.admin or ASK_GRANT in principal.grants:
        return
    raise ApiError("auth.ask_not_granted")


@asynccontextmanager
async def metered(
    metering: Metering | None, meters: Sequence[str] | Mapping[str, int]
) -> AsyncIterator[Metering | None]:
    """Around one metered action: the ask grant, the fairness limiter, then ``meters`` reserved (one
    unit of each meter named, or a mapping's units per meter: a token meter's upper bound, settled
    once the call says what it used); the call's failure refunds everything it reserved. Unmetered
    actions pass untouched."""
    if metering is None or not meters:
        yield metering
        return
    budgets, principal = metering.budgets, metering.principal
    if "ask" in meters:
        check_ask_grant(budgets.settings, principal)
    limited = budgets.limited(principal)
    if limited:
        try:
            budgets.limiter.acquire(principal.sub)
        except ApiError:
            budgets.metrics.budget_rate_limited.labels(metering.role).inc()
            raise
    try:
        try:
            units = meters if isinstance(meters, Mapping) else dict.fromkeys(meters, 1)
            for meter, n in units.items():
                await metering.reserve(meter, n)
            yield metering
        except BaseException:
            await metering.refund_all()
            raise
    finally:
        if limited:
            budgets.limiter.release(principal.sub)


def usage_tokens(usage: Mapping[str, Any], key: str, estimate: int) -> int:
    """The provider's reported count of ``key`` tokens, else the estimate (extractive, streams)."""
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else estimate


@dataclass(frozen=True)
class GenerationHold:
    """The language-model tokens one generation reserved: its prompt's estimate and the most it may
    write (``RAG_LLM_MAX_OUTPUT_TOKENS``), so the call cannot outspend the budget it passed."""

    prompt: Reservation | None
    completion: Reservation | None
    prompt_estimate: int


async def hold_generation(metering: Metering | None, prompt_estimate: int, max_output: int) -> GenerationHold:
    """Reserve a generation's tokens before calling the model (429 ``budget_exhausted`` if they do not fit)."""
    if metering is None:
        return GenerationHold(None, None, prompt_estimate)
    prompt = await metering.reserve("llm_prompt_tokens", prompt_estimate)
    completion = await metering.reserve("llm_completion_tokens", max_output)
    return GenerationHold(prompt, completion, prompt_estimate)


async def settle_generation(
    metering: Metering | None, hold: GenerationHold, usage: Mapping[str, Any], completion_estimate: int
) -> None:
    """Settle a generation to the provider's reported usage (``prompt_tokens``, ``completion_tokens``);
    where it reports none (the extractive provider, a stream), to the estimates."""
    if metering is None:
        return
    await metering.settle(hold.prompt, usage_tokens(usage, "prompt_tokens", hold.prompt_estimate))
    await metering.settle(hold.completion, usage_tokens(usage, "completion_tokens", completion_estimate))
