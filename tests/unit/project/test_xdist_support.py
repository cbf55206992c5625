"""Which tests ``make test`` counts as heavy (at most two processes on them at once), which as light, from their
ids, and the order and limit its processes take them in."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.xdist_support import (
    GROUPS,
    HEAVIEST_FIRST,
    HEAVY,
    HEAVY_PATHS,
    SHARED_PATHS,
    HeaviestFirst,
    heavy,
    next_unit,
    work_unit,
)

REPO = Path(__file__).resolve().parents[3]


def _test_ids(path: str) -> list[str]:
    """The ids of a test file's module-level test functions, read from its source."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    return [f"{path}::{n.name}" for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


@pytest.mark.parametrize("prefix", HEAVY_PATHS)
def test_every_heavy_path_forms_heavy_units(prefix: str) -> None:
    nodeid = prefix + ("x.py::test_x" if prefix.endswith("/") else "test_x" if prefix.endswith("::") else "")
    assert heavy(nodeid) and work_unit(nodeid).startswith(HEAVY)


@pytest.mark.parametrize("prefix", HEAVY_PATHS)
def test_every_heavy_path_names_a_folder_a_file_or_tests_that_exist(prefix: str) -> None:
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
def test_chaos_with_processes_or_an_ensemble_and_spark_stay_heavy(nodeid: str) -> None:
    assert work_unit(nodeid) == HEAVY + nodeid.split("::")[0]


def test_every_shared_path_names_tests_that_exist_and_share_as_a_unit_of_their_file() -> None:
    """A renamed test must not fall silently out of (or into) the heavy units."""
    for prefix in SHARED_PATHS:
        path = prefix.split("::", 1)[0]
        matched = [i for i in _test_ids(path) if i.startswith(prefix)]
        assert matched, f"{prefix} names no test"
        for nodeid in matched:
            assert not heavy(nodeid) and work_unit(nodeid) == path


def test_any_other_test_is_a_unit_of_its_file() -> None:
    assert work_unit("tests/unit/test_layout.py::test_paths") == "tests/unit/test_layout.py"
    assert work_unit("tests/unit/test_layout.py::test_paths[3]") == "tests/unit/test_layout.py"


def test_grouped_files_form_one_heavy_unit_and_exist() -> None:
    """The files of a group run on one process, in one unit; every container file is in a group."""
    containers = {str(p.relative_to(REPO)) for p in (REPO / "tests/e2e").glob("test_docker*.py")}
    assert containers and containers <= set(GROUPS), containers - set(GROUPS)
    for path, group in GROUPS.items():
        assert (REPO / path).exists(), path
        assert work_unit(f"{path}::test_x") == HEAVY + group


def test_every_heaviest_first_hint_names_a_unit_that_exists() -> None:
    groups = {HEAVY + g for g in GROUPS.values()}
    for unit in HEAVIEST_FIRST:
        assert unit in groups or (REPO / unit.removeprefix(HEAVY)).exists(), unit


def test_heavy_units_head_the_work_queue_heaviest_first_whatever_order_units_come_in() -> None:
    """xdist fills its queue largest unit first by number of tests: a file of many fast unit tests would come
    before the heavy units, which bound the suite's wall time and must start at once."""
    queue = HeaviestFirst()
    units = (
        "tests/unit/test_spec_changes.py",
        HEAVY + "tests/e2e/test_zz.py",
        "tests/unit/test_cli_help.py",
        HEAVIEST_FIRST[1],
        HEAVIEST_FIRST[0],
        "tests/unit/test_a.py",
    )
    for unit in units:
        queue[unit] = {}
    assert list(queue) == [
        HEAVIEST_FIRST[0],
        HEAVIEST_FIRST[1],
        HEAVY + "tests/e2e/test_zz.py",
        "tests/unit/test_spec_changes.py",
        "tests/unit/test_cli_help.py",
        "tests/unit/test_a.py",
    ]


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("elsewhere", [0, 1, 2, 3])
def test_a_process_takes_a_heavy_unit_only_while_fewer_than_the_limit_hold_one(limit: int, elsewhere: int) -> None:
    queue = [HEAVY + "a", HEAVY + "b", "light-1", "light-2"]
    taken = next_unit(queue, elsewhere, limit)
    assert taken == (HEAVY + "a" if elsewhere < limit else "light-1")


def test_with_only_heavy_units_left_a_process_past_the_limit_takes_nothing() -> None:
    assert next_unit([HEAVY + "a"], heavy_elsewhere=2, limit=2) is None
    assert next_unit([HEAVY + "a"], heavy_elsewhere=1, limit=2) == HEAVY + "a"
    assert next_unit([], heavy_elsewhere=0, limit=2) is None
