"""Which tests ``make test`` runs alone (the exclusive unit) and which beside the others, from their ids."""

from __future__ import annotations

import pytest

from tests.xdist_support import EXCLUSIVE, exclusive, work_unit


@pytest.mark.parametrize(
    "nodeid",
    [
        "tests/e2e/test_spark_ha.py::test_pipelines_ride_out_a_master_failover_and_a_worker_loss_exactly_once",
        "tests/e2e/test_chaos.py::test_process_brokers_with_spark_pipelines_exactly_once",
        "tests/e2e/test_chaos.py::test_faults_inside_a_three_server_ensemble_keep_every_invariant",
        "tests/e2e/test_docker.py::test_cluster_up_kill_a_broker_restart_policy_and_down",
        "tests/integration/test_hard_fence.py::test_x",
        "tests/integration/test_group_protocol.py::test_kill_dash_nine_of_a_worker_process",
    ],
)
def test_heavy_and_timing_sensitive_tests_form_the_exclusive_unit(nodeid: str) -> None:
    assert exclusive(nodeid)
    assert work_unit(nodeid) == EXCLUSIVE


@pytest.mark.parametrize(
    "nodeid",
    [
        "tests/e2e/test_chaos.py::test_in_process_chaos_run_through_the_cli_keeps_every_invariant",
        "tests/e2e/test_chaos.py::test_in_process_brokers_with_wedged_stops_are_killed_and_restarted",
        "tests/e2e/test_chaos.py::test_a_worker_without_its_fence_is_caught",
        "tests/e2e/test_chaos.py::test_ghost_members_and_rewritten_reports_under_reconcile_change_nothing_that_runs",
    ],
)
def test_in_process_chaos_runs_share_the_machine_as_a_unit_of_their_file(nodeid: str) -> None:
    assert not exclusive(nodeid)
    assert work_unit(nodeid) == "tests/e2e/test_chaos.py"


def test_any_other_test_is_a_unit_of_its_file() -> None:
    assert (
        work_unit("tests/integration/test_group_protocol.py::test_join[3]")
        == "tests/integration/test_group_protocol.py"
    )
    assert work_unit("tests/unit/test_layout.py::test_paths") == "tests/unit/test_layout.py"
