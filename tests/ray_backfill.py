"""Run ``mnemo backfill ... --ray ADDRESS`` against a local two-node ``ray.cluster_utils.Cluster``
(a subprocess of the test: the test process already hosts the sidecar's Ray instance, and a
process joins one Ray cluster).

``python -m tests.ray_backfill -- BACKFILL_ARGS...`` starts the cluster (one CPU per node) and
runs the command twice with ``--ray`` set to its address: first with three one-CPU writers, which
the cluster cannot place, and a short start timeout; then with two, one per node. It prints the
command's own JSON report, then a last line with both exit codes, what the first run said on
stderr, and the number of live nodes.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


def main() -> None:
    from gateway.cli import main as mnemo
    from tests.ray_two_nodes import two_node_cluster

    args = sys.argv[sys.argv.index("--") + 1 :]
    with two_node_cluster() as (address, nodes):
        ray_args = ["backfill", *args, "--ray", address, "--no-progress"]
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            unplaceable = mnemo([*ray_args, "--ray-writers", "3", "--ray-start-timeout", "2"])
        code = mnemo([*ray_args, "--ray-writers", "2"])
        print(
            json.dumps(
                {"unplaceable": {"exit": unplaceable, "said": said.getvalue()}, "exit": code, "nodes": nodes}
            )
        )


if __name__ == "__main__":
    main()
