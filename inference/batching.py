"""Token-budget micro-batching for concurrent callers (Ray-free; the Serve deployments wrap it).

Callers ``submit`` a list of items with their lengths and await their own results. A single loop task
drains everything queued, flattens it, sorts it longest first (an out-of-memory error shows on the first
batch, not the last) and cuts micro-batches whose *padded* size ``count x longest`` stays under
``max_batch_tokens`` and ``max_batch_size``. Given a forward pass's fixed cost in padded tokens
(``batch_overhead_tokens``, measured at warm-up), the cuts are the cheapest ones: on a CPU, where padding
costs as much as real tokens, a wave of short texts with a few long ones no longer pads every short
text to the longest (that had cost up to 2.6x the tokens on a corpus of titles and abstracts).
Each micro-batch runs in an executor (the event loop is never blocked) and its results are scattered
back so every caller gets exactly its own outputs in its own order.

Guarantees, as in Ray's ``@serve.batch`` and TEI's queue:
- every waiter gets its results or the exception, also when the model raises mid-batch;
- callers that went away (cancelled) are skipped before the forward pass;
- admission is bounded: beyond ``max_pending_items`` admitted-and-unfinished items, :class:`Overloaded`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from .errors import Overloaded

__all__ = ["BatchStats", "TokenBudgetBatcher", "plan_micro_batches"]

T = TypeVar("T")
R = TypeVar("R")


def plan_micro_batches(
    lengths: Sequence[int],
    *,
    max_batch_size: int,
    max_batch_tokens: int,
    batch_overhead_tokens: float | None = None,
) -> list[list[int]]:
    """Indices of ``lengths`` grouped into micro-batches, longest first.

    A batch's padded cost is ``len(batch) * max(length in batch)``; it never passes ``max_batch_tokens``
    unless a single item alone does (that item then runs by itself).

    ``batch_overhead_tokens`` None (or at least ``max_batch_tokens``): each batch is filled up to those
    bounds in turn (a GPU's choice, where padding inside a batch is nearly free). Below that: the cuts
    minimize the wave's cost, each batch costing that overhead plus its padded tokens, under the same
    bounds.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    # A pass costing at least a whole batch of padding (a GPU's measured figure): fewest batches is
    # what the cost asks for, and filling each in turn gives that without the search.
    if batch_overhead_tokens is not None and batch_overhead_tokens < max_batch_tokens:
        return _cheapest_cuts(
            order,
            [max(1, lengths[i]) for i in order],
            max_batch_size,
            max_batch_tokens,
            batch_overhead_tokens,
        )
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        length = max(1, lengths[i])
        if current and (
            len(current) >= max_batch_size or (len(current) + 1) * max(longest, length) > max_batch_tokens
        ):
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def _cheapest_cuts(
    order: list[int], longest_first: list[int], max_batch_size: int, max_batch_tokens: int, overhead: float
) -> list[list[int]]:
    """Dynamic programming over the sorted wave: ``best[i]`` is the cheapest plan of its first ``i``.

    With lengths sorted longest first, a batch of positions ``j..i-1`` pads to ``longest_first[j]``, and
    some optimal plan is made of such runs (swapping a short item of an earlier batch with a long one
    of a later batch never lowers either batch's longest). O(items x max_batch_size).
    """
    n = len(longest_first)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        best_i, cut_i = math.inf, i - 1
        for j in range(i - 1, max(0, i - max_batch_size) - 1, -1):
            size = i - j
            padded = size * longest_first[j]
            if size > 1 and padded > max_batch_tokens:
                break  # earlier starts are at least as long: over budget too
            cost = best[j] + overhead + padded
            if cost < best_i:
                best_i, cut_i = cost, j
        best[i], cut[i] = best_i, cut_i
    batches: list[list[int]] = []
    i = n
    while i > 0:
        batches.append(order[cut[i] : i])
        i = cut[i]
    batches.reverse()
    return batches


@dataclasses.dataclass
class BatchStats:
    """Counters a replica exposes on /metrics (monotonic except ``pending_items``)."""

    batches: int = 0
    batch_items: int = 0
    batch_padded_tokens: int = 0
    batch_real_tokens: int = 0
    forward_seconds: float = 0.0
    failed_batches: int = 0
    skipped_items: int = 0
    rejected_requests: int = 0
    pending_items: int = 0
    batch_size_counts: dict[int, int] = dataclasses.field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(eq=False)
class _Request(Generic[T]):
    items: Sequence[T]
    lengths: Sequence[int]
    future: asyncio.Future
    results: list[Any]


class TokenBudgetBatcher(Generic[T, R]):
    """Coalesces concurrent ``submit`` calls into token-budgeted micro-batches of ``run_batch``."""

    def __init__(
        self,
        run_batch: Callable[[list[T]], Sequence[R]],
        *,
        max_batch_size: int,
        max_batch_tokens: int,
        max_pending_items: int,
        batch_wait_s: float = 0.002,
        executor: Executor | None = None,
        retry_after_s: float = 1.0,
        name: str = "batcher",
        batch_overhead_tokens: float | None = None,
    ) -> None:
        self._run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_pending_items = max_pending_items
        self.batch_wait_s = batch_wait_s
        # plan_micro_batches's cost of a forward pass; the owner may set it once measured (warm-up).
        self.batch_overhead_tokens = batch_overhead_tokens
        self.retry_after_s = retry_after_s
        self.name = name
        self._executor = executor
        self._queue: list[_Request[T]] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.stats = BatchStats()

    @property
    def alive(self) -> bool:
        """False when the loop task died (a health check should then fail the replica)."""
        return self._task is None or not self._task.done()

    async def submit(self, items: Sequence[T], lengths: Sequence[int]) -> list[R]:
        """Queue ``items`` and return their results in order (raises what the model raised)."""
        if len(items) != len(lengths):
            raise ValueError("items and lengths differ in length")
        if not items:
            return []
        if self.stats.pending_items + len(items) > self.max_pending_items:
            self.stats.rejected_requests += 1
            raise Overloaded(
                f"{self.name}: {self.stats.pending_items} items queued (bound {self.max_pending_items}); "
                "try again shortly",
                retry_after=self._retry_after(),
            )
        self._ensure_loop()
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        request: _Request[T] = _Request(items, lengths, loop.create_future(), [None] * len(items))
        self.stats.pending_items += len(items)
        self._queue.append(request)
        self._wakeup.set()
        try:
            return await request.future
        finally:
            # Cancelled callers leave their future cancelled: the loop skips their items.
            if not request.future.done():
                request.future.cancel()
            self.stats.pending_items -= len(items)

    def _retry_after(self) -> float:
        """Seconds until the queue has likely drained, from the measured rate (1 to 30 s)."""
        if self.stats.forward_seconds <= 0 or self.stats.batch_items == 0:
            return self.retry_after_s
        rate = self.stats.batch_items / self.stats.forward_seconds
        return float(min(30, max(1, math.ceil(self.stats.pending_items / rate))))

    def _ensure_loop(self) -> None:
        if self._task is None:
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"{self.name}-loop")
        elif self._task.done():  # never leave waiters hanging behind a dead loop
            raise RuntimeError(f"{self.name}: batching loop stopped: {self._task.exception()!r}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        _fail_waiters(self._queue, RuntimeError(f"{self.name}: shutting down"))
        self._queue.clear()

    async def _loop(self) -> None:
        assert self._wakeup is not None
        backlog = False  # requests queued while the previous wave ran
        while True:
            await self._wakeup.wait()
            queued = sum(len(r.items) for r in self._queue)
            # The window lets concurrent callers join a wave that starts from idle. Requests that
            # queued during the previous wave have waited that long already: they go at once.
            if self.batch_wait_s > 0 and queued < self.max_batch_size and not backlog:
                await asyncio.sleep(self.batch_wait_s)
            self._wakeup.clear()
            wave, self._queue = self._queue, []
            try:
                await self._run_wave(wave)
            except asyncio.CancelledError:  # close() mid-wave: every waiter still gets an answer
                _fail_waiters(wave, RuntimeError(f"{self.name}: shutting down"))
                raise
            except Exception as exc:  # bookkeeping bug: fail the wave, keep the loop alive
                _fail_waiters(wave, exc)
            backlog = bool(self._queue)

    async def _run_wave(self, wave: list[_Request[T]]) -> None:
        flat: list[tuple[_Request[T], int]] = [
            (request, j) for request in wave if not request.future.done() for j in range(len(request.items))
        ]
        self.stats.skipped_items += sum(len(r.items) for r in wave if r.future.done())
        lengths = [request.lengths[j] for request, j in flat]
        remaining = {id(request): len(request.items) for request in wave}
        loop = asyncio.get_running_loop()
        for batch in plan_micro_batches(
            lengths,
            max_batch_size=self.max_batch_size,
            max_batch_tokens=self.max_batch_tokens,
            batch_overhead_tokens=self.batch_overhead_tokens,
        ):
            live = [flat[i] for i in batch if not flat[i][0].future.done()]
            self.stats.skipped_items += len(batch) - len(live)
            if not live:
                continue
            inputs = [request.items[j] for request, j in live]
            started = time.perf_counter()
            try:
                outputs = await loop.run_in_executor(self._executor, self._run_batch, inputs)
                if len(outputs) != len(inputs):
                    raise RuntimeError(
                        f"{self.name}: model returned {len(outputs)} results for {len(inputs)}"
                    )
            except Exception as exc:
                self.stats.failed_batches += 1
                for request, _ in live:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            finally:
                self._record(live, lengths=[request.lengths[j] for request, j in live], started=started)
            for (request, j), output in zip(live, outputs, strict=True):
                if request.future.done():
                    continue
                request.results[j] = output
                remaining[id(request)] -= 1
                if remaining[id(request)] == 0:
                    request.future.set_result(request.results)

    def _record(self, live: list, *, lengths: list[int], started: float) -> None:
        stats = self.stats
        stats.batches += 1
        stats.batch_items += len(live)
        stats.batch_padded_tokens += len(lengths) * max(lengths)
        stats.batch_real_tokens += sum(lengths)
        stats.forward_seconds += time.perf_counter() - started
        stats.batch_size_counts[len(live)] = stats.batch_size_counts.get(len(live), 0) + 1


def _fail_waiters(requests: Sequence[_Request[Any]], exc: BaseException) -> None:
    """Every waiter not answered yet gets ``exc`` (Ray's batcher rule: a result or an exception)."""
    for request in requests:
        if not request.future.done():
            request.future.set_exception(exc)
