"""Chaos runs in CI (bounded): a seeded schedule covering every fault kind against in-process brokers
(through the CLI, ``--json``), one against process brokers running Spark streaming pipelines (kill -9,
SIGSTOP/SIGCONT and controller processes for real; sinks hold every record exactly once), the schedule's determinism, and the checker's teeth: each verdict fails
on data that breaks it, and a worker whose fence is disabled is caught double-owning.

Longer runs and their figures: docs/reliability.md."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from broker_sim.chaos import (
    DEFAULT_FAULT_KINDS,
    FAULT_KINDS,
    ChaosOptions,
    ChaosRun,
    Sample,
    make_schedule,
    run_chaos,
    sink_ids,
)
from broker_sim.runners.spark import DEFAULT_STOP_BUDGET_S
from broker_sim.worker import Worker
from broker_sim.worker.deadline import DeadlineWatchdog
from cli.main import cli
from controller.protocol.codecs import RunInterval

IN_PROCESS_KINDS = tuple(k for k in DEFAULT_FAULT_KINDS if k != "rolling-bounce")
WEDGED_KINDS = ("wedged-stop", "kill-broker", "partition-broker", "freeze-broker")
PROCESS_KINDS = ("kill-broker", "freeze-broker", "kill-controller", "freeze-controller", "expire-broker", "rolling-bounce")


def test_same_seed_same_schedule_and_every_kind_is_drawn():
    opts = ChaosOptions(seed=6, duration_s=30, brokers=3, tasks=20, mean_gap_s=1.5, kinds=IN_PROCESS_KINDS)
    assert make_schedule(opts) == make_schedule(opts)
    assert make_schedule(opts) != make_schedule(ChaosOptions(seed=7, duration_s=30, brokers=3, tasks=20, mean_gap_s=1.5))
    assert {f.kind for f in make_schedule(opts)} == set(IN_PROCESS_KINDS)
    long = make_schedule(ChaosOptions(seed=1, duration_s=600))
    assert {f.kind for f in long} == set(DEFAULT_FAULT_KINDS)  # wedged stops only when asked for
    assert "wedged-stop" in {f.kind for f in make_schedule(ChaosOptions(seed=1, duration_s=600, kinds=FAULT_KINDS))}
    for f in long:  # an exclusive fault has the cluster to itself
        if f.kind in ("zk-restart", "rolling-bounce"):
            assert not [g for g in long if g is not f and f.at <= g.at < f.at + f.duration]
    # process brokers are frozen for less than their session (nothing inside a stopped process can fence)
    proc = make_schedule(ChaosOptions(seed=1, duration_s=600, process_brokers=True))
    assert all(f.duration < 0.6 * 4.0 + 1e-6 for f in proc if f.kind == "freeze-broker")


def test_in_process_chaos_run_through_the_cli_keeps_every_invariant():
    res = CliRunner().invoke(cli, ["sim", "chaos", "--seed", "6", "--duration", "30", "--brokers", "3", "--tasks", "20",
                                   "--mean-gap", "1.5", "--faults", ",".join(IN_PROCESS_KINDS), "--json"])
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
    summary = run_chaos(ChaosOptions(seed=4879, duration_s=60, brokers=2, tasks=6, mean_gap_s=2.0, kinds=PROCESS_KINDS,
                                     process_brokers=True, pipelines=1, records=1500,
                                     session_timeout_s=2 * DEFAULT_STOP_BUDGET_S))
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
    res = CliRunner().invoke(cli, ["sim", "chaos", "--seed", "11", "--duration", "30", "--brokers", "3", "--tasks", "20",
                                   "--process-brokers", "--protocol", "reconcile", "--json"])
    summary = json.loads(res.output.strip().splitlines()[-1])
    logs = "".join(f"\n--- {p.name} (last 60 lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-60:])
                   for p in sorted(tmp_path.glob("*/*.log")))
    assert summary["faults_failed"] == []
    assert summary["ok"] and res.exit_code == 0, json.dumps(summary["verdicts"], indent=1) + logs
    assert summary["rebalances"] > 0 and sum(summary["faults_injected"].values()) >= 5, summary["faults_injected"]


def test_process_brokers_with_wedged_stops_halt_before_their_tasks_move_and_come_back():
    """Broker processes whose stops hang (SIGUSR2 wedges a no-op runner) while they are cut off from ZooKeeper:
    each must halt (exit 75) at its fence deadline, before its session expires, so no task ever has two running
    owners (the halted process's run windows end when its exit is noticed); the harness restarts it, as a
    supervisor would, and it is back in the group at the end."""
    summary = run_chaos(ChaosOptions(seed=5, duration_s=30, brokers=3, tasks=20, kinds=WEDGED_KINDS,
                                     process_brokers=True))
    assert summary.faults_injected.get("wedged-stop", 0) >= 2, summary.faults_injected
    assert summary.faults_failed == []
    assert sum(summary.halts.values()) >= summary.faults_injected["wedged-stop"], summary.halts
    assert [v.invariant for v in summary.verdicts] == [1, 2, 3, 4, 6]
    assert summary.ok, [v for v in summary.verdicts if not v.ok]


def test_in_process_brokers_with_wedged_stops_are_killed_and_restarted():
    summary = run_chaos(ChaosOptions(seed=5, duration_s=20, brokers=3, tasks=20, kinds=("wedged-stop", "kill-broker")))
    assert summary.faults_injected.get("wedged-stop", 0) >= 1, summary.faults_injected
    assert sum(summary.halts.values()) >= 1
    assert summary.ok, [v for v in summary.verdicts if not v.ok]


def test_sink_reader_counts_committed_files_only(tmp_path):
    """The exactly-once check reads a file sink as Spark does: the latest compact log plus later batches;
    files with no commit (a killed writer's) do not count; duplicates are kept and so detected."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = tmp_path / "out"
    (sink / "_spark_metadata").mkdir(parents=True)

    def part(name: str, ids: list[int]) -> str:
        pq.write_table(pa.table({"id": ids}), sink / name)
        return json.dumps({"path": f"file://{sink / name}", "size": 1, "isDir": False, "modificationTime": 0,
                           "blockReplication": 1, "blockSize": 1, "action": "add"})

    (sink / "_spark_metadata" / "0").write_text("v1\n" + part("a.parquet", [1, 2]))
    (sink / "_spark_metadata" / "1.compact").write_text("v1\n" + part("a.parquet", [1, 2]) + "\n" + part("b.parquet", [3]))
    (sink / "_spark_metadata" / "2").write_text("v1\n" + part("c.parquet", [3, 4]))
    part("uncommitted.parquet", [5])
    assert sorted(sink_ids(sink)) == [1, 2, 3, 3, 4]


def test_each_verdict_fails_on_data_that_breaks_it(tmp_path):
    run = ChaosRun(ChaosOptions(seed=0, zk_hosts="127.0.0.1:1", root="/unused"))
    try:
        a = RunInterval(task_id="t", broker="b1", start=1.0, end=5.0, acquired=1.0, released=5.0)
        b = RunInterval(task_id="t", broker="b2", start=4.0, end=9.0, acquired=4.0, released=9.0)
        assert not run._verdict_1([a, b]).ok and run._verdict_1([a]).ok
        run.samples = [Sample(1.0, 2, "Stable", 5), Sample(2.0, 1, "Stable", 5)]
        assert not run._verdict_3().ok
        run.samples = [Sample(1.0, 2, "Stable", 5), Sample(2.0, 2, "Stable", 4)]
        assert not run._verdict_3().ok
        run.samples = [Sample(1.0, 2, "Stable", 5), Sample(2.0, 3, "Stable", 6)]
        assert run._verdict_3().ok
        bound = run.copts.stable_bound_s
        stuck = [Sample(10.0 + i, 2, "PreparingRebalance", 6) for i in range(int(bound) + 3)] + [Sample(10.0 + int(bound) + 3, 2, "Stable", 7)]
        run.samples = stuck
        assert not run._verdict_4(10.0)[0].ok
        assert run._verdict_4(14.0)[0].ok, "only the time after the faults stopped counts"
        run.samples = stuck[:2] + [Sample(13.0, 2, "Stable", 7)]
        assert run._verdict_4(10.0)[0].ok
        run.samples = [Sample(13.0, 2, "PreparingRebalance", 7)]
        assert not run._verdict_4(10.0)[0].ok, "a group that ends out of Stable fails"
    finally:
        run.tmp.cleanup()


def test_the_throttle_and_maintenance_verdicts_fail_on_data_that_breaks_them():
    run = ChaosRun(ChaosOptions(seed=0, zk_hosts="127.0.0.1:1", root="/unused", max_moves=2, max_moves_per_broker=1))
    try:
        first = [RunInterval(task_id=t, broker="b1", start=1.0, end=10.0, acquired=1.0, released=10.0)
                 for t in ("t1", "t2", "t3")]
        # three tasks leave b1 at 10 and start, overlapping, on b2 and b3: 3 in flight at once, 2 on b2
        moved = [RunInterval(task_id="t1", broker="b2", start=12.0, acquired=11.0),
                 RunInterval(task_id="t2", broker="b2", start=12.5, acquired=11.5),
                 RunInterval(task_id="t3", broker="b3", start=12.5, acquired=11.8)]
        v = run._verdict_throttle(first + moved, since=5.0)
        assert not v.ok and "at most 3 in flight" in v.details[0], v.details
        waves = [RunInterval(task_id="t1", broker="b2", start=12.0, acquired=11.0),
                 RunInterval(task_id="t2", broker="b3", start=12.5, acquired=11.5),
                 RunInterval(task_id="t3", broker="b2", start=14.0, acquired=13.0)]
        assert run._verdict_throttle(first + waves, since=5.0).ok
        run.maintenance_windows = [[20.0, 40.0]]
        assert run._verdict_maintenance(first + waves).ok
        late = RunInterval(task_id="t1", broker="b3", start=31.0, acquired=30.0)
        still = RunInterval(task_id="t1", broker="b2", start=12.0, end=29.0, acquired=11.0, released=29.0)
        assert not run._verdict_maintenance(first + [still, late, *waves[1:]]).ok
        under_way = RunInterval(task_id="t1", broker="b2", start=12.0, end=20.5, acquired=11.0, released=20.5)
        assert run._verdict_maintenance(first + [under_way, RunInterval(task_id="t1", broker="b3", start=22.0,
                                                                          acquired=21.5), *waves[1:]]).ok
    finally:
        run.tmp.cleanup()


def test_in_process_chaos_with_a_throttle_and_maintenance_windows_keeps_every_invariant():
    kinds = ("kill-broker", "expire-broker", "partition-broker", "kill-controller", "task-storm", "maintenance")
    summary = run_chaos(ChaosOptions(seed=11, duration_s=30, brokers=3, tasks=20, mean_gap_s=1.5, kinds=kinds,
                                     max_moves=3, max_moves_per_broker=2))
    assert summary.faults_injected.get("maintenance", 0) >= 1, summary.faults_injected
    assert summary.faults_failed == []
    numbers = {v.invariant for v in summary.verdicts}
    assert {7, 8} <= numbers, numbers
    assert summary.ok, "\n".join(f"{v.invariant}: {v.details}" for v in summary.verdicts)


def test_a_worker_without_its_fence_is_caught(monkeypatch):
    """Injected bug: workers that never fence (no deadline, no liveness probe). A broker whose network goes
    silent keeps running its tasks after its session expired and they moved: invariant 1 must fail."""
    monkeypatch.setattr(Worker, "_fence", lambda self: None)
    monkeypatch.setattr(DeadlineWatchdog, "check", lambda self, now: None)
    summary = run_chaos(ChaosOptions(seed=3, duration_s=3, brokers=2, tasks=8, mean_gap_s=1.0, kinds=("expire-broker",),
                                     hold_s=1.0))
    assert summary.faults_injected == {"expire-broker": 1}
    v1 = summary.verdicts[0]
    assert not v1.ok and "overlaps" in v1.details[0], v1.details


def test_a_container_life_ends_where_the_next_begins(tmp_path):
    """A broker that halted (exit 75) is restarted by its restart policy, not by the harness: its open runs
    end at the next life's birth, so a task it ran and someone else took meanwhile is no overlap."""
    from broker_sim.sim.checker import double_ownership
    from broker_sim.deploy.containers import _journal_intervals

    def life(broker: str, born: float, *records: str) -> None:
        (tmp_path / f"{broker}.{int(born * 1e9)}.log").write_text("".join(r + "\n" for r in records))

    life("b1", 100.0, '{"e": "start", "t": "p1", "ts": 101.0}')                 # halted at ~110, no stop record
    life("b1", 112.0, '{"e": "start", "t": "p1", "ts": 125.0}')
    life("b2", 100.0, '{"e": "start", "t": "p1", "ts": 115.0}', '{"e": "stop", "t": "p1", "ts": 120.0}')
    got = _journal_intervals(tmp_path, kills={"b1": [200.0]})
    first = next(i for i in got if i.broker == "b1" and i.start == 101.0)
    assert first.end == 112.0 and first.released == 112.0
    assert double_ownership(got, now=300.0) == []
    # an injected kill earlier than the next life still ends the life there
    assert next(i for i in _journal_intervals(tmp_path, kills={"b1": [105.0]}) if i.start == 101.0).end == 105.0
