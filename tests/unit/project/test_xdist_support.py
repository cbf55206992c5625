"""Which tests ``make test`` runs alone (the exclusive unit) and which beside the others, from their ids."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.xdist_support import EXCLUSIVE, EXCLUSIVE_PATHS, SHARED_PATHS, ExclusiveFirst, exclusive, work_unit

REPO = Path(__file__).resolve().parents[3]


def _test_ids(path: str) -> list[str]:
    """The ids of a test file's module-level test functions, read from its source."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return [f"{path}::{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.mark.parametrize("prefix", EXCLUSIVE_PATHS)
def test_every_exclusive_path_forms_the_exclusive_unit(prefix: str) -> None:
    nodeid = prefix + ("x.py::test_x" if prefix.endswith("/") else "test_x" if prefix.endswith("::") else "")
    assert exclusive(nodeid) and work_unit(nodeid) == EXCLUSIVE


@pytest.mark.parametrize("prefix", EXCLUSIVE_PATHS)
def test_every_exclusive_path_names_a_folder_a_file_or_tests_that_exist(prefix: str) -> None:
    """A test file moved or renamed must take its entry along, or its tests would silently share the machine."""
    path, _, name = prefix.partition("::")
    assert (REPO / path).exists(), f"{prefix}: no {path}"
    if name:
        assert any(i.startswith(prefix) for i in _test_ids(path)), f"{prefix} names no test"


@pytest.mark.parametrize(
    "nodeid",
    [
        "tests/e2e/test_chaos.py::test_process_brokers_with_spark_pipelines_exactly_once",
        "tests/e2e/test_chaos.py::test_process_brokers_with_wedged_stops_halt_before_their_tasks_move_and_come_back",
        "tests/e2e/test_chaos.py::test_faults_inside_a_three_server_ensemble_keep_every_invariant",
        "tests/e2e/test_spark_ha.py::test_pipelines_ride_out_a_master_failover_and_a_worker_loss_exactly_once",
    ],
)
def test_chaos_with_processes_or_an_ensemble_and_spark_stay_exclusive(nodeid: str) -> None:
    assert work_unit(nodeid) == EXCLUSIVE


def test_every_shared_path_names_tests_that_exist_and_share_as_a_unit_of_their_file() -> None:
    """A renamed test must not fall silently out of (or into) the exclusive unit."""
    for prefix in SHARED_PATHS:
        path = prefix.split("::", 1)[0]
        matched = [i for i in _test_ids(path) if i.startswith(prefix)]
        assert matched, f"{prefix} names no test"
        for nodeid in matched:
            assert not exclusive(nodeid) and work_unit(nodeid) == path


def test_any_other_test_is_a_unit_of_its_file() -> None:
    assert work_unit("tests/unit/test_layout.py::test_paths") == "tests/unit/test_layout.py"
    assert work_unit("tests/unit/test_layout.py::test_paths[3]") == "tests/unit/test_layout.py"


def test_the_exclusive_unit_heads_the_work_queue_whatever_order_units_come_in() -> None:
    """xdist fills its queue largest unit first: a file of many fast unit tests would come before the
    exclusive unit, which bounds the suite's wall time and must start at once."""
    queue = ExclusiveFirst()
    for unit in ("tests/unit/test_spec_changes.py", "tests/unit/test_cli_help.py", EXCLUSIVE, "tests/unit/test_a.py"):
        queue[unit] = {}
    assert list(queue) == [
        EXCLUSIVE,
        "tests/unit/test_spec_changes.py",
        "tests/unit/test_cli_help.py",
        "tests/unit/test_a.py",
    ]
    assert queue.popitem(last=False)[0] == EXCLUSIVE
