"""A local two-node ``ray.cluster_utils.Cluster`` for the Ray Data jobs' subprocess tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def two_node_cluster() -> Iterator[tuple[str, int]]:
    """Start a head and a second node, one CPU each (so one-CPU actors land on different nodes),
    join it, and yield its address and the number of live nodes; shut both down after."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": 80 * 2**20},
    )
    cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
    try:
        ray.init(address=cluster.address)
        yield cluster.address, len([n for n in ray.nodes() if n["Alive"]])
    finally:
        ray.shutdown()
        cluster.shutdown()
