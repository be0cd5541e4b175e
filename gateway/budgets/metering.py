"""One call's metering: the fairness limiter, then its units reserved in the ledger before it
spends them, settled after, refunded whole when it fails (:mod:`gateway.budgets.ledger` holds the
ledger and its rules). A principal without a limit takes its single units from a worker's lease
(:mod:`gateway.budgets.lease`), one ledger write per lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiohttp import web

from gateway.access.auth import Principal
from gateway.base.budget_settings import BudgetSettings
from gateway.base.errors import ApiError
from gateway.base.metrics import Metrics
from gateway.budgets.fairness import FairLimiter
from gateway.budgets.lease import Leases
from gateway.budgets.ledger import Ledger, Reservation, role_of
from index.beside import running_beside
from schema.database import database_unreachable

__all__ = [
    "ASK_GRANT",
    "BUDGETS_KEY",
    "Budgets",
    "GenerationHold",
    "Metering",
    "hold_generation",
    "metered",
    "settle_generation",
]

log = logging.getLogger(__name__)

ASK_GRANT = "ask"  # the value of the token's ``grants`` claim that lets a non-admin call ``ask``


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
        settled = dataclasses.replace(
            reservation, units=reservation.units + delta, used=reservation.used + delta
        )
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
