"""The sidecar on a real two-node Ray cluster (issue 25, item 2): deploy, placement, node loss, rejoin.

Two ``ray start`` nodes on this machine (:class:`benchmarks.cluster.LocalRayCluster`: distinct ports,
temp dirs and custom resources ``node_a`` / ``node_b``), started once for the module. The sidecar
joins it as ``mnemo sidecar --address`` in a subprocess, serving one tiny text model with two
replicas and ``max_replicas_per_node: 1``. Nothing here measures time: the figures (seconds to the
surviving node's throughput, rejoin time) are the reliability suite's.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.cluster import FAST_NODE_DEATH, LocalRayCluster, cluster_sidecar, wait_for_placement
from benchmarks.node_loss import node_lost_under_load, node_rejoined
from inference.client import SidecarClient
from inference.config import config_from_dict
from inference.launcher import APP_NAME
from inference.serve_app import deployment_name
from inference.tiny import build_tiny_model

# The module's fixtures start a cluster and a sidecar on it (a minute or more on a shared machine):
# the safety timeout of each test, with the first one's setup in it, is wider than the default.
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "cluster-tiny-xlmr-random"
DEPLOYMENT = deployment_name(MODEL)
# Safety nets only (a hang becomes a failure, not a stuck run): never speed limits.
PLACEMENT_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    # The lost node is declared dead in about 5 s (FAST_NODE_DEATH), not Ray's 15-25 s of load.
    with LocalRayCluster(cpus_per_node=1, system_config=FAST_NODE_DEATH) as started:
        started.start_head("node_a")
        started.add_node("node_b")
        yield started


@pytest.fixture(scope="module")
def cluster_url(cluster: LocalRayCluster) -> Iterator[str]:
    root = Path(tempfile.mkdtemp(prefix="mnemo-cluster-"))
    try:
        weights = build_tiny_model("tiny-xlmr-sparse", root / "built", seed=0)
        model = {"id": MODEL, "kind": "text", "weights": str(weights), "pooling": "cls"}
        small = {
            "max_batch_size": 8,
            "max_batch_tokens": 1024,
            "max_client_batch": 16,
            "max_queued_items": 64,
        }
        spread = {"replicas": 2, "max_replicas_per_node": 1, "num_cpus": 0.4}
        config = config_from_dict(
            {"models": [{**model, **small, **spread}]}, source="tests/test_ray_cluster.py"
        )
        with cluster_sidecar(cluster, config) as url:
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _replica_nodes(cluster: LocalRayCluster) -> list[str]:
    return sorted(r["node"] for r in cluster.placement(APP_NAME, DEPLOYMENT)["replicas"])


def test_the_two_nodes_run_one_replica_each(cluster: LocalRayCluster, cluster_url: str) -> None:
    """max_replicas_per_node 1 with two replicas: one on each node (read from where each replica's
    process runs), and the sidecar's front on the head answers through them."""
    assert cluster.placement()["nodes"] == {"node_a": True, "node_b": True}
    assert _replica_nodes(cluster) == ["node_a", "node_b"]

    async def embed() -> int:
        async with SidecarClient(cluster_url, max_retries=0) as client:
            return (await client.embed(MODEL, ["a red-figure amphora"] * 3)).embeddings.shape[0]

    assert asyncio.run(embed()) == 3


def test_the_worker_node_lost_under_16_callers_then_rejoining(
    cluster: LocalRayCluster, cluster_url: str
) -> None:
    """The worker node's raylet and workers are SIGKILLed while 16 callers send /embed through
    SidecarClient: no request fails after the client's retries and no caller hangs. The node then
    starts again and a replica returns to it."""
    assert _replica_nodes(cluster) == ["node_a", "node_b"]
    result = asyncio.run(
        node_lost_under_load(
            cluster,
            cluster_url,
            MODEL,
            app=APP_NAME,
            deployment=DEPLOYMENT,
            callers=16,
            warm_s=1.0,
            capacity_window_s=1.0,
        )
    )
    assert result["requests"] > result["callers"], result  # the load really ran across the kill
    assert sum(result["rps_per_second_after_kill"]) > 0, result  # and was served after it
    assert result["failed_after_retries"] == 0, result
    assert result["hung_callers"] == 0, result
    assert _replica_nodes(cluster) == ["node_a"]  # the lost node's replica is gone, not hidden

    rejoined = node_rejoined(cluster, app=APP_NAME, deployment=DEPLOYMENT, timeout_s=PLACEMENT_TIMEOUT_S)
    assert rejoined["replica_nodes"] == ["node_a", "node_b"], rejoined
    assert cluster.placement()["nodes"] == {"node_a": True, "node_b": True}


def test_a_placement_that_never_comes_is_a_timeout_naming_what_was_seen(cluster: LocalRayCluster) -> None:
    """wait_for_placement reports a condition that never holds as a timeout with what it saw
    (the bound that keeps the tests above from hanging)."""
    with pytest.raises(TimeoutError, match="last seen"):
        wait_for_placement(cluster, APP_NAME, DEPLOYMENT, lambda p: "node_c" in p["nodes"], timeout_s=0.1)
