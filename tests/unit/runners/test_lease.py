"""An isolated driver keeps its broker's lease itself, and the broker treats a lost guard as a fault: the
lease as the driver reads it (bounded, validated; only a renewal of its own broker moves the deadline), and the
watchdog replacing a guard killed with ``kill -9`` (a real guard process). The real Spark driver that ends its
run at the deadline with its guard dead: tests/e2e/test_lease_self_enforced.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from broker_sim.runners.lease import LEAD_S, MAX_LEASE_BYTES, Lease, LeaseKeeper, read_lease, write_lease
from broker_sim.runners.procs import process_alive
from broker_sim.worker.deadline import MAX_GUARD_LOSSES, DeadlineWatchdog
from tests.spark_support import wait_for


def test_the_deadline_is_the_last_lease_of_its_own_broker_a_lead_early(tmp_path):
    keeper = LeaseKeeper(broker_pid=100)
    assert keeper.deadline() is None and not keeper.due(1e9)  # no lease read yet: nothing to enforce
    keeper.update(Lease("b1", 100, expires=50.0))
    assert keeper.deadline() == pytest.approx(50.0 - LEAD_S)
    assert not keeper.due(50.0 - LEAD_S - 0.01) and keeper.due(50.0 - LEAD_S)
    keeper.update(None)  # the file went bad or away: the last good lease stays in force, so it runs out
    keeper.update(Lease("b1", 999, expires=1e9))  # another broker's lease does not renew ours
    assert keeper.due(50.0)
    keeper.update(Lease("b1", 100, expires=80.0))  # a renewal moves it
    assert not keeper.due(50.0)
    keeper.update(Lease("b1", 100, expires=None))  # the broker runs nothing: nothing to enforce
    assert keeper.deadline() is None


def test_a_lease_file_is_read_bounded_and_validated(tmp_path):
    path = tmp_path / "lease.json"
    assert read_lease(path) is None  # absent
    write_lease(path, Lease("b1", 7, expires=3.5, pgids=(9,)))
    assert read_lease(path) == Lease("b1", 7, expires=3.5, pgids=(9,))
    for garbage in (b"{", b"[]", b'{"broker": "b1"}', b'{"broker": "b", "owner_pid": "x"}', b"\xff\xfe"):
        path.write_bytes(garbage)
        assert read_lease(path) is None, garbage
    path.write_bytes(b" " * (MAX_LEASE_BYTES + 1))
    assert read_lease(path) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # a FIFO would block a plain open: refused at once
    assert read_lease(fifo) is None
    target = tmp_path / "target.json"
    write_lease(target, Lease("b1", 7, expires=3.5))
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert read_lease(link) is None  # never followed


def _watchdog(lost: list[str], stopped: threading.Event) -> DeadlineWatchdog:
    return DeadlineWatchdog(
        "gb",
        session_timeout_s=8.0,
        fence_margin_s=2.0,
        stop_budget_s=1.0,
        configured_stop_timeout_s=None,
        earliest_expiry=lambda: time.monotonic() + 8.0,
        running_or_starting=lambda: {"t1"},
        kill_runners=lambda: None,
        runner_processes=lambda: (set(), set()),
        halt=lambda reason: lost.append(f"HALT {reason}"),
        stopped=stopped,
        guard_lost=lost.append,
    )


def test_a_guard_killed_is_a_fault_its_tasks_are_halted_and_a_new_guard_takes_over(tmp_path, monkeypatch):
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path))
    lost: list[str] = []
    stopped = threading.Event()
    dog = _watchdog(lost, stopped)
    dog.start_guard()
    pids = []
    try:
        first = dog.guard_pid
        assert first is not None and dog.lease_path is not None and read_lease(dog.lease_path) is not None
        pids.append(first)
        dog.check_guard()
        assert lost == []  # a guard that runs is no fault
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: dog._guard is not None and dog._guard.poll() is not None, 10, "the guard to die")
        dog.check_guard()
        assert len(lost) == 1 and "lease guard" in lost[0] and "signal 9" in lost[0], lost
        second = dog.guard_pid
        assert second is not None and second != first and process_alive(second)
        pids.append(second)
        assert not dog.halted.is_set()
    finally:
        stopped.set()
        dog.close_guard()
    assert not any(process_alive(p) for p in pids)


def test_a_guard_that_keeps_dying_halts_the_broker(tmp_path, monkeypatch):
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path))
    lost: list[str] = []
    stopped = threading.Event()
    dog = _watchdog(lost, stopped)
    dog.start_guard()
    try:
        for _ in range(MAX_GUARD_LOSSES + 1):
            guard = dog._guard
            assert guard is not None
            guard.kill()
            guard.wait(10)
            dog.check_guard()
        assert dog.halted.is_set() and lost[-1].startswith("HALT ") and "guards lost" in lost[-1], lost
        assert len(lost) == MAX_GUARD_LOSSES + 1
    finally:
        stopped.set()
        dog.close_guard()


def _victim() -> subprocess.Popen[bytes]:
    """A process standing for a runner's own (the Spark driver JVM): what the guard kills."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.DEVNULL)


def test_a_broker_whose_lease_ran_out_halts_even_when_the_kill_left_no_task_busy(tmp_path, monkeypatch):
    """The guard kills the runners' processes at the lease's expiry; a start it cut short fails at once, so
    by the time the watchdog looks no task is busy. The broker must halt all the same: it would resume on a
    dead engine, every start failing while it holds the tasks."""
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path))
    victim = _victim()
    stopped = threading.Event()
    halts: list[str] = []
    expiry = time.monotonic() + 2.0  # ZooKeeper answers no more: the earliest expiry stays where it is
    dog = DeadlineWatchdog(
        "rb",
        session_timeout_s=8.0,
        fence_margin_s=2.0,
        stop_budget_s=1.0,
        configured_stop_timeout_s=None,
        earliest_expiry=lambda: expiry,
        # the start runs as long as its process does: the guard's kill ends it
        running_or_starting=lambda: {"pipe-0"} if victim.poll() is None else set(),
        kill_runners=lambda: None,
        runner_processes=lambda: ({victim.pid}, set()),
        halt=halts.append,
        stopped=stopped,
    )
    try:
        dog.start_guard()
        assert dog.lease_path is not None and read_lease(dog.lease_path) == Lease(
            "rb", os.getpid(), dog.session_deadline(), (victim.pid,), ()
        )
        assert dog.check(time.monotonic()) is None  # before the deadline nothing is wrong
        wait_for(lambda: victim.poll() is not None, 30, "the guard to kill the runner's process at the deadline")
        reason = dog.check(time.monotonic())
        assert reason is not None and "lease ran out" in reason and str(victim.pid) in reason, reason
    finally:
        stopped.set()
        dog.close_guard()
        victim.kill()
        victim.wait(10)


def test_a_lease_that_runs_out_with_no_process_to_kill_halts_nothing(tmp_path, monkeypatch):
    """Nothing busy when the lease was written (no expiry), or no process named in it: the guard kills
    nothing, so the broker has no reason to halt however late it looks."""
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path))
    stopped = threading.Event()
    for busy, procs in (({"t1"}, set()), (set(), {os.getpid()})):
        dog = DeadlineWatchdog(
            "nb",
            session_timeout_s=8.0,
            fence_margin_s=2.0,
            stop_budget_s=1.0,
            configured_stop_timeout_s=None,
            earliest_expiry=lambda: time.monotonic() - 60.0,
            running_or_starting=lambda busy=busy: set(busy) if busy else set(),
            kill_runners=lambda: None,
            runner_processes=lambda procs=procs: (set(procs), set()),
            halt=lambda _reason: None,
            stopped=stopped,
        )
        try:
            dog.start_guard()
            assert dog.lease_ran_out(time.monotonic() + 3600) is None
        finally:
            dog.close_guard()
    stopped.set()
