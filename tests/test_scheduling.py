"""tests/scheduling.py: the units `make test` hands its xdist workers name tests that exist."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT
from tests.scheduling import OWN_RAY_CLUSTER, OWN_RAY_UNIT, unit_of


def test_every_own_ray_cluster_entry_names_a_module_or_one_of_its_tests() -> None:
    """A renamed test would silently leave the unit and start its cluster beside another one."""
    for listed in OWN_RAY_CLUSTER:
        module, _, name = listed.partition("::")
        path = REPO_ROOT / module
        assert path.is_file(), listed
        if name:
            tree = ast.parse(path.read_text())
            tests = {
                node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in tests, f"{listed}: no test {name} in {module}"


def test_a_listed_test_runs_in_the_shared_unit_and_the_rest_by_module() -> None:
    module = "tests/test_backfill.py"
    (listed,) = [entry for entry in OWN_RAY_CLUSTER if entry.startswith(module + "::")]
    assert (
        unit_of(listed)
        == unit_of(listed + "[case]")
        == unit_of("tests/test_ray_cluster.py::t")
        == OWN_RAY_UNIT
    )
    assert unit_of(f"{module}::test_something_else") == module
    assert unit_of(f"{listed}_longer_name") == module  # a prefix of a name is not the name
