"""A worker node of a real Ray cluster lost under load, and its rejoining (issue 25, item 2).

:func:`node_lost_under_load`: closed-loop callers send ``/embed`` through :class:`SidecarClient` (its
retries, as the gateway and the drain use it) to a sidecar whose model replicas are spread over the
nodes of a :class:`~benchmarks.cluster.LocalRayCluster`; one worker node is killed (its whole process
group: raylet, agents, workers) while they run. Counted: requests failed after the client's retries,
callers that never got an answer within a safety timeout (hung), 5xx answers the sidecar gave (its
``/metrics``), and completions per second around the kill, from which the seconds until throughput
is back to the surviving node's capacity (measured in the same run, once Ray has declared the node
dead and only the survivor's replicas serve): the first second after the kill from which three
seconds average 80 % of that capacity.

:func:`node_rejoined`: the killed node started again; seconds until it is alive and until a replica
of the model runs on it again.

The test (``tests/test_ray_cluster.py``) asserts the counts; the reliability suite reports the times
(:func:`cluster_faults`, with Serve's autoscaling shown on the same cluster).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from inference.client import SidecarClient, SidecarError
from inference.config import ModelSpec, SidecarConfig
from inference.launcher import APP_NAME
from inference.serve_app import deployment_name

from .autoscaling import FAST_SCALING, replicas_follow_the_load
from .cluster import LocalRayCluster, cluster_sidecar, wait_for_placement
from .measure import metric_samples, percentile

__all__ = ["cluster_faults", "node_lost_under_load", "node_rejoined", "server_errors_answered"]

_TEXTS = (
    "The reservoir flooded the valley and the families left their farms.",
    "Silver coins of the third century were found near the old mill.",
)


async def server_errors_answered(url: str) -> int:
    """5xx answers the sidecar at ``url`` has given since it started (``mnemo_sidecar_requests_total``)."""
    samples = await metric_samples(url, "mnemo_sidecar_requests")
    return int(
        sum(
            s.value
            for s in samples
            if s.name.endswith("_total") and s.labels.get("status", "").startswith("5")
        )
    )


def _per_second(done: list[float], start: float, end: float) -> list[int]:
    """Completions in each whole second from ``start`` to ``end``."""
    bins = [0] * max(0, int(end - start))
    for t in done:
        i = int(t - start)
        if 0 <= i < len(bins):
            bins[i] += 1
    return bins


async def node_lost_under_load(
    cluster: LocalRayCluster,
    url: str,
    model: str,
    *,
    app: str,
    deployment: str,
    node: str = "node_b",
    callers: int = 16,
    warm_s: float = 5.0,
    capacity_window_s: float = 3.0,
    death_timeout_s: float = 120.0,
    safety_timeout_s: float = 120.0,
    max_retries: int = 5,
) -> dict[str, Any]:
    """Kill ``node`` while ``callers`` send ``/embed``; see the module docstring for the figures.

    The load runs ``warm_s`` before the kill, then until the cluster lists ``node`` dead and only
    replicas off it answer (bounded by ``death_timeout_s``), then ``capacity_window_s`` more: the
    surviving capacity. A call without an answer after ``safety_timeout_s`` is a hung caller (a safety
    net that turns a hang into a figure, not a speed limit).
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    done: list[float] = []  # loop time of each successful request
    took: list[tuple[float, float]] = []  # (sent, seconds to its answer, retries included)
    failures: list[str] = []
    hung = 0
    async with SidecarClient(url, max_retries=max_retries, timeout=safety_timeout_s) as client:
        errors_before = await server_errors_answered(url)

        async def caller(i: int) -> None:
            nonlocal hung
            while not stop.is_set():
                sent = loop.time()
                try:
                    await asyncio.wait_for(client.embed(model, [_TEXTS[i % 2]]), safety_timeout_s)
                    done.append(loop.time())
                    took.append((sent, loop.time() - sent))
                except TimeoutError:
                    hung += 1
                    return  # a hung caller stays counted once
                except SidecarError as exc:
                    failures.append(f"{type(exc).__name__}: {exc}"[:300])

        tasks = [asyncio.create_task(caller(i)) for i in range(callers)]
        try:
            started = loop.time()
            await asyncio.sleep(warm_s)
            killed_at = loop.time()
            await asyncio.to_thread(cluster.kill_node, node)
            await asyncio.to_thread(_wait_survivors_only, cluster, node, app, deployment, death_timeout_s)
            dead_at = loop.time()
            await asyncio.sleep(capacity_window_s)
            ended = loop.time()
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        errors_after = await server_errors_answered(url)
    after_kill = [seconds for sent, seconds in took if sent + seconds >= killed_at]
    return {
        "callers": callers,
        "requests": len(done) + len(failures),
        # requests answered after the kill (in flight at it, or sent later), retries included
        "p99_after_kill_s": round(percentile(after_kill, 99), 2) if after_kill else None,
        "slowest_request_s": round(max(seconds for _, seconds in took), 2) if took else None,
        "failed_after_retries": len(failures),
        "failures": failures[:5],
        "hung_callers": hung,
        "server_errors_answered": errors_after - errors_before,
        "client_retries": max_retries,
        **_recovery(done, started, killed_at, dead_at, ended),
    }


def _wait_survivors_only(
    cluster: LocalRayCluster, node: str, app: str, deployment: str, timeout_s: float
) -> None:
    """Until the cluster lists ``node`` dead and no replica of ``deployment`` remains on it."""

    def survivors_only(seen: dict[str, Any]) -> bool:
        return not seen["nodes"].get(node) and all(r["node"] != node for r in seen["replicas"])

    wait_for_placement(cluster, app, deployment, survivors_only, timeout_s)


def _recovery(
    done: list[float], started: float, killed_at: float, dead_at: float, ended: float
) -> dict[str, Any]:
    """Throughput around the kill from each success's time: requests/s before it, the surviving
    node's alone (from the node's death to the end), each second's after the kill, when the node was
    declared dead, and how throughput came back.

    Back to the survivor's capacity: the first second after the kill that opens three whose mean
    reaches 80 % of it (three: one second on a shared machine is noise). Outage seconds: those that
    served under half of it, anywhere after the kill (noise included)."""
    before = _per_second(done, started, killed_at)
    after = _per_second(done, killed_at, ended)
    surviving = sum(1 for t in done if dead_at <= t < ended) / max(ended - dead_at, 1e-9)
    back_s = next(
        (i for i in range(max(0, len(after) - 2)) if sum(after[i : i + 3]) / 3 >= 0.8 * surviving),
        None,
    )
    return {
        "rps_before_kill": round(sum(before) / max(len(before), 1), 1),
        "rps_surviving_node": round(surviving, 1),
        "rps_per_second_after_kill": after,
        # from the kill until Ray lists the node dead and no replica of the model remains on it
        "node_declared_dead_s": round(dead_at - killed_at, 2),
        # from the kill until throughput is back at the surviving node's capacity (None: never)
        "seconds_to_surviving_throughput": back_s,
        "outage_seconds": sum(1 for n in after if n < 0.5 * surviving),
    }


def node_rejoined(
    cluster: LocalRayCluster, *, app: str, deployment: str, node: str = "node_b", timeout_s: float = 300.0
) -> dict[str, Any]:
    """Start the killed ``node`` again; seconds until it runs and until a replica runs on it again."""
    started = time.monotonic()
    cluster.restart_node(node)
    alive = time.monotonic()
    seen = wait_for_placement(
        cluster, app, deployment, lambda p: any(r["node"] == node for r in p["replicas"]), timeout_s
    )
    return {
        "node_started_s": round(alive - started, 2),
        "replica_back_s": round(time.monotonic() - started, 2),
        "replica_nodes": sorted(r["node"] for r in seen["replicas"]),
    }


async def cluster_faults(spec: ModelSpec, *, callers: int = 16) -> dict[str, Any]:
    """The reliability suite's cluster part: a two-node cluster serving ``spec`` with two replicas,
    one per node; the worker node killed under ``callers`` and rejoining; then the same model with
    :data:`~benchmarks.autoscaling.FAST_SCALING`, 1 -> 2 -> 1 replicas. The cluster is this call's."""
    app, deployment = APP_NAME, deployment_name(spec.id)
    spread = dataclasses.replace(spec, replicas=2, max_replicas_per_node=1, num_cpus=0.4, torch_threads=1)
    scaling = dataclasses.replace(spread, autoscaling=dict(FAST_SCALING))
    out: dict[str, Any] = {"model": spec.id}
    with LocalRayCluster(cpus_per_node=1) as cluster:
        await asyncio.to_thread(cluster.start_head, "node_a")
        await asyncio.to_thread(cluster.add_node, "node_b")
        with cluster_sidecar(cluster, SidecarConfig(models=(spread,))) as url:
            seen = await asyncio.to_thread(cluster.placement, app, deployment)
            out["placed_on"] = sorted(r["node"] for r in seen["replicas"])
            out["node_lost"] = await node_lost_under_load(
                cluster, url, spec.id, app=app, deployment=deployment, callers=callers
            )
            try:
                out["rejoined"] = await asyncio.to_thread(
                    node_rejoined, cluster, app=app, deployment=deployment
                )
            except (RuntimeError, TimeoutError) as exc:  # the node-loss figures above still stand
                out["rejoined"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                return out  # autoscaling needs the second node
        with cluster_sidecar(cluster, SidecarConfig(models=(scaling,))) as url:
            out["autoscaling"] = await replicas_follow_the_load(
                cluster, url, spec.id, app=app, deployment=deployment, callers=callers
            )
    return out
