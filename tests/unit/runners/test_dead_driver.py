"""A broker whose shared Spark driver JVM died under it (killed, crashed, out of memory) halts, and its session
holder refuses the dead session: the decision, the holder's bookkeeping around a real process standing for the
JVM, and the deadline watchdog halting on it, but not on the lease guard's own kill. The real driver JVM killed
under a broker process: tests/e2e/test_hard_fence_spark.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from broker_sim.runners.spark_session import SessionHolder, SparkDriverDied, driver_death
from broker_sim.worker.deadline import DeadlineWatchdog
from controller.protocol.errors import ZkcError
from tests.spark_support import wait_for


def _jvm() -> subprocess.Popen[bytes]:
    """A process standing for the driver JVM a holder launched."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.PIPE)


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait(10)
    if proc.stdin:
        proc.stdin.close()


def test_a_death_is_an_exit_of_the_jvm_we_launched_while_we_still_held_its_session():
    assert driver_death(41, None, session_dropped=False) is None  # it runs
    assert driver_death(41, -9, session_dropped=True) is None  # our stop dropped the session, then ended it
    assert driver_death(41, 0, session_dropped=True) is None
    killed = driver_death(41, -9, session_dropped=False)
    assert killed == "its Spark driver JVM (pid 41) exited with signal 9 (SIGKILL) while its session was in use"
    assert "exit code 52" in (driver_death(41, 52, session_dropped=False) or "")  # an OutOfMemoryError
    assert "exit code 0" in (driver_death(41, 0, session_dropped=False) or "")  # a clean exit we did not ask for
    assert "signal 99" in (driver_death(41, -99, session_dropped=False) or "")  # no such signal: the number


def test_a_holder_refuses_a_session_whose_jvm_died_and_forgets_it_on_stop():
    holder = SessionHolder(master="local[1]", conf={}, app_name="dead-driver")
    assert holder.death() is None and holder.jvm_pid() is None  # nothing launched yet
    jvm = _jvm()
    try:
        session = object()  # stands for the SparkSession: only its JVM's life matters here
        holder._spark, holder._jvm = session, jvm  # what ``get`` keeps after launching a JVM
        assert holder.get() is session and holder.death() is None and holder.jvm_pid() == jvm.pid
        os.kill(jvm.pid, signal.SIGKILL)
        wait_for(lambda: jvm.poll() is not None, 10, "the JVM to die", interval=0.02)
        reason = holder.death()
        assert reason is not None and f"pid {jvm.pid}" in reason and "signal 9 (SIGKILL)" in reason, reason
        assert holder.jvm_pid() is None
        with pytest.raises(SparkDriverDied) as refused:
            holder.get()
        assert isinstance(refused.value, ZkcError) and refused.value.code == "spark_driver_died"
        assert f"pid {jvm.pid}" in str(refused.value) and "restart this process" in str(refused.value)
        holder.stop()  # the dead session's stop cannot reach its JVM: it is forgotten all the same
        assert not holder.started and holder.death() is None
    finally:
        _end(jvm)


def _watchdog(halts: list[str], stopped: threading.Event, engine, **kw) -> DeadlineWatchdog:
    return DeadlineWatchdog(
        "db",
        session_timeout_s=8.0,
        fence_margin_s=2.0,
        stop_budget_s=1.0,
        configured_stop_timeout_s=None,
        earliest_expiry=kw.get("earliest_expiry", lambda: time.monotonic() + 8.0),
        running_or_starting=kw.get("running_or_starting", lambda: {"pipe-0"}),
        kill_runners=lambda: None,
        runner_processes=kw.get("runner_processes", lambda: (set(), set())),
        halt=halts.append,
        stopped=stopped,
        engine_lost=engine,
    )


def test_the_watchdog_halts_a_broker_whose_driver_jvm_died_under_it():
    jvm = _jvm()
    halts: list[str] = []
    stopped = threading.Event()
    dog = _watchdog(halts, stopped, lambda: driver_death(jvm.pid, jvm.poll(), session_dropped=False))
    thread = threading.Thread(target=dog.loop, name="worker-db-deadline", daemon=True)
    try:
        assert dog.check(time.monotonic()) is None  # a JVM that runs is no reason
        thread.start()
        os.kill(jvm.pid, signal.SIGKILL)
        wait_for(lambda: halts, 10, "the broker to halt", interval=0.05)
        thread.join(10)
        assert not thread.is_alive() and dog.halted.is_set() and len(halts) == 1, halts
        assert f"Spark driver JVM (pid {jvm.pid}) exited with signal 9" in halts[0], halts
        assert dog.reason == halts[0]
    finally:
        stopped.set()
        thread.join(10)
        _end(jvm)


def test_the_lease_guards_kill_of_the_jvm_is_reported_as_the_lease_not_a_death(tmp_path, monkeypatch):
    """The guard kills the driver JVM when the lease runs out: the broker halts for its lease, which is what
    happened; the JVM's exit is its consequence, not a fault of the engine."""
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path))
    jvm = _jvm()
    halts: list[str] = []
    stopped = threading.Event()
    expiry = time.monotonic() + 2.0  # ZooKeeper answers no more: the earliest expiry stays where it is
    dog = _watchdog(
        halts,
        stopped,
        lambda: driver_death(jvm.pid, jvm.poll(), session_dropped=False),
        earliest_expiry=lambda: expiry,
        running_or_starting=lambda: {"pipe-0"} if jvm.poll() is None else set(),
        runner_processes=lambda: ({jvm.pid}, set()),
    )
    try:
        dog.start_guard()
        wait_for(lambda: jvm.poll() is not None, 30, "the guard to kill the JVM at the lease's expiry")
        reason = dog.check(time.monotonic())
        assert reason is not None and "lease ran out" in reason and "exited" not in reason, reason
    finally:
        stopped.set()
        dog.close_guard()
        _end(jvm)
