"""``zkctl``'s long-running commands as processes: ``controller run`` and ``broker run`` and their signals,
SIGTERM to a command that started processes of its own, the simulator's runs and the no-op demo.

Every process a test starts is stopped by its pid in a ``finally``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from controller.admin import AdminClient
from controller.protocol.tasks.spec import parse_spec
from tests.cli_support import ZKCTL, assert_user_error, invoke, stop_process, until


def test_sigterm_ends_a_simulation_with_every_process_it_started(tmp_path):
    """`zkctl sim chaos --process-brokers` starts a ZooKeeper JVM (in a session of its own), controller and
    broker processes. SIGTERM ends it as Ctrl-C does: each of them is stopped, none left running (Python's
    default for SIGTERM exited without any cleanup, and the JVM lived on). Every process is also stopped by
    its pid here whatever happens."""
    import psutil

    log = (tmp_path / "chaos.log").open("w")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen(
        [
            ZKCTL,
            "sim",
            "chaos",
            "--seed",
            "11",
            "--duration",
            "120",
            "--brokers",
            "2",
            "--tasks",
            "4",
            "--process-brokers",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    started: list[psutil.Process] = []
    try:

        def spawned() -> bool:
            started[:] = psutil.Process(p.pid).children(recursive=True)
            names = [" ".join(c.cmdline()) for c in started if c.is_running()]
            return (
                any("QuorumPeerMain" in n or "ZooKeeperServerMain" in n for n in names)
                and sum("broker_sim.chaos broker" in n for n in names) == 2
            )

        until(spawned, 60, "the simulation's ZooKeeper and brokers")
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) != 0  # (interrupted)
        left = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            left = [c for c in started if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
            if not left:
                break
            time.sleep(0.2)
        assert not left, [" ".join(c.cmdline())[:120] for c in left]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for c in started:
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        log.close()


def test_controller_run_and_broker_run_processes(zk, cli_env, layout):
    """`zkctl controller run` and two `zkctl broker run --runner noop`: tasks run on them; SIGTERM is a
    controlled shutdown (tasks move, exit 0); Ctrl-C twice stops a broker at once; the controller stops on
    SIGTERM. Each is stopped by its pid whatever happens."""
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, *args: str) -> None:
        procs[name] = subprocess.Popen(
            [ZKCTL, *args], env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    admin = AdminClient(zk, layout)

    def owners() -> dict[str, str]:
        return {r.task_id: r.owner for r in admin.list_tasks()}

    try:
        start(
            "ctl",
            "controller",
            "run",
            "--id",
            "c9",
            "--rebalance-timeout",
            "5",
            "--metrics-port",
            "0",
            "--session-timeout",
            "4",
        )
        until(lambda: zk.exists(layout.controller) is not None, 30, "the controller to be elected")
        for b in ("p1", "p2"):
            start(b, "broker", "run", "--id", b, "--runner", "noop", "--session-timeout", "4", "--metrics-port", "0")
        admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
        until(lambda: set(owners().values()) == {"p1", "p2"}, 30, "tasks running on both brokers")

        os.kill(procs["p1"].pid, signal.SIGTERM)  # controlled shutdown
        assert procs["p1"].wait(30) == 0
        assert owners() == {f"t{i}": "p2" for i in range(4)}  # moved before p1 left
        out = procs["p1"].stdout.read()
        assert "controlled shutdown complete" in out and "broker p1 stopped" in out, out

        os.kill(procs["ctl"].pid, signal.SIGTERM)
        assert procs["ctl"].wait(30) == 0
        out = procs["ctl"].stdout.read()
        assert "controller c9 is active at epoch" in out and "metrics on http://127.0.0.1:" in out, out
        assert "controller c9 stopped" in out and "Traceback" not in out

        # no controller now: a controlled shutdown cannot finish; Ctrl-C twice stops the broker at once
        os.kill(procs["p2"].pid, signal.SIGINT)
        time.sleep(0.5)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert procs["p2"].poll() is None
        os.kill(procs["p2"].pid, signal.SIGINT)
        assert procs["p2"].wait(30) == 0
        out = procs["p2"].stdout.read()
        assert "stopping now" in out and "Traceback" not in out, out
        until(lambda: not any(owners().values()), 10, "p2's owner znodes gone")
    finally:
        for p in procs.values():
            stop_process(p)


def test_a_simulation_that_cannot_converge_ends_with_one_line(monkeypatch, zk_hosts):
    from broker_sim.sim.simulator import Simulation

    monkeypatch.setattr(Simulation, "wait_converged", lambda self, balanced=False, timeout=None: None)
    res = invoke(["--zk", zk_hosts, "--json", "sim", "run", "--brokers", "2", "--tasks", "4"])
    assert_user_error(res, "did not converge within", "try more --farms, fewer brokers or a longer --session-timeout")


@pytest.mark.parametrize("scenario,extra", [("pause-broker", []), ("rolling-bounce", ["--controlled-shutdown"])])
def test_the_simulator_spreads_brokers_over_farm_processes(zk_hosts, scenario, extra):
    """``--farms 2``: the brokers run in two broker farm processes, and the faults (a pause through the broker's
    own proxy; controlled shutdowns and restarts) are carried out there; the checker reads their intervals."""
    res = invoke(
        [
            "--zk",
            zk_hosts,
            "--json",
            "sim",
            "run",
            "--brokers",
            "4",
            "--tasks",
            "40",
            "--farms",
            "2",
            "--session-timeout",
            "4",
            "--scenario",
            scenario,
            *extra,
        ]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["farms"] == 2 and summary["double_ownership"] == 0
    steps = summary["steps"]
    assert steps and all(s["converged_s"] is not None for s in steps), steps
    assert summary["moved_tasks"] >= (10 if scenario == "pause-broker" else 40), summary


@pytest.mark.parametrize(
    "scenario",
    [
        "rolling-bounce",
        "add-broker",
        "kill-broker",
        "expire-session",
        "pause-broker",
        "partition-broker",
        "controlled-shutdown",
        "kill-controller",
    ],
)
def test_the_simulator_runs_every_scenario_under_reconcile(zk_hosts, scenario):
    """``--protocol reconcile``: every fault scenario converges with no task ever owned twice, and the group
    reconciles (no join round once it runs the protocol)."""
    res = invoke(
        [
            "--zk",
            zk_hosts,
            "--json",
            "sim",
            "run",
            "--brokers",
            "4",
            "--tasks",
            "40",
            "--protocol",
            "reconcile",
            "--session-timeout",
            "4",
            "--scenario",
            scenario,
        ]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["protocol"] == "reconcile" and summary["double_ownership"] == 0, summary
    steps = summary["steps"]
    assert steps and all(s["converged_s"] is not None for s in steps), steps


@pytest.mark.parametrize("scenario", ["add-broker", "kill-broker", "controlled-shutdown", "kill-controller"])
def test_a_repeated_step_is_measured_each_time_from_the_same_cluster_put_back(zk_hosts, scenario):
    """``--repeat 2``: the step twice, the cluster put back in between by a step that is not a figure; each
    figure runs to the instant the cluster converged, which no poll can see before it happened."""
    res = invoke(
        [
            "--zk",
            zk_hosts,
            "--json",
            "sim",
            "run",
            "--brokers",
            "3",
            "--tasks",
            "30",
            "--protocol",
            "reconcile",
            "--session-timeout",
            "4",
            "--scenario",
            scenario,
            "--repeat",
            "2",
            "--settle",
            "0.2",
        ]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    steps = summary["steps"]
    measured = [s for s in steps if s["measured"]]
    assert len(measured) == 2 and len(summary["step_convergence_s"]) == 2, steps
    restores = [s for s in steps if not s["measured"]]
    assert len(restores) == (0 if scenario == "kill-controller" else 1), steps
    assert all(s["converged_s"] is not None and 0 <= s["converged_s"] <= s["detected_s"] for s in steps), steps
    assert summary["double_ownership"] == 0
    if scenario == "add-broker":
        assert [s["broker"] for s in measured] == ["broker-003", "broker-004"]
    refused = invoke(["--zk", zk_hosts, "sim", "run", "--scenario", "rolling-bounce", "--repeat", "2"])
    assert refused.exit_code != 0 and "one-step scenarios" in refused.output


def test_the_noop_demo_runs_end_to_end_and_shows_an_aligned_table(tmp_path):
    """``zkctl demo --runner noop`` (the README's main job in its fast form): real processes, a broker and a
    controller killed; its status is an aligned table with full state names."""
    env = {**os.environ, "ZKC_STATE_DIR": str(tmp_path / "state")}
    env.pop("ZKC_ZK", None)
    p = subprocess.run(
        [ZKCTL, "demo", "--runner", "noop"], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "double ownership: 0" in out and "controller ctl-" in out and "took over at epoch 2" in out
    header = next(line for line in out.splitlines() if line.split() == ["TASK", "BROKER", "STATE", "LOAD"])
    rows = out.splitlines()[out.splitlines().index(header) + 1 :][:4]
    assert [r.split()[0] for r in rows] == [f"pipeline-{i}" for i in range(1, 5)]
    assert {r.split()[2] for r in rows} <= {"UNASSIGNED", "ASSIGNED", "STARTING", "RUNNING", "LOST"}
    assert all(r.index(r.split()[2]) == header.index("STATE") for r in rows)  # aligned
    assert " LOST" in out  # the killed broker's tasks, until its session expires
