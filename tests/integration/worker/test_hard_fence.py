"""The hard fence deadline, with real broker processes: a broker whose stop hangs halts (exit 75) before any of
its tasks can start elsewhere, whether ZooKeeper was cut off (a TCP proxy partitioned) or its tasks were
revoked while connected. (The pure parts: the margins in tests/unit/worker/test_fence.py, the deadline and the
lease codec in test_deadline.py, the stop batches in test_slots.py.)"""

from __future__ import annotations

import os
import signal
import time

from broker_sim.sim.netproxy import NetProxy
from broker_sim.worker.deadline import EXIT_HALTED
from controller.admin import AdminClient
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from tests.broker_processes import BrokerProcess, first_owner_after, owners
from tests.cli_support import until


def test_a_partitioned_broker_whose_stop_hangs_halts_before_its_tasks_start_elsewhere(
    controller, zk, zk_hosts, layout, cli_env, tmp_path
):
    tasks = [f"h{i}" for i in range(4)]
    AdminClient(zk, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    proxy = NetProxy(host, int(port), name="proxy-wedged")
    wedged = other = None
    try:
        wedged = BrokerProcess.zkctl(
            cli_env, proxy.address, "wedged", "--stop-hang", "--session-timeout", "6", log=tmp_path / "wedged.log"
        )
        until(lambda: len(owners(zk, layout, tasks)) == 4, 30, "the wedged broker to own every task")
        proxy.partition()
        cut = time.time()
        other = BrokerProcess.zkctl(cli_env, zk_hosts, "other", "--session-timeout", "6", log=tmp_path / "other.log")
        taken = first_owner_after(zk, layout, tasks, "other", 60)
        until(lambda: wedged.exited_at is not None, 10, "the wedged broker to exit")
        log = (tmp_path / "wedged.log").read_text()
        assert wedged.proc.returncode == EXIT_HALTED, log[-3000:]
        assert "HALTING" in log and "fence deadline" in log, log[-3000:]
        # it exited (noticed within 10 ms) before the first of its tasks had a new owner
        assert wedged.exited_at < taken, (wedged.exited_at - cut, taken - cut)
        assert wedged.exited_at - cut < 6.0  # before its session could expire
    finally:
        for b in (wedged, other):
            if b is not None:
                b.stop()
        proxy.heal()
        proxy.close()


def test_a_connected_broker_whose_revoked_task_will_not_stop_halts_within_the_stop_budget(
    controller, zk, zk_hosts, layout, cli_env, tmp_path
):
    tasks = [f"r{i}" for i in range(4)]
    AdminClient(zk, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    wedged = other = None
    try:
        wedged = BrokerProcess.zkctl(
            cli_env,
            zk_hosts,
            "wedged",
            "--stop-hang",
            "--stop-timeout",
            "2",
            "--session-timeout",
            "6",
            log=tmp_path / "wedged.log",
        )
        until(lambda: len(owners(zk, layout, tasks)) == 4, 30, "the wedged broker to own every task")
        joined = time.time()
        other = BrokerProcess.zkctl(cli_env, zk_hosts, "other", "--session-timeout", "6", log=tmp_path / "other.log")
        until(lambda: wedged.exited_at is not None, 30, "the wedged broker to halt")
        log = (tmp_path / "wedged.log").read_text()
        assert wedged.proc.returncode == EXIT_HALTED, log[-3000:]
        assert "did not return within its 2.0s budget" in log, log[-3000:]
        taken = first_owner_after(zk, layout, tasks, "other", 60)
        assert wedged.exited_at < taken
        assert wedged.exited_at - joined < 20
    finally:
        for b in (wedged, other):
            if b is not None:
                b.stop()


def test_a_controlled_shutdown_that_overruns_with_a_stop_that_hangs_halts(
    controller, zk, zk_hosts, layout, cli_env, tmp_path
):
    """SIGTERM asks for a controlled shutdown; the controller is gone, so nobody moves the tasks: after
    ``--shutdown-timeout`` the broker stops them itself, the stop hangs, and it halts within the stop budget."""
    tasks = [f"c{i}" for i in range(3)]
    AdminClient(zk, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    wedged = None
    try:
        wedged = BrokerProcess.zkctl(
            cli_env,
            zk_hosts,
            "wedged",
            "--stop-hang",
            "--stop-timeout",
            "1.5",
            "--shutdown-timeout",
            "1",
            "--session-timeout",
            "6",
            log=tmp_path / "wedged.log",
        )
        until(lambda: len(owners(zk, layout, tasks)) == 3, 30, "the wedged broker to own every task")
        controller.stop()
        asked = time.time()
        os.kill(wedged.proc.pid, signal.SIGTERM)
        until(lambda: wedged.exited_at is not None, 20, "the broker to halt")
        log = (tmp_path / "wedged.log").read_text()
        assert wedged.proc.returncode == EXIT_HALTED, log[-3000:]
        assert "controlled shutdown did not finish in 1s" in log and "1.5s budget" in log, log[-3000:]
        assert wedged.exited_at - asked < 10
    finally:
        if wedged is not None:
            wedged.stop()
