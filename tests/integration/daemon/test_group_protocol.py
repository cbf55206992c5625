"""The group protocol end to end, against a real ZooKeeper, with no-op workers: what moves, what stays,
and that no task is ever owned twice (checked from recorded run intervals by the independent checker)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_sim.sim.checker import close_open, double_ownership
from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from controller.admin import wait_for
from controller.protocol.group.rules import COOPERATIVE, EAGER, RECONCILE
from controller.protocol.records import codecs, task_records
from controller.protocol.records.task_records import IntervalLog, RunInterval
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec


@pytest.fixture
def cluster_factory(zk_hosts: str, zk_root: str):
    sims: list[Simulation] = []

    def make(**kw) -> Simulation:
        opts = SimOptions(
            zk_hosts=zk_hosts, root=f"{zk_root}-{len(sims)}", session_timeout_s=4.0, rebalance_timeout_s=10.0, **kw
        )
        sim = Simulation(opts).__enter__()
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.close()


def _start(sim: Simulation, brokers: int, tasks: int) -> None:
    sim.create_tasks(tasks)
    sim.start_controller()
    for i in range(brokers):
        sim.start_worker(sim.broker_id(i))
    assert sim.wait_converged(30, balanced=True) is not None, "cluster did not converge"


def _assert_no_double_ownership(sim: Simulation) -> None:
    overlaps = double_ownership(sim.all_intervals())
    assert overlaps == [], "\n".join(str(o) for o in overlaps[:5])


@pytest.mark.parametrize("protocol", [COOPERATIVE, EAGER, RECONCILE])
def test_adding_a_fourth_worker(cluster_factory, protocol):
    """Cooperative and reconcile: tasks that stay are never interrupted and exactly the moved ones pause.
    Eager: every task stops and restarts. Reconcile does it without a join round: no member rejoins."""
    sim = cluster_factory(protocol=protocol, start_latency_s=0.05, stop_latency_s=0.05)
    _start(sim, 3, 30)
    coord = sim.active_controller().ctx.groups["default"]
    rounds = coord.rebalances
    before = {t: b for b, w in sim.workers.items() for t in w.running_tasks()}
    t_join = time.time()
    sim.start_worker(sim.broker_id(3))
    assert sim.wait_converged(30, balanced=True) is not None
    after = {t: b for b, w in sim.workers.items() for t in w.running_tasks()}
    moved = {t for t in after if after[t] != before[t]}
    assert moved and all(after[t] == sim.broker_id(3) for t in moved)
    closed = list(sim.intervals_done) + [i for w in sim.workers.values() for i in w.intervals]
    interrupted = {i.task_id for i in closed if i.end is not None and i.end >= t_join}
    restarted = {i.task_id for i in sim.all_intervals() if i.start >= t_join}
    if protocol == RECONCILE:
        assert coord.protocol == RECONCILE and coord.join_result is None and coord.leader is None
        assert coord.rebalances == rounds + 1, "one new target, no join round"
    if protocol in (COOPERATIVE, RECONCILE):
        assert interrupted == moved, "only the moved tasks may stop"
        assert restarted == moved
        stayed = set(after) - moved
        for t in stayed:  # one unbroken interval, from before the join until now
            runs = [i for i in sim.all_intervals() if i.task_id == t and i.end >= t_join]
            assert len(runs) == 1 and runs[0].start < t_join
    else:
        assert interrupted == set(after) and restarted == set(after), "eager stops and restarts everything"
    _assert_no_double_ownership(sim)


@pytest.mark.parametrize("protocol", [COOPERATIVE, RECONCILE])
def test_leave_and_crash_and_controller_failover_mid_rebalance(cluster_factory, protocol):
    sim = cluster_factory(protocol=protocol, start_latency_s=0.1, stop_latency_s=0.1)
    _start(sim, 4, 40)
    sim.start_controller("ctl-1")  # a standby candidate
    sim.leave(sim.broker_id(0))
    assert sim.wait_converged(30, balanced=True) is not None
    sim.kill(sim.broker_id(1))
    assert sim.wait_converged(30, balanced=True) is not None
    # controller failover in the middle of a rebalance: a new worker joins, the controller dies at once
    old = sim.active_controller()
    sim.start_worker(sim.broker_id(9))
    assert wait_for(lambda: old.ctx is not None and old.ctx.groups["default"].state.value != "Stable", 5, 0.001)
    sim.kill_controller()
    assert sim.wait_converged(30, balanced=True) is not None
    new = sim.active_controller()
    assert new is not None and new.epoch == old.epoch + 1
    assert new.ctx.groups["default"].protocol == protocol
    _assert_no_double_ownership(sim)


def test_protocol_upgrade_eager_to_cooperative_by_rolling_restart(cluster_factory):
    """Start all-eager; restart each worker with (cooperative, eager): the group stays eager until the
    last eager-only member is gone, then runs cooperative; no task is ever owned twice."""
    sim = cluster_factory(protocol=EAGER, start_latency_s=0.05, stop_latency_s=0.05)
    _start(sim, 3, 30)
    coord = lambda: sim.active_controller().ctx.groups["default"]
    assert coord().protocol == EAGER
    upgraded = SimOptions(**{**sim.opts.__dict__, "protocol": COOPERATIVE})
    for i in range(3):
        bid = sim.broker_id(i)
        sim.leave(bid)
        sim.opts = upgraded
        sim.start_worker(bid)
        assert sim.wait_converged(30, balanced=True) is not None
        expected = COOPERATIVE if i == 2 else EAGER
        assert coord().protocol == expected, f"after upgrading {i + 1} workers"
    _assert_no_double_ownership(sim)


@pytest.mark.parametrize("protocol", [COOPERATIVE, RECONCILE])
def test_scheduled_delay_and_static_membership(cluster_factory, protocol):
    """A static member that returns inside the delay gets its own tasks back; nobody else is disturbed
    (cooperative: without a rebalance; reconcile: a new target that moves nothing else)."""
    sim = cluster_factory(protocol=protocol, scheduled_delay_s=8.0, static_membership=True)
    _start(sim, 3, 30)
    victim = sim.broker_id(1)
    mine = set(sim.workers[victim].running_tasks())
    rebalances = sim.active_controller().ctx.groups["default"].rebalances
    t_leave = time.time()
    sim.leave(victim)
    time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
    # held: nobody took the victim's tasks
    assert not any(mine & w.running_tasks() for w in sim.workers.values())
    sim.start_worker(victim)
    assert sim.wait_converged(30, balanced=True) is not None
    assert sim.workers[victim].running_tasks() == mine
    others = {i.task_id for i in sim.all_intervals() if i.start >= t_leave and i.broker != victim}
    assert others == set(), "other members' tasks were not touched"
    if protocol == COOPERATIVE:
        assert sim.active_controller().ctx.groups["default"].rebalances == rebalances, (
            "no rebalance for a static return"
        )


def test_rolling_upgrade_cooperative_to_reconcile_and_back(cluster_factory):
    """A live cooperative group: each broker restarted with reconcile (which still speaks cooperative); the
    group stays cooperative until the last cooperative-only member is gone, then reconciles (no join rounds
    after that); one broker restarted cooperative-only takes it back through a join round. Every task runs
    at the end of each step and none is ever owned twice."""
    sim = cluster_factory(protocol=COOPERATIVE, start_latency_s=0.05, stop_latency_s=0.05)
    _start(sim, 3, 30)
    coord = lambda: sim.active_controller().ctx.groups["default"]
    assert coord().protocol == COOPERATIVE
    for i in range(3):
        bid = sim.broker_id(i)
        sim.leave(bid)
        sim.opts = SimOptions(**{**sim.opts.__dict__, "protocol": RECONCILE})
        sim.start_worker(bid)
        assert sim.wait_converged(30, balanced=True) is not None
        assert coord().protocol == (RECONCILE if i == 2 else COOPERATIVE), f"after upgrading {i + 1} workers"
    assert all(w.member.reconcile_mode for w in sim.workers.values())
    bid = sim.broker_id(1)
    sim.leave(bid)
    sim.opts = SimOptions(**{**sim.opts.__dict__, "protocol": COOPERATIVE})
    sim.start_worker(bid)
    assert sim.wait_converged(30, balanced=True) is not None
    assert coord().protocol == COOPERATIVE
    assert not any(w.member.reconcile_mode for w in sim.workers.values())
    _assert_no_double_ownership(sim)


def test_scheduled_delay_expires_and_tasks_move(cluster_factory):
    sim = cluster_factory(protocol=COOPERATIVE, scheduled_delay_s=1.5)
    _start(sim, 3, 30)
    victim = sim.broker_id(2)
    mine = set(sim.workers[victim].running_tasks())
    sim.leave(victim)
    assert sim.wait_converged(20, balanced=True) is not None
    running = set().union(*(w.running_tasks() for w in sim.workers.values()))
    assert mine <= running


@pytest.mark.parametrize("protocol", [COOPERATIVE, RECONCILE])
def test_controlled_shutdown_moves_tasks_before_leaving(cluster_factory, protocol):
    sim = cluster_factory(protocol=protocol, stop_latency_s=0.05, start_latency_s=0.05)
    _start(sim, 3, 30)
    victim = sim.broker_id(0)
    w = sim.workers[victim]
    assert sim.controlled_shutdown(victim, timeout=30)
    assert w.running_tasks() == set()
    assert sim.wait_converged(30, balanced=True) is not None
    _assert_no_double_ownership(sim)


# ---- worker processes: kill -9 ---------------------------------------------------------------------
def _broker_process(env: dict[str, str], bid: str, log: Path) -> subprocess.Popen:
    """A broker process whose output goes to a file (a pipe nobody reads would stall it once full)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cli.main",
                "broker",
                "run",
                "--id",
                bid,
                "--runner",
                "noop",
                "--session-timeout",
                "4",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _intervals_from_zk(client, layout) -> list[RunInterval]:
    out: list[RunInterval] = []
    for b in client.get_children(layout.intervals):
        data, _ = client.get(layout.broker_intervals(b))
        out += codecs.decode(IntervalLog, data, layout.broker_intervals(b)).intervals
    return out


@pytest.mark.slow
def test_kill_dash_nine_of_a_worker_process(zk, layout, zk_settings, cli_env, tmp_path):
    """Workers as real processes; one is killed with SIGKILL: its tasks move only after its session
    expires (its owner znodes vanish), and no task is ever owned twice."""
    from controller.daemon import Controller, ControllerConfig
    from controller.protocol.group.vocabulary import GroupConfig

    tx = zk.transaction()
    for i in range(12):
        tx.create(layout.task(f"t{i:02d}"), TaskSpec(id=f"t{i:02d}", pipeline=NoopPipeline(kind="noop")).encode())
    tx.commit()
    env = dict(cli_env)
    ctl = Controller(ControllerConfig("c0", zk_settings, GroupConfig(rebalance_timeout_s=10))).start()
    procs = {b: _broker_process(env, b, tmp_path / f"{b}.log") for b in ("p0", "p1", "p2")}
    try:

        def owners() -> dict[str, str]:
            out = {}
            for i in range(12):
                try:
                    data, _ = zk.get(layout.task_owner(f"t{i:02d}"))
                    out[f"t{i:02d}"] = codecs.decode(task_records.OwnerInfo, data).broker
                except Exception:
                    pass
            return out

        assert wait_for(lambda: len(owners()) == 12 and len(set(owners().values())) == 3, 60, 0.1), owners()
        # every worker has flushed its intervals, including the running ones, at least once
        assert wait_for(lambda: {i.broker for i in _intervals_from_zk(zk, layout)} == {"p0", "p1", "p2"}, 30)
        victim = "p1"
        victim_tasks = {t for t, b in owners().items() if b == victim}
        os.kill(procs[victim].pid, signal.SIGKILL)
        killed_at = time.time()
        procs[victim].wait(10)
        assert wait_for(lambda: len(owners()) == 12 and victim not in owners().values(), 60, 0.1), owners()
        moved_at = time.time()
        assert moved_at - killed_at >= 3.0, "tasks moved before the killed worker's session could expire"
        # the new owners have flushed the intervals in which they run the victim's tasks
        assert wait_for(
            lambda: (
                victim_tasks
                <= {i.task_id for i in _intervals_from_zk(zk, layout) if i.broker != victim and i.start > killed_at}
            ),
            30,
        )
        intervals = close_open(
            [
                i
                if i.broker != victim or i.end is not None
                else RunInterval(
                    task_id=i.task_id,
                    broker=i.broker,
                    start=i.start,
                    end=killed_at,
                    acquired=i.acquired,
                    released=killed_at,
                )
                for i in _intervals_from_zk(zk, layout)
            ],
            time.time(),
        )
        assert (
            victim_tasks
            and {i.task_id for i in intervals if i.broker != victim and i.start > killed_at} >= victim_tasks
        )
        overlaps = double_ownership(intervals)
        assert overlaps == [], "\n".join(
            [str(o) for o in overlaps] + [f"--- {b}.log\n" + (tmp_path / f"{b}.log").read_text()[-4000:] for b in procs]
        )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        ctl.stop()
