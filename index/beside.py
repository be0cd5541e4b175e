"""A background task that lives exactly as long as a ``with`` block (a lease's heartbeat, a sweep)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["running_beside"]


@contextlib.asynccontextmanager
async def running_beside(loop: Callable[[], Awaitable[None]], name: str) -> AsyncIterator[None]:
    """Run ``loop()`` as a task named ``name`` while the block runs; cancelled and awaited when it
    ends, however it ends (so no task outlives the resource it works on)."""
    task = asyncio.create_task(loop(), name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
