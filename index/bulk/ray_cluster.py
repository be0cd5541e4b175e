"""Joining the Ray cluster a bulk job runs on (``--ray ADDRESS`` of the image job and the
backfill), and the actor pool its model or writer stage runs in."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "ACTOR_START_TIMEOUT_S",
    "actor_pool",
    "check_start_timeout",
    "connect",
    "is_actor_start_timeout",
    "start_actors_first",
]

#: How long a job waits for its whole actor pool before the first batch (``--ray-start-timeout``).
ACTOR_START_TIMEOUT_S = 120.0


def connect(address: str) -> None:
    """Join the cluster at ``address`` unless this process already has; ``"local"`` starts a
    single-node Ray here (without its dashboard, which a batch job does not need), as the sidecar
    does: tried again when its raylet registers late on a loaded machine
    (:func:`inference.ray_local.start_local_ray`)."""
    import ray

    if ray.is_initialized():
        return
    if address == "local":
        from inference.ray_local import start_local_ray

        start_local_ray(include_dashboard=False)
    else:
        ray.init(address=address)


def actor_pool(size: int) -> Any:
    """A fixed pool of ``size`` actors, with Ray Data's default of two batches in flight per actor.
    One in flight would spread a short job more evenly, but on Ray 2.60 it ran the actors nearly one
    after the other: 1.77x the wall time of the default for 100 batches of 200 ms on two actors
    (``benchmarks/results/2026-12-04/ray-dispatch``). The default's risk, the actor that starts first taking
    every batch while the others start, is what :func:`start_actors_first` removes."""
    import ray

    return ray.data.ActorPoolStrategy(size=size)


def start_actors_first(dataset: Any, timeout_s: float) -> None:
    """Make ``dataset``'s actor stages wait until every actor of their pools has started before the
    first batch, failing after ``timeout_s`` (see :func:`is_actor_start_timeout`) instead of
    running on the actors that fit or waiting forever on a pool the cluster cannot place."""
    dataset.context.wait_for_min_actors_s = check_start_timeout(timeout_s)


def check_start_timeout(timeout_s: float) -> float:
    """``timeout_s`` if it is a positive, finite number of seconds, else ``ValueError``. Ray Data
    reads any value that is not above 0, NaN included, as "do not wait" (and infinity fails its
    ``ray.get``), so a bad value would silently bring back the start this wait exists to prevent."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        raise ValueError(f"--ray-start-timeout must be a positive number of seconds, got {timeout_s:g}")
    return timeout_s


def is_actor_start_timeout(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is Ray Data's timeout waiting for an
    actor pool to start (:func:`start_actors_first`)."""
    import ray

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ray.exceptions.GetTimeoutError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
