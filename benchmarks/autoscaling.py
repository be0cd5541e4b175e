"""Serve's autoscaling shown on a real cluster (issue 25, item 4): 1 replica -> 2 under load -> 1 idle.

The model is configured with ``autoscaling`` (min 1, max 2, on ongoing requests per replica) and
``max_replicas_per_node: 1`` on a two-node :class:`~benchmarks.cluster.LocalRayCluster`, so the second
replica lands on the other node. Short delays (:data:`FAST_SCALING`) keep the measurement short;
production keeps ``serve_config.yaml``'s (10 s up, 300 s down), the mechanism is the same.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from inference.client import SidecarClient, SidecarError

from .cluster import LocalRayCluster

__all__ = ["FAST_SCALING", "replicas_follow_the_load"]

# Upscale after 1 s above the target, downscale after 5 s below it. target_ongoing_requests 1: the
# ingress keeps up to two /embed bundles per possible replica in flight, so a loaded single replica
# has 2 to 4 ongoing requests, above the target, and an idle one has none.
FAST_SCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 1,
    "upscale_delay_s": 1,
    "downscale_delay_s": 5,
}


def _wait_replicas(
    cluster: LocalRayCluster, app: str, deployment: str, count: int, timeout_s: float
) -> tuple[float | None, list[str]]:
    """Seconds until ``deployment`` has exactly ``count`` live replicas (None: not within
    ``timeout_s``), and the nodes they were last seen on."""
    started = time.monotonic()
    nodes: list[str] = []
    while time.monotonic() < started + timeout_s:
        nodes = sorted(r["node"] for r in cluster.placement(app, deployment)["replicas"])
        if len(nodes) == count:
            return round(time.monotonic() - started, 2), nodes
        time.sleep(0.5)
    return None, nodes


async def replicas_follow_the_load(
    cluster: LocalRayCluster,
    url: str,
    model: str,
    *,
    app: str,
    deployment: str,
    callers: int = 16,
    timeout_s: float = 180.0,
) -> dict[str, Any]:
    """From one idle replica: ``callers`` closed-loop ``/embed`` callers until a second replica runs,
    then none until it is gone again. Times from the load's start and end (placement polled)."""
    idle_before, nodes_idle = await asyncio.to_thread(_wait_replicas, cluster, app, deployment, 1, timeout_s)
    stop = asyncio.Event()
    served = failed = 0

    async with SidecarClient(url, max_retries=5, timeout=120) as client:

        async def caller() -> None:
            nonlocal served, failed
            while not stop.is_set():
                try:
                    await client.embed(model, ["The reservoir flooded the valley and the families left."])
                    served += 1
                except SidecarError:
                    failed += 1

        tasks = [asyncio.create_task(caller()) for _ in range(callers)]
        try:
            up_s, nodes_loaded = await asyncio.to_thread(
                _wait_replicas, cluster, app, deployment, 2, timeout_s
            )
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    down_s, nodes_after = await asyncio.to_thread(_wait_replicas, cluster, app, deployment, 1, timeout_s)
    return {
        "autoscaling": FAST_SCALING,
        "callers": callers,
        "idle_replicas_at_start": len(nodes_idle) if idle_before is not None else None,
        # from the load's start until Serve runs a second replica (None: not within timeout_s)
        "scale_up_s": up_s,
        "nodes_under_load": nodes_loaded,
        # from the load's end until one replica is left
        "scale_down_s": down_s,
        "nodes_idle_after": nodes_after,
        "served": served,
        "failed_after_retries": failed,
    }
