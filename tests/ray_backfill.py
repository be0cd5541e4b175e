"""Run ``mnemo backfill ... --ray ADDRESS`` against a local two-node ``ray.cluster_utils.Cluster``
(a subprocess of the test: the test process already hosts the sidecar's Ray instance, and a
process joins one Ray cluster).

``python -m tests.ray_backfill -- BACKFILL_ARGS...`` starts the cluster, runs the command with
``--ray`` set to its address, and prints its exit code and the number of live nodes, then the
command's own JSON report on the lines before.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from gateway.cli import main as mnemo
    from tests.ray_two_nodes import two_node_cluster

    args = sys.argv[sys.argv.index("--") + 1 :]
    with two_node_cluster() as (address, nodes):  # one CPU per node and per writer: one writer each
        code = mnemo(["backfill", *args, "--ray", address, "--ray-writers", "2", "--no-progress"])
        print(json.dumps({"exit": code, "nodes": nodes}))


if __name__ == "__main__":
    main()
