"""Waiting for a state in a test: poll until it holds, under a bound that guards against a hang and
is never a speed limit. These machines are shared: a loaded run took minutes for what takes a
second alone, so the bound is generous and the failure names what never happened."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["HANG_GUARD_S", "until"]

HANG_GUARD_S = 300.0


async def until(
    what: str,
    check: Callable[[], Any | Awaitable[Any]],
    *,
    limit_s: float = HANG_GUARD_S,
    every_s: float = 0.05,
) -> Any:
    """Call ``check`` (plain or async) until it returns something truthy, and return that; fail
    naming ``what`` once ``limit_s`` has passed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting {limit_s:.0f} s for {what}")
        await asyncio.sleep(every_s)
