"""How the suite is spread over pytest-xdist workers (``make test`` runs ``pytest -n 2``).

Each worker is a whole pytest session of its own: its own embedded PostgreSQL, its own Ray Serve
sidecar and its own browser, each started the first time one of its tests asks, on free ports and in
fresh temp folders, so two workers never share a service. What a worker runs is decided here, in
units handed out whole, one at a time, to whichever worker is free:

- **A module is one unit.** Its tests run on one worker, in order, so its module fixtures (a
  cluster, a seeded database, a gateway) start once, as in a serial run.
- **The tests that start a Ray cluster of their own** (:data:`OWN_RAY_CLUSTER`: the two-node
  clusters, `mnemo up` with its own sidecar) are one unit across modules: two such starts never
  run at once, which on two cores would leave each waiting on the other.
- **The slow units go first** (those holding a test marked ``slow``): the longest work starts at
  the beginning, while the other worker still has a queue to work through beside it, never last.

xdist's ``--dist loadgroup`` would say the second rule with markers, but it names a group by
rewriting an item's node id, which pytest 9 no longer reads; the units here are a function of the
node id alone, which the controller (it collects nothing) and the workers both see.

Outside xdist (``-n 0``, or a run of a few files without ``-n``) nothing here changes anything.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

__all__ = ["OWN_RAY_CLUSTER", "unit_of"]

# Tests (a module, or one test of a module) that start a Ray cluster beside the worker's sidecar.
OWN_RAY_CLUSTER = (
    "tests/test_ray_cluster.py",
    "tests/test_backfill.py::test_a_ray_backfill_on_two_nodes_resumes_and_gives_the_drains_rows",
    "tests/test_images_actions.py::test_ray_data_job_writes_the_same_rows_as_the_single_machine_job",
    "tests/test_embedded.py::test_mnemo_up_serves_the_stack_and_stops_everything_on_ctrl_c",
)
OWN_RAY_UNIT = "own Ray cluster"


def unit_of(nodeid: str) -> str:
    """The unit a test runs in: :data:`OWN_RAY_UNIT` for the tests of :data:`OWN_RAY_CLUSTER`
    (parametrized cases included), else its module."""
    for listed in OWN_RAY_CLUSTER:
        if nodeid == listed or nodeid.startswith((listed + "::", listed + "[")):
            return OWN_RAY_UNIT
    return nodeid.split("::", 1)[0]


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduler with :func:`unit_of` as the scope, in the workers' collection order."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown to a run with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> UnitScheduling:
    config.option.loadscopereorder = False  # keep the order the workers collected (slow units first)
    return UnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker's config has it; a serial run keeps its order
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    # Every worker sorts the same collection the same way (the controller checks they agree).
    ordered = sorted(units.values(), key=lambda unit: not any(i.get_closest_marker("slow") for i in unit))
    items[:] = [item for unit in ordered for item in unit]
