"""The chaos harness's processes, real ones: an exit is dated when it happened, not when the supervisor
looked (a halted broker's run windows end there); a broker process just spawned survives the wedged-stop
fault's SIGUSR2; a broker process dumps its threads into its log on SIGQUIT and runs on (a post-mortem); a
freeze of a process that is gone is refused, recorded as not injected, and the run judged on the rest."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil

from broker_sim.chaos import faults
from broker_sim.chaos.player import play
from broker_sim.chaos.processes import ChaosProcess, dump_and_tail, read_journal, zkctl_command
from broker_sim.chaos.schedule import ChaosOptions, Fault
from broker_sim.sim.injection import judge
from tests.cli_support import until

#: A broker's life in brief: it journals a start, notes when it exits, and exits as a halt does (75).
HALTING_CHILD = """
import json, os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"e": "start", "t": "t1", "ts": time.time(), "pid": os.getpid()}) + "\\n")
time.sleep(0.2)
with open(sys.argv[2], "w") as f:
    f.write(repr(time.time()))
os._exit(75)
"""

#: A leader that starts a process of its own (in its group, as a broker's Spark JVM) and exits without it.
LEAVES_A_CHILD = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1], "w") as f:
    f.write(str(child.pid))
os._exit(75)
"""


def stop(proc: ChaosProcess) -> None:
    """SIGKILL of its group by its pid if it still runs, and of whatever it left in its group."""
    if proc.alive():
        proc.kill9()
    else:
        proc.reap_group()


def test_an_exit_ends_the_run_windows_when_it_happened_not_when_the_supervisor_looked(tmp_path):
    journal, exited = tmp_path / "b.journal", tmp_path / "exited"
    proc = ChaosProcess("b", [sys.executable, "-c", HALTING_CHILD, str(journal), str(exited)], tmp_path / "b.log")
    try:
        until(lambda: exited.exists() and exited.read_text() != "", 30, "the process to exit")
        until(lambda: not proc.alive(), 10, "its exit to be seen")
        time.sleep(2.0)  # a supervisor slow to poll, as under load
        looked = time.time()
        assert proc.popen.returncode == 75
        ended = proc.reap_group()
        really = float(exited.read_text())
        exit_time = proc.exit_time()
        assert exit_time is not None and 0 <= exit_time - really < 0.5, (exit_time, really)
        assert 0 <= ended - exit_time < 0.1 and proc.group_gone()  # nothing it started outlived it
        (run,) = read_journal(journal, "b", ended)
        assert run.end is not None and run.end - really < 0.5 and looked - run.end > 1.5, (run, really, looked)
    finally:
        stop(proc)


def test_what_a_process_started_and_left_running_ends_its_windows_when_it_is_gone(tmp_path):
    child_pid = tmp_path / "child.pid"
    proc = ChaosProcess("b", [sys.executable, "-c", LEAVES_A_CHILD, str(child_pid)], tmp_path / "b.log")
    try:
        until(lambda: not proc.alive(), 30, "the leader to exit")
        exit_time = proc.exit_time()
        assert exit_time is not None
        time.sleep(1.0)  # the scenario: the child outlives its leader by a second
        # the child it left may run a task still: its group is not gone, the windows do not end at the exit
        assert not proc.group_gone()
        looked = time.time()
        ended = proc.reap_group()  # SIGKILL of what is left; the windows end once that is gone
        assert looked <= ended < looked + 1.0 and ended - exit_time >= 1.0, (exit_time, looked, ended)
        assert proc.group_gone()
    finally:
        stop(proc)


def broker_command(bid: str, zk_hosts: str, root: str, journal: Path) -> list[str]:
    """A chaos broker process on the no-op runner, as the chaos run starts one."""
    cmd = [sys.executable, "-m", "broker_sim.chaos", "broker", "--id", bid, "--zk", zk_hosts, "--root", root]
    return cmd + ["--journal", str(journal)]


def test_a_broker_process_just_spawned_survives_the_wedged_stop_signal(zk, zk_hosts, zk_root, cli_env, tmp_path):
    cmd = broker_command("b0", zk_hosts, zk_root, tmp_path / "b0.journal")
    proc = ChaosProcess("b0", cmd, tmp_path / "b0.log", env=cli_env, broker=True)
    try:
        # from the first instant on, through its imports, until its own handler wedges its runner
        sent, deadline = 0, time.monotonic() + 4.0
        while time.monotonic() < deadline and proc.alive():
            os.kill(proc.pid, signal.SIGUSR2)
            sent += 1
            time.sleep(0.005)
        assert proc.alive(), f"exit {proc.popen.returncode} after {sent} SIGUSR2:\n{proc.log_path.read_text()[-2000:]}"
        assert sent > 100
    finally:
        stop(proc)


def test_a_broker_process_dumps_its_threads_on_sigquit_and_runs_on(zk, layout, zk_hosts, zk_root, cli_env, tmp_path):
    cmd = broker_command("b0", zk_hosts, zk_root, tmp_path / "b0.journal")
    broker = ChaosProcess("b0", cmd, tmp_path / "b0.log", env=cli_env, broker=True)
    ctl_cmd = zkctl_command() + ["--zk", zk_hosts, "--zk-root", zk_root, "controller", "run", "--id", "ctl-0"]
    controller = ChaosProcess("ctl-0", ctl_cmd, tmp_path / "ctl-0.log", env=cli_env)
    try:
        until(lambda: "b0" in zk.get_children(layout.broker_ids), 60, "the broker to register")
        until(lambda: zk.exists(layout.controller) is not None, 60, "the controller to be elected")
        text = "\n".join(dump_and_tail({"b0": broker}, {"ctl-0": controller}, lines=25))
        assert "b0.log: its threads on SIGQUIT" in text, text
        assert "most recent call first" in text and "broker_main" in text, text  # the main thread's stack
        assert text.count("Thread 0x") >= 3, text  # all threads: the worker's own beside the main one
        assert "--- ctl-0.log (exit None)" in text, text
        until(lambda: "thread names:" in broker.log_path.read_text(), 10, "the threads' names in the log")
        assert "worker-b0-deadline" in broker.log_path.read_text()  # its names, by the ids of the dump
        time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert broker.alive() and controller.alive()
    finally:
        stop(broker)
        controller.terminate(10)


class _ProcessBrokers:
    """The part of a chaos run the broker-freeze fault reaches (``faults.BrokerFreeze``): its options and its
    broker processes, real ones."""

    def __init__(self, procs: dict[str, ChaosProcess]) -> None:
        self.copts = ChaosOptions(process_brokers=True)
        self.broker_procs = procs


def test_a_freeze_the_kernel_cannot_deliver_is_not_injected_and_the_run_is_judged_on_the_rest(tmp_path):
    """SIGSTOP of a broker process that is gone is refused (no signal to deliver): recorded as not injected
    with why, nothing else changed; the freeze of a live one happens (the process is stopped, then thawed);
    with every invariant holding the run is green on one fault of two."""
    gone = ChaosProcess("b-gone", [sys.executable, "-c", "pass"], tmp_path / "gone.log")
    live = ChaosProcess("b-live", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "live.log")
    seen: dict[str, str] = {}
    try:
        until(lambda: not gone.alive(), 30, "the first process to exit")
        gone.reap_group()
        run = _ProcessBrokers({"b-gone": gone, "b-live": live})
        schedule = [Fault(0.0, "freeze-broker", "b-gone", 0.5), Fault(0.1, "freeze-broker", "b-live", 0.5)]

        def echo(line: str) -> None:  # right after each injection, the fault still on: the live one stops
            if "b-live" in line:
                stopped = lambda: psutil.Process(live.pid).status() == psutil.STATUS_STOPPED  # noqa: E731
                until(stopped, 5, "the live process to be stopped")
                seen["status"] = psutil.STATUS_STOPPED

        played = play(schedule, lambda f: faults.begin(run, f), lambda s: bool(time.sleep(s)), echo)  # type: ignore[arg-type]
        assert seen["status"] == psutil.STATUS_STOPPED and played.injected == {"freeze-broker": 1}
        (refused,) = played.injection.not_injected
        assert "b-gone" in refused.fault and "no live process" in refused.reason, refused
        assert played.failed == [] and not gone.frozen
        until(lambda: psutil.Process(live.pid).status() != psutil.STATUS_STOPPED, 10, "the live one to be thawed")
        assert judge(True, played.injection) == (True, "OK")
        assert "1 of 2 drawn faults injected; not injected: " in played.injection.line()
    finally:
        stop(gone)
        stop(live)
