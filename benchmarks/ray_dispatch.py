"""Batches in flight per actor in a Ray bulk job: the pool of ``index.bulk.ray_cluster.actor_pool``
(Ray Data's default, two per actor) against one per actor.

One in flight would spread a short job's batches more evenly over the actors. This measures what it
costs: a job of ``batches`` batches on ``actors`` actors whose work per batch is ``work_s`` of
waiting (a backfill writer mostly waits for the sidecar and PostgreSQL), fed from the driver's items
as the backfill and the image job are, run alternately with both settings on a local Ray. Each
variant waits for its whole pool before its first batch, as the product does. Reported: each
variant's wall time per pass (actor start included), the ratio one-in-flight / pool (1.0 = no
cost) with the passes' spread, and how many batches each actor took.

``python -m benchmarks.ray_dispatch [--batches 100] [--work-ms 200] [--passes 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import time
from collections import Counter
from typing import Any

import numpy as np

from index.bulk.ray_cluster import actor_pool, start_actors_first

from .measure import alternating_passes, ratio, spread

__all__ = ["run"]


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

    compute: Any = (
        ray.data.ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1)
        if one_in_flight
        else actor_pool(actors)
    )
    # From the driver's items, as the backfill's keys and the image job's manifest rows are.
    ds = ray.data.from_items([{"i": i} for i in range(batches)]).map_batches(
        _Waiter, batch_size=1, compute=compute, num_cpus=0.5, fn_constructor_kwargs={"work_s": work_s}
    )
    start_actors_first(ds, 60)
    taken: Counter[int] = Counter()
    started = time.perf_counter()
    for out in ds.iter_batches(batch_size=None, batch_format="numpy"):
        taken.update(int(a) for a in out["actor"])
    return time.perf_counter() - started, sorted(taken.values())


def run(*, batches: int = 100, actors: int = 2, work_s: float = 0.2, passes: int = 3) -> dict[str, Any]:
    """Alternate the two variants ``passes`` times each (A B, then B A, ...) on a local Ray."""
    import ray

    variants = {
        name: functools.partial(
            asyncio.to_thread, _pass, batches, actors, work_s, one_in_flight=name == "one_in_flight"
        )
        for name in ("one_in_flight", "pool")
    }
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        _pass(4, actors, 0.0, one_in_flight=True)  # warm-up: worker processes, imports
        runs = asyncio.run(alternating_passes(variants, passes))
    finally:
        ray.shutdown()
    seconds = {name: [p[name][0] for p in runs] for name in variants}
    taken = {name: [p[name][1] for p in runs] for name in variants}
    ratios = [ratio(a, b) for a, b in zip(seconds["one_in_flight"], seconds["pool"], strict=True)]
    ideal = batches * work_s / actors
    return {
        "batches": batches,
        "actors": actors,
        "work_s": work_s,
        "ideal_s": ideal,
        "seconds": seconds,
        "batches_per_actor": taken,
        "one_in_flight_over_pool": float(np.median(ratios)),
        "spread": spread(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--work-ms", type=float, default=200.0)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    print(
        json.dumps(
            run(batches=args.batches, actors=args.actors, work_s=args.work_ms / 1000, passes=args.passes),
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
