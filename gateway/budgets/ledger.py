"""The per-principal budget ledger in PostgreSQL: reserve before spending, settle after.

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

One call's metering (reserve, settle, refund; the fairness limiter first; leases for a principal
without a limit) is :mod:`gateway.budgets.metering`; the admin routes are :mod:`gateway.budgets.routes`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from gateway.access.auth import MAX_SUB_CHARS, UNPRINTABLE, Principal
from gateway.base.budget_settings import METERS, ROLES, BudgetSettings
from gateway.base.errors import ApiError

__all__ = [
    "METERS",
    "ROLES",
    "Ledger",
    "LedgerRow",
    "Reservation",
    "exhausted",
    "role_of",
    "window_of",
]


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
    leased: bool = False  # one unit of a worker's lease (gateway.budgets.lease), not reserved alone


@dataclass(frozen=True)
class LedgerRow:
    """One principal's use of one meter in one window, with the limit that applies to it."""

    principal: str
    meter: str
    window_start: datetime
    used: int
    role: str
    limit: int | None
    override: bool  # the limit is the principal's own (``mnemo budgets set``), not its role's

    def as_dict(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "meter": self.meter,
            "window_start": self.window_start.isoformat(),
            "used": self.used,
            "role": self.role,
            "limit": self.limit,
            "override": self.override,
        }


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

    async def show(self, principal: str | None = None) -> list[LedgerRow]:
        """Every principal's (or one's) use in the current window, and its overrides with no use yet."""
        start, _ = window_of(self.clock(), self.window_s)
        rows = await self._pool.fetch(
            """
            SELECT COALESCE(l.principal, o.principal) AS principal, COALESCE(l.meter, o.meter) AS meter,
                   COALESCE(l.used, 0) AS used, COALESCE(l.role, 'user') AS role,
                   o.principal IS NOT NULL AS override, o.max_units
            FROM (SELECT * FROM rag_budget_ledger WHERE window_start = $1) l
            FULL JOIN rag_budget_overrides o ON o.principal = l.principal AND o.meter = l.meter
            WHERE $2::text IS NULL OR COALESCE(l.principal, o.principal) = $2
            ORDER BY 1, 2
            """,
            start,
            principal,
        )
        return [
            LedgerRow(
                r["principal"],
                r["meter"],
                start,
                r["used"],
                r["role"],
                r["max_units"] if r["override"] else self.default_limit(r["role"], r["meter"]),
                r["override"],
            )
            for r in rows
        ]

    async def set_limit(self, principal: str, meter: str, max_units: int | None) -> None:
        """Give ``principal`` its own limit on ``meter`` (None: unlimited) in place of its role's."""
        _check(principal, meter)
        if max_units is not None and not 0 <= max_units < 2**63:
            raise ApiError.invalid_options("limit: an integer >= 0, or null for unlimited")
        await self._pool.execute(
            """
            INSERT INTO rag_budget_overrides (principal, meter, max_units) VALUES ($1, $2, $3)
            ON CONFLICT (principal, meter) DO UPDATE SET max_units = EXCLUDED.max_units, updated_at = now()
            """,
            principal,
            meter,
            max_units,
        )

    async def clear_limit(self, principal: str, meter: str) -> bool:
        """Drop ``principal``'s own limit on ``meter`` (its role's applies again); whether it had one."""
        _check(principal, meter)
        status = await self._pool.execute(
            "DELETE FROM rag_budget_overrides WHERE principal = $1 AND meter = $2", principal, meter
        )
        return status != "DELETE 0"

    async def reset(self, principal: str, meter: str | None = None) -> int:
        """Zero ``principal``'s use in the current window (one meter, or all); the rows reset."""
        _check(principal, meter)
        start, _ = window_of(self.clock(), self.window_s)
        status = await self._pool.execute(
            "DELETE FROM rag_budget_ledger WHERE principal = $1 AND window_start = $2 "
            "AND ($3::text IS NULL OR meter = $3)",
            principal,
            start,
            meter,
        )
        return int(status.split()[-1])


def _check(principal: str, meter: str | None) -> None:
    """Admin input at the door: a coded 400 rather than a database error."""
    # the token's sub grammar (gateway.access.auth): a NUL or a lone surrogate would be a database error
    if not principal or len(principal) > MAX_SUB_CHARS or UNPRINTABLE.search(principal):
        raise ApiError.invalid_options(
            f"principal: 1..{MAX_SUB_CHARS} printable characters (the token's sub)"
        )
    if meter is not None and meter not in METERS:
        raise ApiError.invalid_options(f"meter: one of {', '.join(METERS)}")


def exhausted(meter: str, used: int, limit: int | None, reset_at: datetime, now: float) -> ApiError:
    """429 ``budget_exhausted``: which meter, its use and limit, and when the window resets."""
    wait = max(1, math.ceil(reset_at.timestamp() - now))
    return ApiError(
        "budget_exhausted",
        f"The {meter} budget of this window is spent ({used} of {limit}); it resets at {reset_at.isoformat()}",
        retry_after=wait,
        details={"meter": meter, "used": used, "limit": limit, "reset_at": reset_at.isoformat()},
    )
