import asyncio
import os

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.measure import closed_loop, descendants_cpu_s, knee, percentile, process_cpu_s, summarize


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_summary_is_ordered(samples: list[float]) -> None:
    s = summarize(samples)
    assert s.min <= s.median <= s.max
    assert s.min <= s.p95 <= s.p99 <= s.max


def test_percentile_interpolates() -> None:
    assert percentile([0, 10], 50) == 5
    assert percentile([1, 2, 3, 4, 5], 100) == 5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_knee_finds_where_gains_stop() -> None:
    assert knee([1, 2, 4, 8, 16], [10, 19, 30, 31, 31]) == 4
    assert knee([1, 2, 4], [10, 20, 40]) is None


async def test_closed_loop_runs_every_request_once() -> None:
    seen: list[int] = []

    async def call(i: int) -> None:
        seen.append(i)
        await asyncio.sleep(0)

    result = await closed_loop(call, concurrency=4, requests=50, items_per_request=2)
    assert sorted(seen) == list(range(50))
    assert result.requests == 50
    assert result.items_per_s == pytest.approx(100 / result.wall_s)


def test_process_cpu_time_grows_with_the_work_a_process_does() -> None:
    before = process_cpu_s(os.getpid())
    assert sum(i * i for i in range(2_000_000)) > 0  # about a tenth of a second of pure CPU
    after = process_cpu_s(os.getpid())
    assert after > before


def test_descendants_cpu_time_counts_a_busy_child() -> None:
    import subprocess
    import sys

    busy = "import sys; sum(i * i for i in range(3_000_000)); print('done', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", busy], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        # The child's CPU is counted while it lives: once it says its busy loop is done (it then
        # waits on stdin), its counters are read, then the sum over every descendant. CPU time only
        # grows, so that sum holds the child's whatever the machine's load.
        assert child.stdout is not None and child.stdout.readline() == b"done\n"
        times = psutil.Process(child.pid).cpu_times()
        own = times.user + times.system
        assert own > 0 and descendants_cpu_s() >= own
    finally:
        child.communicate(b"")


async def test_interleaved_windows_alternate_the_legs_and_time_every_item_in_every_window() -> None:
    """Each leg sees every item once per window after its warm-up, and the legs' order flips per item
    and per window (so no leg always runs first, where a slow spell would land on it alone)."""
    from benchmarks.measure import interleaved_windows, window_ratios

    calls: list[tuple[str, int]] = []

    def leg(name: str):  # type: ignore[no-untyped-def]
        async def run(item: int) -> None:
            calls.append((name, item))

        return run

    times = await interleaved_windows({"a": leg("a"), "b": leg("b")}, [0, 1, 2], windows=2, warmup=1)
    assert calls[:2] == [("a", 0), ("b", 0)]  # the warm-up
    timed = calls[2:]
    assert timed == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2),
                     ("b", 0), ("a", 0), ("a", 1), ("b", 1), ("b", 2), ("a", 2)]  # fmt: skip
    assert [len(w) for w in times["a"]] == [3, 3] and [len(w) for w in times["b"]] == [3, 3]
    assert all(isinstance(t, float) for w in times["a"] + times["b"] for t in w)
    assert window_ratios([[2.0, 4.0, 6.0], [1.0]], [[1.0, 2.0, 3.0], [2.0]]) == [2.0, 0.5]
    with pytest.raises(ValueError, match="at least one window"):
        await interleaved_windows({"a": leg("a")}, [], windows=1)


async def test_alternating_passes_reverse_the_order_on_every_other_pass() -> None:
    from benchmarks.measure import alternating_passes

    ran: list[str] = []

    def window(name: str):
        async def run() -> str:
            ran.append(name)
            return f"{name}{len(ran)}"

        return run

    passes = await alternating_passes({"a": window("a"), "b": window("b"), "c": window("c")}, 3)
    assert ran == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    # each pass keyed by name, in the order its windows ran, with what each returned
    assert [list(p.items()) for p in passes] == [
        [("a", "a1"), ("b", "b2"), ("c", "c3")],
        [("c", "c4"), ("b", "b5"), ("a", "a6")],
        [("a", "a7"), ("b", "b8"), ("c", "c9")],
    ]
