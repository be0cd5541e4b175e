"""Batches in flight per actor in a Ray bulk job, the scale suite's ray section: the pool of
``index.bulk.ray_cluster.actor_pool`` (Ray Data's default, two per actor) against one per actor, on
the run's Ray (the bench sidecar's, or a local one started here). One in flight would spread a short
job's batches more evenly; this measures what it costs (benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter
from typing import Any

import numpy as np

from .measure import alternating_passes, ratio, spread
from .report import Headline, SuiteResult, Table

__all__ = ["add_dispatch_result", "measure_dispatch"]


class _Waiter:
    """A stand-in writer: waits ``work_s`` per batch and says which actor took it."""

    def __init__(self, work_s: float) -> None:
        self.work_s = work_s
        self.pid = os.getpid()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.work_s)
        return {"actor": np.array([self.pid])}


def _pass(batches: int, actors: int, work_s: float, *, one_in_flight: bool) -> tuple[float, list[int]]:
    import ray

    from index.bulk.ray_cluster import actor_pool, start_actors_first

    compute: Any = (
        ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1)
        if one_in_flight
        else actor_pool(actors)
    )
    # From the driver's items, as the backfill's keys and the image job's manifest rows are.
    ds = ray.data.from_items([{"i": i} for i in range(batches)]).map_batches(
        # A tenth of a CPU token each: the actors sleep, and the sidecar's replicas hold most of the run's tokens.
        _Waiter,
        batch_size=1,
        compute=compute,
        num_cpus=0.1,
        fn_constructor_kwargs={"work_s": work_s},
    )
    start_actors_first(ds, 60)
    taken: Counter[int] = Counter()
    started = time.perf_counter()
    for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
        taken.update(int(a) for a in out["actor"])
    return time.perf_counter() - started, sorted(taken.values())


async def measure_dispatch(*, batches: int, actors: int = 2, work_s: float, passes: int) -> dict[str, Any]:
    """Alternate the two variants ``passes`` times each (A B, then B A, ...)."""
    import ray

    from index.bulk.ray_cluster import connect

    started_ray = not ray.is_initialized()
    connect("local")  # the bench sidecar's Ray when this run started one
    variants = {
        name: functools.partial(
            asyncio.to_thread, _pass, batches, actors, work_s, one_in_flight=name == "one_in_flight"
        )
        for name in ("one_in_flight", "pool")
    }
    try:
        await asyncio.to_thread(_pass, 4, actors, 0.0, one_in_flight=True)  # warm-up: workers, imports
        runs = await alternating_passes(variants, passes)
    finally:
        if started_ray:
            ray.shutdown()
    seconds = {name: [p[name][0] for p in runs] for name in variants}
    ratios = [ratio(a, b) for a, b in zip(seconds["one_in_flight"], seconds["pool"], strict=True)]
    return {
        "batches": batches, "actors": actors, "work_s": work_s, "ideal_s": batches * work_s / actors,
        "seconds": seconds, "batches_per_actor": {name: [p[name][1] for p in runs] for name in variants},
        "one_in_flight_over_pool": float(np.median(ratios)), "spread": spread(ratios),
    }  # fmt: skip


def add_dispatch_result(suite: SuiteResult, result: dict[str, Any]) -> None:
    """The ratio as a headline (wall time with one batch in flight over the pool's), and a table."""
    suite.headlines.append(Headline(
        f"Ray job wall time, 1 batch in flight per actor ({result['batches']} batches of "
        f"{result['work_s'] * 1000:g} ms, {result['actors']} actors)", float(np.median(result["seconds"]["one_in_flight"])),
        "s", "Ray Data's pool (2 in flight), alternating passes", float(np.median(result["seconds"]["pool"])),
        higher_is_better=False, spread=result["spread"],
    ))  # fmt: skip
    suite.tables.append(Table(
        f"Ray bulk job: batches in flight per actor (ideal {result['ideal_s']:.1f} s)",
        ["variant", "seconds per pass", "batches per actor, per pass"],
        [[name, ", ".join(f"{x:.2f}" for x in result["seconds"][name]), str(result["batches_per_actor"][name])]
         for name in result["seconds"]],
    ))  # fmt: skip
    suite.figures["ray_dispatch"] = result
