"""Timing primitives shared by every suite: warm-up, repeats, percentiles, ratios.

These machines are shared and noisy, so a figure is never one sample: each is
measured over repeats after warm-up and reported as min / median / p95, and
every headline figure is printed beside a baseline measured in the same run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class Summary:
    """Distribution of a repeated measurement (seconds, or any unit the caller uses)."""

    n: int
    min: float
    median: float
    p95: float
    p99: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def percentile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def tie_aware_recall(got: Sequence[tuple[Any, float]], exact: Sequence[tuple[Any, float]]) -> float:
    """Recall of ``got`` against the exact top k ``exact``, both ``(key, distance)`` in rank order
    (lower is nearer). A hit counts when its key is in the exact set or its distance reaches the
    k-th exact distance: among equal distances, which key the exact scan keeps is arbitrary."""
    if not exact:
        return 1.0
    floor = exact[-1][1] + 1e-6
    truth = {key for key, _ in exact}
    return sum(1 for key, distance in got[: len(exact)] if key in truth or distance <= floor) / len(exact)


def p50_p99_ms(samples: Sequence[float]) -> dict[str, float]:
    """The median and p99 of ``samples`` (seconds) in milliseconds, as the reports print them."""
    return {"p50_ms": percentile(samples, 50) * 1e3, "p99_ms": percentile(samples, 99) * 1e3}


def summarize(samples: Sequence[float]) -> Summary:
    return Summary(
        n=len(samples),
        min=min(samples),
        median=statistics.median(samples),
        p95=percentile(samples, 95),
        p99=percentile(samples, 99),
        max=max(samples),
    )


@dataclass(frozen=True)
class LoadResult:
    """A closed-loop load run: ``concurrency`` workers issuing ``requests`` calls in total."""

    concurrency: int
    requests: int
    items_per_request: int
    wall_s: float
    latency: Summary

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.wall_s

    @property
    def items_per_s(self) -> float:
        return self.requests * self.items_per_request / self.wall_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "items_per_request": self.items_per_request,
            "wall_s": self.wall_s,
            "requests_per_s": self.requests_per_s,
            "items_per_s": self.items_per_s,
            "latency_s": self.latency.as_dict(),
        }


async def closed_loop(
    call: Callable[[int], Awaitable[Any]],
    *,
    concurrency: int,
    requests: int,
    items_per_request: int = 1,
    max_seconds: float = 60.0,
) -> LoadResult:
    """Run ``requests`` calls with ``concurrency`` in flight; stop early after ``max_seconds``.

    Bounded in count and time so a load test always ends by itself.
    """
    latencies: list[float] = []
    counter = iter(range(requests))
    deadline = time.perf_counter() + max_seconds

    async def worker() -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            start = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return LoadResult(concurrency, len(latencies), items_per_request, wall, summarize(latencies))


async def alternating_passes(
    windows: Mapping[str, Callable[[], Awaitable[T]]], passes: int
) -> list[dict[str, T]]:
    """``passes`` passes over named windows, in their order on even passes and reversed on odd ones
    (A B C, then C B A, ...), so a drift of a shared machine falls on every path alike: each pass's
    results, keyed by name in the order they ran. The interleaving of every paired headline."""
    names = list(windows)
    out: list[dict[str, T]] = []
    for k in range(passes):
        out.append({name: await windows[name]() for name in (names if k % 2 == 0 else names[::-1])})
    return out


async def interleaved_windows(
    legs: Mapping[str, Callable[[Any], Awaitable[Any]]],
    items: Sequence[Any],
    windows: int,
    *,
    warmup: int = 5,
) -> dict[str, list[list[float]]]:
    """Each leg's latency (seconds) per item, per window: ``{leg: [window's times, ...]}``.

    Within a window every item runs on every leg back to back, the legs' order reversed on every
    other item and window, so a slow spell of a shared machine falls on every leg alike rather than
    on whichever leg's block it hits. Each leg first runs the first ``warmup`` items untimed.
    """
    if windows < 1 or not items:
        raise ValueError("interleaved_windows needs at least one window and one item")
    names = list(legs)
    for item in items[:warmup]:
        for name in names:
            await legs[name](item)
    times: dict[str, list[list[float]]] = {name: [] for name in names}
    for window in range(windows):
        for name in names:
            times[name].append([])
        for i, item in enumerate(items):
            for name in names if (i + window) % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                await legs[name](item)
                times[name][-1].append(time.perf_counter() - start)
    return times


def window_ratios(
    value: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]], q: float = 50
) -> list[float]:
    """Per window, the ``q``-th percentile of ``value``'s times over ``baseline``'s (same windows)."""
    return [ratio(percentile(v, q), percentile(b, q)) for v, b in zip(value, baseline, strict=True)]


def spread(values: Sequence[float]) -> tuple[float, float]:
    """The lowest and highest of a figure measured more than once (a headline's spread)."""
    return (min(values), max(values))


def rss_bytes() -> int:
    """This process's resident memory (bytes): before and after a load, what the load kept."""
    return psutil.Process().memory_info().rss


def ratio(value: float, baseline: float) -> float:
    """value / baseline, guarding a zero baseline."""
    return float("nan") if baseline == 0 else value / baseline


def knee(xs: Sequence[float], ys: Sequence[float], *, gain: float = 0.10) -> float | None:
    """The first x after which y stops improving by at least ``gain`` (relative) per step.

    For throughput-vs-concurrency curves this is where adding load stops paying.
    """
    for i in range(1, len(xs)):
        if ys[i - 1] > 0 and (ys[i] - ys[i - 1]) / ys[i - 1] < gain:
            return xs[i - 1]
    return None


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system, seconds) a process and its live descendants (the workers of
    ``mnemo gateway --workers N``) have used so far; the difference over a window divided by the
    requests it served is its CPU per request, a figure a busy neighbour on a shared machine moves
    far less than a latency."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def metric_samples(url: str, family: str, token: str | None = None) -> list[Any]:
    """The samples of metric ``family`` a service at ``url`` exposes on ``/metrics`` now (every
    worker's), each with its ``name``, ``labels`` and ``value``."""
    import aiohttp
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with aiohttp.ClientSession(headers=headers) as http, http.get(url + "/metrics") as response:
        text = await response.text()
    return [s for f in text_string_to_metric_families(text) if f.name == family for s in f.samples]


def folder_mib(folder: Path) -> float:
    """The size of the files under ``folder``, in MiB (an index on disk)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def tree_memory(pid: int) -> dict[str, Any]:
    """RSS, USS and PSS (MiB) of a process and each of its descendants (a gateway command and its
    workers), and their PSS in all: mapped index pages shared by the workers count once."""
    root = psutil.Process(pid)
    rows = []
    for p in [root, *root.children(recursive=True)]:
        try:
            m = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rows.append(
            {"pid": p.pid, "rss_mib": m.rss / 2**20, "uss_mib": m.uss / 2**20, "pss_mib": m.pss / 2**20}
        )
    return {"processes": rows, "pss_mib": sum(r["pss_mib"] for r in rows)}


def descendants_cpu_s() -> float:
    """CPU time (user + system, seconds) of this process's live descendants: the server under test
    when a benchmark started it (a Ray sidecar's raylet, workers and replicas; a peer's process).
    A process that exits inside a window takes its CPU with it, so a window's figure is a floor."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total += times.user + times.system
    return total


def cpu_by_process() -> dict[int, tuple[str, float]]:
    """Every process's command line and CPU time so far (user + system, seconds): two snapshots
    around a window give where the machine's cores went (:func:`cores_used`)."""
    out: dict[int, tuple[str, float]] = {}
    for p in psutil.process_iter(["cmdline", "name", "cpu_times"]):
        times = p.info["cpu_times"]
        if times is not None:
            out[p.pid] = (" ".join(p.info["cmdline"] or [p.info["name"] or ""]), times.user + times.system)
    return out


def cpu_used(
    before: Mapping[int, tuple[str, float]],
    after: Mapping[int, tuple[str, float]],
    group: Callable[[int, str], str],
) -> dict[str, float]:
    """CPU seconds each group (``group(pid, command line)``) used between two :func:`cpu_by_process`
    snapshots. A process started inside the window counts from zero; one that ended inside it is
    not seen, so each figure is a floor."""
    out: dict[str, float] = {}
    for pid, (command, cpu_s) in after.items():
        prior = before.get(pid)
        used = cpu_s - (prior[1] if prior is not None and prior[0] == command else 0.0)
        name = group(pid, command)
        out[name] = out.get(name, 0.0) + used
    return out


def cores_used(
    before: Mapping[int, tuple[str, float]],
    after: Mapping[int, tuple[str, float]],
    wall_s: float,
    group: Callable[[int, str], str],
) -> dict[str, float]:
    """Cores each group used between two :func:`cpu_by_process` snapshots ``wall_s`` apart
    (:func:`cpu_used` over the wall time)."""
    return {name: used / wall_s for name, used in cpu_used(before, after, group).items()}
