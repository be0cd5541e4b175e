"""The token-budget batcher: planning, order restoration, failures, cancellation, admission."""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from inference.batching import TokenBudgetBatcher, plan_micro_batches
from inference.errors import Overloaded
from tests.waiting import until


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=300), max_size=200),
    max_batch_size=st.integers(min_value=1, max_value=64),
    max_batch_tokens=st.integers(min_value=1, max_value=4096),
)
def test_plan_covers_every_item_once_within_budget(
    lengths: list[int], max_batch_size: int, max_batch_tokens: int
) -> None:
    batches = plan_micro_batches(lengths, max_batch_size=max_batch_size, max_batch_tokens=max_batch_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= max_batch_size
        padded = len(batch) * max(lengths[i] for i in batch)
        # Over budget only when one item alone is over it.
        assert padded <= max_batch_tokens or len(batch) == 1
    # Longest first: lengths never increase across the flattened plan.
    assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)


def _plan_cost(batches: list[list[int]], lengths: list[int], overhead: float) -> float:
    return sum(overhead + len(b) * max(max(1, lengths[i]) for i in b) for b in batches)


def _cheapest_by_brute_force(lengths: list[int], max_size: int, budget: int, overhead: float) -> float:
    """Every way to cut the sorted wave into runs (2^(n-1) of them), the cheapest within the bounds."""
    ordered = sorted((max(1, n) for n in lengths), reverse=True)
    if not ordered:
        return 0.0
    best = math.inf
    for mask in range(1 << max(0, len(ordered) - 1)):
        runs, start = [], 0
        for k in range(1, len(ordered)):
            if mask >> (k - 1) & 1:
                runs.append(ordered[start:k])
                start = k
        runs.append(ordered[start:])
        if all(len(r) <= max_size and (len(r) == 1 or len(r) * r[0] <= budget) for r in runs):
            best = min(best, sum(overhead + len(r) * r[0] for r in runs))
    return best


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=300), max_size=200),
    max_batch_size=st.integers(min_value=1, max_value=64),
    max_batch_tokens=st.integers(min_value=1, max_value=4096),
    overhead=st.floats(min_value=0, max_value=5000),
)
def test_padding_aware_plan_keeps_the_bounds_and_never_costs_more_than_filling(
    lengths: list[int], max_batch_size: int, max_batch_tokens: int, overhead: float
) -> None:
    bounds = {"max_batch_size": max_batch_size, "max_batch_tokens": max_batch_tokens}
    batches = plan_micro_batches(lengths, **bounds, batch_overhead_tokens=overhead)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= max_batch_size
        assert len(batch) * max(max(1, lengths[i]) for i in batch) <= max_batch_tokens or len(batch) == 1
    assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)
    filled = plan_micro_batches(lengths, **bounds)
    assert _plan_cost(batches, lengths, overhead) <= _plan_cost(filled, lengths, overhead) + 1e-6


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=64), max_size=10),
    max_batch_size=st.integers(min_value=1, max_value=6),
    max_batch_tokens=st.integers(min_value=1, max_value=256),
    overhead=st.floats(min_value=0, max_value=200),
)
def test_padding_aware_plan_is_the_cheapest_cut(
    lengths: list[int], max_batch_size: int, max_batch_tokens: int, overhead: float
) -> None:
    assume(overhead < max_batch_tokens)  # at or above it, batches are filled in turn (tested below)
    batches = plan_micro_batches(
        lengths,
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens,
        batch_overhead_tokens=overhead,
    )
    expected = _cheapest_by_brute_force(lengths, max_batch_size, max_batch_tokens, overhead)
    assert _plan_cost(batches, lengths, overhead) == pytest.approx(expected)


def test_short_texts_run_apart_from_a_long_one_when_padding_costs_more_than_a_pass() -> None:
    lengths = [256] + [16] * 31  # one abstract among titles: filling pads 31 titles to 256 tokens
    filled = plan_micro_batches(lengths, max_batch_size=32, max_batch_tokens=8192)
    assert filled == [list(range(32))]
    cut = plan_micro_batches(lengths, max_batch_size=32, max_batch_tokens=8192, batch_overhead_tokens=50)
    assert cut == [[0], list(range(1, 32))]
    # A pass costing more than the padding saved (a GPU's measured overhead) keeps the batch whole.
    whole = plan_micro_batches(lengths, max_batch_size=32, max_batch_tokens=8192, batch_overhead_tokens=8192)
    assert whole == [list(range(32))]


def _echo(items: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(caller, index * 10) for caller, index in items]


async def test_each_caller_gets_its_own_results_in_order() -> None:
    batcher = TokenBudgetBatcher(_echo, max_batch_size=4, max_batch_tokens=40, max_pending_items=1000)
    requests = [[(c, i) for i in range(c % 7 + 1)] for c in range(20)]
    lengths = [[(c * 7 + i) % 13 + 1 for i in range(len(r))] for c, r in enumerate(requests)]
    results = await asyncio.gather(*(batcher.submit(r, n) for r, n in zip(requests, lengths, strict=True)))
    for c, result in enumerate(results):
        assert result == [(c, i * 10) for i in range(len(requests[c]))]
    assert batcher.stats.batches > 1
    assert max(batcher.stats.batch_size_counts) <= 4
    await batcher.close()


class _Gate:
    """A run_batch that records its inputs, can be held shut, and can fail one call."""

    def __init__(self, fail_on_call: int | None = None) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()  # a forward pass has begun (and may be held at the gate)
        self.calls: list[list[tuple[str, int]]] = []
        self.fail_on_call = fail_on_call

    def __call__(self, items: list[tuple[str, int]]) -> list[str]:
        self.entered.set()
        self.open.wait()
        self.calls.append(list(items))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("model exploded")
        return [f"{name}:{i}" for name, i in items]


async def test_model_raising_mid_batch_reaches_every_waiter_and_the_next_request_succeeds() -> None:
    gate = _Gate(fail_on_call=2)
    gate.open.clear()
    batcher = TokenBudgetBatcher(
        gate, max_batch_size=2, max_batch_tokens=1000, max_pending_items=100, batch_wait_s=0
    )
    names = ["a", "b", "c", "d"]
    tasks = [asyncio.create_task(batcher.submit([(n, 0), (n, 1)], [5, 5])) for n in names]
    await until("batcher.stats.pending_items >= 8", lambda: batcher.stats.pending_items >= 8, every_s=0.001)
    gate.open.set()
    outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=60)
    failed = {item[0] for item in gate.calls[1]}
    for name, outcome in zip(names, outcomes, strict=True):
        if name in failed:
            assert isinstance(outcome, RuntimeError) and str(outcome) == "model exploded"
        else:
            assert outcome == [f"{name}:0", f"{name}:1"]
    assert failed and len(failed) < len(names)
    assert batcher.stats.failed_batches == 1
    assert await batcher.submit([("z", 0)], [3]) == ["z:0"]
    await batcher.close()


def _held_batcher(
    *, max_batch_size: int, batch_wait_s: float
) -> tuple[_Gate, ThreadPoolExecutor, TokenBudgetBatcher]:
    """A batcher whose forward passes wait behind a closed gate, on one executor thread."""
    gate = _Gate()
    gate.open.clear()
    executor = ThreadPoolExecutor(1)
    batcher = TokenBudgetBatcher(
        gate,
        max_batch_size=max_batch_size,
        max_batch_tokens=1000,
        max_pending_items=100,
        batch_wait_s=batch_wait_s,
        executor=executor,
    )
    return gate, executor, batcher


async def test_cancelled_callers_are_skipped_before_the_forward_pass() -> None:
    gate, executor, batcher = _held_batcher(max_batch_size=8, batch_wait_s=0)
    first = asyncio.create_task(batcher.submit([("first", 0)], [1]))
    await until("batcher.stats.pending_items > 0", lambda: batcher.stats.pending_items > 0, every_s=0.001)
    await asyncio.sleep(0.01)  # the first wave is now parked in the executor behind the gate
    leaving = asyncio.create_task(batcher.submit([("gone", 0), ("gone", 1)], [1, 1]))
    staying = asyncio.create_task(batcher.submit([("stay", 0)], [1]))
    await until("batcher.stats.pending_items >= 4", lambda: batcher.stats.pending_items >= 4, every_s=0.001)
    leaving.cancel()
    gate.open.set()
    assert await first == ["first:0"]
    assert await staying == ["stay:0"]
    with pytest.raises(asyncio.CancelledError):
        await leaving
    run = [name for call in gate.calls for name, _ in call]
    assert "gone" not in run
    assert batcher.stats.skipped_items == 2
    assert batcher.stats.pending_items == 0
    await batcher.close()
    executor.shutdown()


async def test_close_answers_the_callers_of_a_wave_in_flight() -> None:
    """close() cancels the loop mid-wave; CancelledError is no Exception, and its waiters used to
    stay unanswered forever."""
    gate, executor, batcher = _held_batcher(max_batch_size=4, batch_wait_s=0)
    in_flight = asyncio.create_task(batcher.submit([("a", 0), ("a", 1)], [1, 1]))
    assert await asyncio.to_thread(gate.entered.wait, 60)  # its forward pass is held at the gate
    queued = asyncio.create_task(batcher.submit([("b", 0)], [1]))
    await until("batcher.stats.pending_items >= 3", lambda: batcher.stats.pending_items >= 3, every_s=0.001)
    await batcher.close()
    for waiter in (in_flight, queued):
        with pytest.raises(RuntimeError, match="shutting down"):
            await asyncio.wait_for(waiter, 60)  # a safety net: unanswered, it would hang
    gate.open.set()
    executor.shutdown()


async def test_requests_queued_during_a_wave_run_next_without_the_wait_window() -> None:
    # A window no test could sit out: only a wave that skips it finishes in time.
    gate, executor, batcher = _held_batcher(max_batch_size=4, batch_wait_s=600.0)
    full = asyncio.create_task(batcher.submit([("full", i) for i in range(4)], [1] * 4))  # no window
    await until(
        "len(gate.calls) == 0 and batcher.stats.pending_items >= 4",
        lambda: len(gate.calls) == 0 and batcher.stats.pending_items >= 4,
        every_s=0.001,
    )
    await asyncio.sleep(0.01)  # the full wave is now parked in the executor behind the gate
    queued = asyncio.create_task(batcher.submit([("queued", 0)], [1]))
    await until("batcher.stats.pending_items >= 5", lambda: batcher.stats.pending_items >= 5, every_s=0.001)
    gate.open.set()
    assert len(await full) == 4
    assert await asyncio.wait_for(queued, 120) == ["queued:0"]  # long before the 600 s window
    await batcher.close()
    executor.shutdown()


async def test_admission_is_bounded_with_retry_after() -> None:
    gate = _Gate()
    gate.open.clear()
    batcher = TokenBudgetBatcher(gate, max_batch_size=4, max_batch_tokens=1000, max_pending_items=4)
    held = asyncio.create_task(batcher.submit([("a", i) for i in range(4)], [1] * 4))
    await until("batcher.stats.pending_items >= 4", lambda: batcher.stats.pending_items >= 4, every_s=0.001)
    with pytest.raises(Overloaded) as info:
        await batcher.submit([("b", 0)], [1])
    assert info.value.status == 429 and info.value.retry_after >= 1
    gate.open.set()
    assert len(await held) == 4
    assert await batcher.submit([("b", 0)], [1]) == ["b:0"]  # admitted again once drained
    await batcher.close()
