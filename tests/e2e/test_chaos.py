"""Chaos runs in CI (bounded): a seeded schedule covering every fault kind against in-process brokers
(through the CLI, ``--json``), one against process brokers running Spark streaming pipelines (kill -9,
SIGSTOP/SIGCONT and controller processes for real; sinks hold every record exactly once), and the checker's
teeth: a worker whose fence is disabled is caught double-owning; hostile members (ghosts, rewritten reports)
under reconcile. (The schedule's determinism and each verdict
failing on data that breaks it, without a cluster: tests/unit/chaos/test_checks.py.)

Faults inside a three-server ensemble (leader and follower kills, a lost quorum, a server cut off from its
peers). Longer runs and their figures: docs/reliability.md."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from broker_sim.chaos import ChaosOptions, format_summary, run_chaos
from broker_sim.runners.spark import DEFAULT_STOP_BUDGET_S
from broker_sim.worker.deadline import DeadlineWatchdog
from broker_sim.worker.fence import Fence
from cli.main import cli
from tests.chaos_support import IN_PROCESS_KINDS

WEDGED_KINDS = ("wedged-stop", "kill-broker", "partition-broker", "freeze-broker")
PROCESS_KINDS = (
    "kill-broker",
    "freeze-broker",
    "kill-controller",
    "freeze-controller",
    "expire-broker",
    "rolling-bounce",
)


def test_in_process_chaos_run_through_the_cli_keeps_every_invariant():
    res = CliRunner().invoke(
        cli,
        [
            "sim",
            "chaos",
            "--seed",
            "6",
            "--duration",
            "30",
            "--brokers",
            "3",
            "--tasks",
            "20",
            "--mean-gap",
            "1.5",
            "--faults",
            ",".join(IN_PROCESS_KINDS),
            "--json",
        ],
    )
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert set(summary["faults_injected"]) == set(IN_PROCESS_KINDS), summary["faults_injected"]
    assert summary["faults_failed"] == []
    assert summary["ok"] and res.exit_code == 0, json.dumps(summary["verdicts"], indent=1)
    assert summary["rebalances"] > 0 and summary["controller_epochs"][-1] > summary["controller_epochs"][0]


@pytest.mark.slow
def test_process_brokers_with_spark_pipelines_exactly_once():
    """Broker processes on the spark runner (one JVM each, in their process group) and controller processes:
    kill -9, SIGSTOP, session expiry, controller kill and freeze, a rolling bounce by controlled shutdown,
    while a generator feeds a streaming file pipeline. Every invariant holds, and the sink holds every
    generated record exactly once (read through its ``_spark_metadata`` commit log). The session timeout is
    twice the spark runner's stop budget, as the worker asks (see ``broker_sim.worker.fence_margin``): a
    partitioned broker stops its query before its session can expire."""
    summary = run_chaos(
        ChaosOptions(
            seed=4879,
            duration_s=60,
            brokers=2,
            tasks=6,
            mean_gap_s=2.0,
            kinds=PROCESS_KINDS,
            process_brokers=True,
            pipelines=1,
            records=1500,
            session_timeout_s=2 * DEFAULT_STOP_BUDGET_S,
        )
    )
    assert set(summary.faults_injected) == set(PROCESS_KINDS), summary.faults_injected
    assert summary.faults_failed == []
    assert summary.ok, "\n".join(f"{v.invariant}: {v.details}" for v in summary.verdicts)
    assert summary.pipelines["pipe-0"] == {"expected": 1500, "held": 1500, "duplicates": 0, "missing": 0}


@pytest.mark.slow
def test_process_brokers_under_reconcile_keep_every_invariant(monkeypatch, tmp_path):
    """The reconcile protocol under kill -9, SIGSTOP, partitions, session expiry, controller kills and task
    storms, with broker processes: no task ever has two running owners, and the group reconciles back.
    A failure prints the brokers' and controllers' logs (they found a broker fenced for good by an orphaned
    SUSPENDED timer: docs/reliability.md "The tasks left without an owner")."""
    import tempfile

    monkeypatch.setenv("ZKC_CHAOS_KEEP", "1")  # the run's work directory stays, here under tmp_path
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = CliRunner().invoke(
        cli,
        [
            "sim",
            "chaos",
            "--seed",
            "11",
            "--duration",
            "30",
            "--brokers",
            "3",
            "--tasks",
            "20",
            "--process-brokers",
            "--protocol",
            "reconcile",
            "--json",
        ],
    )
    summary = json.loads(res.output.strip().splitlines()[-1])
    logs = "".join(
        f"\n--- {p.name} (last 60 lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-60:])
        for p in sorted(tmp_path.glob("*/*.log"))
    )
    assert summary["faults_failed"] == []
    assert summary["ok"] and res.exit_code == 0, json.dumps(summary["verdicts"], indent=1) + logs
    assert summary["rebalances"] > 0 and sum(summary["faults_injected"].values()) >= 5, summary["faults_injected"]


def test_process_brokers_with_wedged_stops_halt_before_their_tasks_move_and_come_back():
    """Broker processes whose stops hang (SIGUSR2 wedges a no-op runner) while they are cut off from ZooKeeper:
    each must halt (exit 75) at its fence deadline, before its session expires, so no task ever has two running
    owners (the halted process's run windows end when it exited); the harness restarts it, as a
    supervisor would, and it is back in the group at the end."""
    summary = run_chaos(
        ChaosOptions(seed=5, duration_s=30, brokers=3, tasks=20, kinds=WEDGED_KINDS, process_brokers=True)
    )
    assert summary.faults_injected.get("wedged-stop", 0) >= 2, summary.faults_injected
    assert summary.faults_failed == []
    # a wedged broker that ran nothing when cut off (just restarted, its tasks not back yet) has no stop to
    # hang in: only those that ran a task must halt
    assert summary.wedged_busy >= 1, summary.faults_injected
    assert sum(summary.halts.values()) >= summary.wedged_busy, (summary.halts, summary.wedged_busy)
    assert [v.invariant for v in summary.verdicts] == [1, 2, 3, 4, 6, 9]
    assert summary.ok, [v for v in summary.verdicts if not v.ok]


def test_in_process_brokers_with_wedged_stops_are_killed_and_restarted():
    summary = run_chaos(ChaosOptions(seed=5, duration_s=20, brokers=3, tasks=20, kinds=("wedged-stop", "kill-broker")))
    assert summary.faults_injected.get("wedged-stop", 0) >= 1, summary.faults_injected
    assert summary.wedged_busy >= 1 and sum(summary.halts.values()) >= summary.wedged_busy, summary.halts
    assert summary.ok, [v for v in summary.verdicts if not v.ok]


def test_in_process_chaos_with_a_throttle_and_maintenance_windows_keeps_every_invariant():
    kinds = ("kill-broker", "expire-broker", "partition-broker", "kill-controller", "task-storm", "maintenance")
    summary = run_chaos(
        ChaosOptions(
            seed=11,
            duration_s=24,  # 12 faults, each kind and a maintenance window among them, over by t+29.5s
            brokers=3,
            tasks=20,
            mean_gap_s=1.5,
            kinds=kinds,
            max_moves=3,
            max_moves_per_broker=2,
        )
    )
    assert summary.faults_injected.get("maintenance", 0) >= 1, summary.faults_injected
    assert summary.faults_failed == []
    numbers = {v.invariant for v in summary.verdicts}
    assert {7, 8} <= numbers, numbers
    assert summary.ok, "\n".join(f"{v.invariant}: {v.details}" for v in summary.verdicts)


def test_a_worker_without_its_fence_is_caught(monkeypatch):
    """Injected bug: workers that never fence (no deadline, no liveness probe). A broker whose network goes
    silent keeps running its tasks after its session expired and they moved: invariant 1 must fail."""
    monkeypatch.setattr(Fence, "fence", lambda self: None)
    monkeypatch.setattr(DeadlineWatchdog, "check", lambda self, now: None)
    summary = run_chaos(
        ChaosOptions(seed=3, duration_s=3, brokers=2, tasks=8, mean_gap_s=1.0, kinds=("expire-broker",), hold_s=1.0)
    )
    assert summary.faults_injected == {"expire-broker": 1}
    v1 = summary.verdicts[0]
    assert not v1.ok and "overlaps" in v1.details[0], v1.details


def test_ghost_members_and_rewritten_reports_under_reconcile_change_nothing_that_runs():
    """Hostile members against in-process brokers under reconcile: ghost member znodes (no broker behind
    them; claiming a live broker's tasks at a huge generation, or nothing) and live members' reports rewritten
    with absurd fields (seed 137 draws every variant of both), beside broker kills. No ghost is given work (10), no task placed on a member sits
    without a running owner while the group says Stable longer than the rebalance timeout (9), every member
    whose report was rewritten reports validly again (11), and every other invariant holds."""
    kinds = ("ghost-member", "rewritten-report", "kill-broker")
    summary = run_chaos(
        ChaosOptions(seed=137, duration_s=30, brokers=3, tasks=12, mean_gap_s=2.5, kinds=kinds, protocol="reconcile")
    )
    assert summary.faults_injected.get("ghost-member", 0) >= 2, summary.faults_injected
    assert summary.faults_injected.get("rewritten-report", 0) >= 2, summary.faults_injected
    assert summary.faults_failed == []
    assert {9, 10, 11} <= {v.invariant for v in summary.verdicts}
    assert summary.ok, "\n".join(f"{v.invariant}: {v.details}" for v in summary.verdicts if not v.ok)


@pytest.mark.slow
def test_faults_inside_a_three_server_ensemble_keep_every_invariant():
    """An ensemble of the run's own (three servers, a proxy between every two) under a short seeded schedule
    (seed 160 over 25 s): a follower killed, the quorum lost (two of three down) past the session timeout
    then back, a follower cut off from its peers past the brokers' session timeout while its clients still
    reach it. No task ever has two running owners (a broker that cannot renew its session fences by its
    deadline), every task runs again within the bound after the quorum returns (12), epochs and generations
    only grow, and everything converges. About a minute."""
    kinds = ("zk-kill-leader", "zk-kill-follower", "zk-lose-quorum", "zk-isolate")
    summary = run_chaos(
        ChaosOptions(seed=160, duration_s=25, brokers=3, tasks=12, mean_gap_s=3.0, kinds=kinds, ensemble=3)
    )
    text = format_summary(summary)
    assert summary.faults_failed == [], text
    assert summary.injection.enough and sum(summary.faults_injected.values()) >= 3, text
    assert len(summary.quorum_returns) == summary.faults_injected.get("zk-lose-quorum", 0) == 1, text
    assert {1, 2, 3, 4, 12} <= {v.invariant for v in summary.verdicts}, text
    assert summary.ok, text
