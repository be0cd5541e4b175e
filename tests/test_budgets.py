"""Budgets' ledger rules against real PostgreSQL: reserve / settle / refund across windows (a property
test against a pure model of the rules), 64 concurrent reservations, overrides, and the fairness limiter."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.access.auth import Principal
from gateway.base.budget_settings import BudgetSettings, parse_limits
from gateway.base.errors import ApiError
from gateway.base.metrics import Metrics
from gateway.budgets import admin as budget_admin
from gateway.budgets.fairness import FairLimiter
from gateway.budgets.ledger import Budgets, Metering, Reservation, window_of
from gateway.web.embeddings import sidecar_failure
from inference.client import SidecarError, SidecarOverloaded, SidecarRejected, SidecarUnavailable
from inference.errors import ErrorCode
from schema.settings import SettingsError

WINDOW = 100  # seconds: the property test crosses several windows


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _budgets(pool: asyncpg.Pool, limits: str, clock: Clock, window: int = WINDOW, lease: int = 1) -> Budgets:
    """Budgets over ``pool``; every call reserved in the ledger unless ``lease`` > 1 (the ledger's
    own rules are checked call by call; the leases have tests of their own below)."""
    settings = BudgetSettings(window=window, limits=limits, lease=lease)
    return Budgets.configured(pool, settings, Metrics(), clock)


async def _ledger(pool: asyncpg.Pool, sub: str) -> dict[tuple[str, float], int]:
    rows = await pool.fetch(
        "SELECT meter, window_start, used FROM rag_budget_ledger WHERE principal = $1", sub
    )
    return {(r["meter"], r["window_start"].timestamp()): r["used"] for r in rows if r["used"]}


# -- the pure model ------------------------------------------------------------------------------------


@dataclass
class Model:
    """The rules, with no database: used per (meter, window start)."""

    limit: int
    used: dict[tuple[str, float], int] = field(default_factory=dict)

    def reserve(self, meter: str, units: int, now: float) -> bool:
        key = (meter, window_of(now, WINDOW)[0].timestamp())
        if self.used.get(key, 0) + units > self.limit:
            return False
        self.used[key] = self.used.get(key, 0) + units
        return True

    def adjust(self, key: tuple[str, float], delta: int) -> None:
        self.used[key] = max(0, self.used.get(key, 0) + delta)

    def view(self) -> dict[tuple[str, float], int]:
        return {k: v for k, v in self.used.items() if v}


# reserve units on a meter; settle the nth live reservation to what was used; refund it; move the clock
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(["ask", "llm_prompt_tokens"]), st.integers(0, 12)),
        st.tuples(st.just("settle"), st.integers(0, 5), st.integers(0, 15)),
        st.tuples(st.just("refund"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("tick"), st.just(""), st.integers(1, 120)),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, limit=st.integers(0, 20))
async def test_reserve_settle_refund_match_the_model_across_windows(
    db_pool: asyncpg.Pool, ops: list[tuple[str, str, int]], limit: int
) -> None:
    sub = f"p-{uuid.uuid4().hex[:8]}"
    clock = Clock()
    budgets = _budgets(db_pool, f"user.ask={limit},user.llm_prompt_tokens={limit}", clock)
    metering = Metering(budgets, Principal(sub=sub))
    model = Model(limit)
    live: list[Reservation] = []
    for op, arg, n in ops:
        if op == "reserve":
            admitted = model.reserve(arg, n, clock.now)
            try:
                live.append(await metering.reserve(arg, n))  # type: ignore[arg-type]
                assert admitted, "the ledger admitted what the rules refuse"
            except ApiError as exc:
                assert not admitted and exc.code == "budget_exhausted" and exc.status == 429
                assert exc.details is not None and exc.details["limit"] == limit
                assert exc.retry_after is not None and 1 <= exc.retry_after <= WINDOW
        elif op == "settle" and live:
            held = live.pop(int(arg) % len(live))
            # settle's rule: the reservation's own window moves by used - reserved
            model.adjust((held.meter, held.window_start.timestamp()), n - held.units)
            await metering.settle(held, n)
        elif op == "refund" and live:
            held = live.pop(0)
            model.adjust((held.meter, held.window_start.timestamp()), -held.units)
            await budgets.ledger.adjust(held, -held.units)
        elif op == "tick":
            clock.now += n
        assert await _ledger(db_pool, sub) == model.view()
    # Nothing reserved ever passes the limit; only a settle's reported excess may.
    if not any(op == "settle" for op, _, _ in ops):
        assert all(v <= limit for v in model.view().values())


async def test_a_refund_lands_in_the_window_it_was_reserved_in(db_pool: asyncpg.Pool) -> None:
    clock = Clock(1_000_050.0)
    budgets = _budgets(db_pool, "user.ask=1", clock)
    metering = Metering(budgets, Principal(sub="midnight"))
    await metering.reserve("ask", 1)
    clock.now += WINDOW  # the call straddles the window's end
    second = Metering(budgets, Principal(sub="midnight"))
    await second.reserve("ask", 1)  # the new window has its own unit
    await metering.refund_all()  # the old call failed: its refund must not free the new window's unit
    with pytest.raises(ApiError) as info:
        await Metering(budgets, Principal(sub="midnight")).reserve("ask", 1)
    assert info.value.code == "budget_exhausted"


async def test_64_concurrent_callers_with_a_budget_of_100_get_exactly_100(db_pool: asyncpg.Pool) -> None:
    budgets = _budgets(db_pool, "user.ask=100", Clock(), window=86400)
    principal = Principal(sub="crowd")

    async def caller() -> tuple[int, int]:
        served = refused = 0
        for _ in range(3):
            try:
                await Metering(budgets, principal).reserve("ask", 1)
                served += 1
            except ApiError as exc:
                assert exc.code == "budget_exhausted"
                refused += 1
        return served, refused

    results = await asyncio.gather(*(caller() for _ in range(64)))
    assert sum(s for s, _ in results) == 100
    assert sum(r for _, r in results) == 64 * 3 - 100
    assert list((await _ledger(db_pool, "crowd")).values()) == [100]


async def test_overrides_replace_the_role_default_and_reset_clears_the_window(db_pool: asyncpg.Pool) -> None:
    budgets = _budgets(db_pool, "user.ask=1", Clock())
    ledger = budgets.ledger
    alice = Principal(sub="alice")
    await Metering(budgets, alice).reserve("ask", 1)
    with pytest.raises(ApiError):
        await Metering(budgets, alice).reserve("ask", 1)
    await budget_admin.set_limit(ledger, "alice", "ask", 3)
    await Metering(budgets, alice).reserve("ask", 2)
    rows = {r.meter: r for r in await budget_admin.show(ledger, "alice")}
    assert (rows["ask"].used, rows["ask"].limit, rows["ask"].override) == (3, 3, True)
    assert await budget_admin.reset(ledger, "alice") == 1
    await budget_admin.set_limit(ledger, "alice", "ask", None)  # unlimited, still counted
    for _ in range(5):
        await Metering(budgets, alice).reserve("ask", 1)
    assert (await budget_admin.show(ledger, "alice"))[0].used == 5
    assert await budget_admin.clear_limit(ledger, "alice", "ask") and not await budget_admin.clear_limit(
        ledger, "alice", "ask"
    )
    with pytest.raises(ApiError):  # back to the role's 1
        await Metering(budgets, alice).reserve("ask", 1)
    # an admin token's role has no limit here: counted only
    root = Principal(sub="root", admin=True)
    for _ in range(3):
        assert (await Metering(budgets, root).reserve("ask", 1)).limit is None  # type: ignore[union-attr]
    with pytest.raises(ApiError) as info:
        await budget_admin.set_limit(ledger, "alice", "gpu_hours", 1)
    assert info.value.code == "request.invalid_options"


# -- leases: a principal without a limit counted one ledger write per lease ---------------------------


async def _served(
    budgets: Budgets, principal: Principal, calls: int, meter: str = "query_embeddings"
) -> list:
    return [await Metering(budgets, principal).reserve(meter, 1) for _ in range(calls)]


async def test_a_principal_without_a_limit_takes_leases_and_the_ledger_ends_exact(
    db_pool: asyncpg.Pool,
) -> None:
    """An admin (no limit on any meter here): the first call learns "no limit" (reserved alone), the
    next ones come out of leases of 4, so the ledger counts ahead (never behind) by what a lease
    still holds; given back, it holds exactly the calls served. Each call reports the use the ledger
    would show had it reserved alone."""
    budgets = _budgets(db_pool, "", Clock(), lease=4)
    root = Principal(sub=f"root-{uuid.uuid4().hex[:6]}", admin=True)
    seen = []
    for served in range(1, 11):
        (reservation,) = await _served(budgets, root, 1)
        counted = (await _ledger(db_pool, root.sub)).popitem()[1]
        assert served <= counted < served + 4, (served, counted)
        seen.append((reservation.used, reservation.leased, reservation.limit))
    assert seen == [(n, n > 1, None) for n in range(1, 11)]
    # calls 2-5, 6-9 and 10 came out of three leases: the ledger wrote 1 + 3 times, not 10
    assert list((await _ledger(db_pool, root.sub)).values()) == [1 + 3 * 4]
    assert await budgets.leases.return_idle(everything=True) == 3
    assert list((await _ledger(db_pool, root.sub)).values()) == [10]


async def test_a_failed_calls_leased_unit_goes_back_into_its_lease(db_pool: asyncpg.Pool) -> None:
    budgets = _budgets(db_pool, "", Clock(), lease=4)
    root = Principal(sub=f"root-{uuid.uuid4().hex[:6]}", admin=True)
    await _served(budgets, root, 3)
    failed = Metering(budgets, root)
    assert (await failed.reserve("query_embeddings", 1)).leased  # type: ignore[union-attr]
    await failed.refund_all()
    await budgets.leases.return_idle(everything=True)
    assert list((await _ledger(db_pool, root.sub)).values()) == [3]  # the three served, not the failed one


async def test_a_principal_with_a_limit_is_reserved_call_by_call(db_pool: asyncpg.Pool) -> None:
    budgets = _budgets(db_pool, "user.query_embeddings=5", Clock(), lease=4)
    reader = Principal(sub=f"reader-{uuid.uuid4().hex[:6]}")
    for served in range(1, 6):
        (reservation,) = await _served(budgets, reader, 1)
        assert not reservation.leased and list((await _ledger(db_pool, reader.sub)).values()) == [served]
    with pytest.raises(ApiError) as info:
        await _served(budgets, reader, 1)
    assert info.value.code == "budget_exhausted"


async def test_a_limit_set_on_a_leased_principal_applies_from_its_next_lease(db_pool: asyncpg.Pool) -> None:
    """An operator limits a principal that was taking leases: the units its lease holds are still
    served (the lease was counted); the next lease is refused, the call reserved alone and refused
    past the limit, and the ledger never counts less than was served."""
    budgets = _budgets(db_pool, "", Clock(), lease=4)
    root = Principal(sub=f"root-{uuid.uuid4().hex[:6]}", admin=True)
    await _served(budgets, root, 2)  # one alone, one of a lease of 4 (3 left)
    await budget_admin.set_limit(budgets.ledger, root.sub, "query_embeddings", 6)
    await _served(budgets, root, 3)  # the lease's last three
    with pytest.raises(ApiError) as info:  # 5 + 4 > 6: no lease; 5 + 1 fits: one more alone
        await _served(budgets, root, 2)
    assert info.value.code == "budget_exhausted"
    assert list((await _ledger(db_pool, root.sub)).values()) == [6]
    assert not budgets.leases.may_lease(root.sub, "query_embeddings", 1)


async def test_leases_go_back_when_idle_and_to_their_own_window(db_pool: asyncpg.Pool) -> None:
    """A lease idle RAG_BUDGET_LEASE_IDLE seconds gives its units back; a lease whose window ended
    is replaced, its units going back to the window they were counted in."""
    from gateway.budgets.ledger import Leases

    clock, idle = Clock(1_000_000.0), Clock(0.0)
    budgets = _budgets(db_pool, "", clock, lease=4)
    leases = Leases(budgets.ledger, 4, idle_s=2.0, clock=idle)
    budgets = Budgets(budgets.settings, budgets.ledger, budgets.limiter, budgets.metrics, leases)
    root = Principal(sub=f"root-{uuid.uuid4().hex[:6]}", admin=True)
    first = window_of(clock.now, WINDOW)[0].timestamp()
    await _served(budgets, root, 3)  # one alone, two of a lease (2 left)
    idle.now += 1.9
    assert await leases.return_idle() == 0  # not idle long enough
    clock.now += WINDOW  # the next window: a new lease there, the old one's 2 back to its own window
    await _served(budgets, root, 2)
    second = window_of(clock.now, WINDOW)[0].timestamp()
    assert await _ledger(db_pool, root.sub) == {
        ("query_embeddings", first): 3,
        ("query_embeddings", second): 4,
    }
    idle.now += 2.0
    assert await leases.return_idle() == 2
    assert await _ledger(db_pool, root.sub) == {
        ("query_embeddings", first): 3,
        ("query_embeddings", second): 2,
    }


def test_the_limiter_sheds_the_flooding_principal_only() -> None:
    now = [0.0]
    limiter = FairLimiter(rate=2.0, burst=4, concurrency=3, clock=lambda: now[0])
    for _ in range(3):
        limiter.acquire("flood")
    with pytest.raises(ApiError) as info:  # the fourth in flight
        limiter.acquire("flood")
    assert info.value.code == "rate_limited" and info.value.status == 429
    limiter.acquire("steady")  # another principal is untouched
    limiter.release("steady")
    limiter.release("flood")
    limiter.acquire("flood")  # the bucket's 4th token
    limiter.release("flood")
    with pytest.raises(ApiError) as info:  # bucket empty (4 taken, none refilled)
        limiter.acquire("flood")
    assert info.value.retry_after == 1
    now[0] += 0.5  # one token back at 2/s
    limiter.acquire("flood")
    for _ in range(3):
        limiter.release("flood")
    now[0] += 10
    limiter.prune()
    assert limiter.active == 0  # idle, refilled principals are forgotten


def test_each_of_n_workers_holds_its_share_of_the_fairness_limits(db_pool: asyncpg.Pool) -> None:
    """RAG_FAIR_* are per gateway: with 3 workers, each admits a third of the rate and burst and
    in-flight bound (rounded up), so a flood spread over the workers gets the settings' rate in all."""
    settings = BudgetSettings(fair_rate=20.0, fair_burst=40, fair_concurrency=8)
    one = Budgets.configured(db_pool, settings, Metrics()).limiter
    share = Budgets.configured(db_pool, settings, Metrics(), workers=3).limiter
    assert (one.rate, one.burst, one.concurrency) == (20.0, 40, 8)
    assert (share.rate, share.burst, share.concurrency) == (20.0 / 3, 14, 3)
    for _ in range(3):
        share.acquire("flood")
    with pytest.raises(ApiError):  # the worker's share of the in-flight bound (8 / 3, rounded up)
        share.acquire("flood")


def test_limits_are_parsed_strictly() -> None:
    assert parse_limits("user.ask=2, admin.query_embeddings=0") == {
        ("user", "ask"): 2,
        ("admin", "query_embeddings"): 0,
    }
    for bad in ("ask=2", "guest.ask=2", "user.gpu=1", "user.ask=-1", "user.ask=two"):
        with pytest.raises(SettingsError):
            parse_limits(bad)
    with pytest.raises(SettingsError):
        BudgetSettings(ask_grant="sometimes").validate()


_MAIN = "import sys; from gateway.cli import main; sys.exit(main())"


def _mnemo_budgets(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    """``mnemo budgets ...`` as an operator runs it (this checkout's code, in a subprocess)."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        [sys.executable, "-c", _MAIN, "budgets", *args, "--database-url", database_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


async def test_mnemo_budgets_set_show_reset(database_url: str, db_pool: asyncpg.Pool) -> None:
    budgets = _budgets(db_pool, "user.ask=5", Clock(time.time()), window=86400)
    await Metering(budgets, Principal(sub="carol")).reserve("ask", 2)
    run = _mnemo_budgets(
        "set", "--principal", "carol", "--meter", "ask", "--limit", "7", database_url=database_url
    )
    assert run.returncode == 0 and "carol ask: 7 per window" in run.stdout, run.stderr
    shown = _mnemo_budgets("show", "--principal", "carol", "--json", database_url=database_url)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert [(r["meter"], r["used"], r["limit"], r["override"]) for r in rows] == [("ask", 2, 7, True)]
    table = _mnemo_budgets("show", database_url=database_url)
    assert "carol" in table.stdout and "7*" in table.stdout
    assert _mnemo_budgets("reset", "--principal", "carol", database_url=database_url).returncode == 0
    assert await _ledger(db_pool, "carol") == {}
    bad = _mnemo_budgets(
        "set", "--principal", "carol", "--meter", "ask", "--limit", "-1", database_url=database_url
    )
    assert bad.returncode == 2 and "limit" in bad.stderr and "Traceback" not in bad.stderr
    back = _mnemo_budgets(
        "set", "--principal", "carol", "--meter", "ask", "--default", database_url=database_url
    )
    assert back.returncode == 0 and await db_pool.fetchval("SELECT count(*) FROM rag_budget_overrides") == 0


def test_the_sidecars_refusals_of_v1_embeddings_pass_on_with_their_status_and_its_failures_are_503() -> None:
    """The gateway's /v1/embeddings (tests/test_budgets_gateway.py serves it): the sidecar's 429 stays a
    429 with its Retry-After (rounded up), a refusal of the input keeps its status and words; a refusal
    that is the gateway's own doing (a wrong sidecar API key) or an outage is never the caller's."""
    overloaded = SidecarOverloaded("429", status=429, code=ErrorCode.OVERLOADED, retry_after=2.5)
    error = sidecar_failure(overloaded)
    assert (error.status, error.code, error.retry_after, error.retryable) == (
        429,
        "embeddings.overloaded",
        3,
        True,
    )
    error = sidecar_failure(SidecarRejected(422, ErrorCode.INPUT_TOO_LONG, "input 0 has 300 tokens"))
    assert (error.status, error.code, error.message) == (
        422,
        "embeddings.input_too_long",
        "input 0 has 300 tokens",
    )
    error = sidecar_failure(SidecarRejected(413, ErrorCode.TOO_MANY_INPUTS, "65 inputs"))
    assert (error.status, error.code) == (413, "embeddings.too_many_inputs")
    for failure in (
        SidecarRejected(401, ErrorCode.UNAUTHORIZED, "wrong key"),
        SidecarUnavailable("503", status=503, code=ErrorCode.NOT_READY, retry_after=5),
        SidecarError("500", status=500, code=ErrorCode.MODEL_ERROR),
        SidecarUnavailable("ConnectionRefusedError"),
    ):
        error = sidecar_failure(failure)
        assert (error.status, error.code, error.retryable) == (503, "rag.embedding_unavailable", True), (
            failure
        )
