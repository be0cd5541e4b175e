"""The operators' side of the budget ledger (the admin routes and ``mnemo budgets``): who used what
in the current window (:func:`show`), a principal's own limits (:func:`set_limit`,
:func:`clear_limit`) and a window's reset (:func:`reset`). The calls' side, reserve and settle, is
:mod:`gateway.budgets.ledger`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.access.auth import MAX_SUB_CHARS, UNPRINTABLE
from gateway.base.budget_settings import METERS
from gateway.base.errors import ApiError
from gateway.budgets.ledger import Ledger, window_of

__all__ = ["LedgerRow", "clear_limit", "reset", "set_limit", "show"]


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


async def show(ledger: Ledger, principal: str | None = None) -> list[LedgerRow]:
    """Every principal's (or one's) use in the current window, and its overrides with no use yet."""
    start, _ = window_of(ledger.clock(), ledger.window_s)
    rows = await ledger.pool.fetch(
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
            r["max_units"] if r["override"] else ledger.default_limit(r["role"], r["meter"]),
            r["override"],
        )
        for r in rows
    ]


async def set_limit(ledger: Ledger, principal: str, meter: str, max_units: int | None) -> None:
    """Give ``principal`` its own limit on ``meter`` (None: unlimited) in place of its role's."""
    _check(principal, meter)
    if max_units is not None and not 0 <= max_units < 2**63:
        raise ApiError.invalid_options("limit: an integer >= 0, or null for unlimited")
    await ledger.pool.execute(
        """
        INSERT INTO rag_budget_overrides (principal, meter, max_units) VALUES ($1, $2, $3)
        ON CONFLICT (principal, meter) DO UPDATE SET max_units = EXCLUDED.max_units, updated_at = now()
        """,
        principal,
        meter,
        max_units,
    )


async def clear_limit(ledger: Ledger, principal: str, meter: str) -> bool:
    """Drop ``principal``'s own limit on ``meter`` (its role's applies again); whether it had one."""
    _check(principal, meter)
    status = await ledger.pool.execute(
        "DELETE FROM rag_budget_overrides WHERE principal = $1 AND meter = $2", principal, meter
    )
    return status != "DELETE 0"


async def reset(ledger: Ledger, principal: str, meter: str | None = None) -> int:
    """Zero ``principal``'s use in the current window (one meter, or all); the rows reset."""
    _check(principal, meter)
    start, _ = window_of(ledger.clock(), ledger.window_s)
    status = await ledger.pool.execute(
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
