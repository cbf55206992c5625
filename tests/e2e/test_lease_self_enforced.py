"""The exactly-once promise does not rest on the lease guard: real brokers, real isolated Spark drivers.

1. A guard killed with ``kill -9`` while its broker runs is a fault: the broker halts its isolated pipeline,
   its status says why, a new guard takes over and the restart policy runs the pipeline again.
2. The guard killed and the broker paused (SIGSTOP) together, so nobody outside enforces the deadline: the
   isolated driver ends its own run before its broker's lease deadline. No micro-batch is committed past the
   deadline (the checkpoint's commit files' times), the other broker takes the task only once that driver is
   dead (no second driver runs at once), and the sink holds every record exactly once.
3. A driver paused by SIGSTOP (its JVM writing on) does not show RUNNING with frozen metrics: its broker
   notices that it stopped answering and reports it FAILED with the reason.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from kazoo.protocol.states import EventType, WatchedEvent

from broker_sim.runners import spark_process
from broker_sim.runners.base import RunState
from broker_sim.runners.lease import read_lease
from broker_sim.runners.spark import SparkRunner, checkpoint_location
from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.tasks.spec import parse_spec
from controller.protocol.tasks.storage import cluster_dir
from tests.broker_processes import BrokerProcess
from tests.broker_processes import owners as read_owners
from tests.e2e.test_hard_fence_spark import _spark_args
from tests.e2e.test_isolation import SESSION_S, _group_runs, _status
from tests.spark_support import TEST_CONF, TEST_MASTER, files_task, require_spark, sink_ids, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _guard_of(broker_pid: int) -> psutil.Process:
    """The lease guard watching broker ``broker_pid``'s lease file (named ``<id>-<pid>.json``)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "broker_sim.worker.guard" in cmd and cmd[-1].endswith(f"-{broker_pid}.json"):
            return proc
    raise AssertionError(f"no lease guard for broker pid {broker_pid}")


def _driver_runs(env: dict[str, str], broker_pid: int) -> list[Path]:
    """The run directories of isolated drivers launched by broker ``broker_pid``."""
    runs = []
    for run in (Path(env["ZKC_STATE_DIR"]) / "drivers").glob("*"):
        try:
            if json.loads((run / "launch.json").read_text()).get("broker_pid") == broker_pid:
                runs.append(run)
        except (OSError, ValueError):
            continue
    return runs


def _commit_times(checkpoint: Path) -> dict[int, float]:
    """Batch id -> when its commit file was written (wall clock): a batch is committed once that file exists."""
    return {int(p.name): p.stat().st_mtime for p in (checkpoint / "commits").iterdir() if p.name.isdigit()}


def test_a_lost_guard_halts_the_isolated_pipeline_and_a_paused_broker_s_driver_ends_itself_by_the_deadline(
    controller, zk, zk_hosts, layout, spark_env, spark, tmp_path
):
    src, out = tmp_path / "in", tmp_path / "out"
    spec = files_task(
        "iso",
        src,
        out,
        "SELECT id, key, value FROM input",
        max_files=1,
        isolation="process",
        trigger={"processing_time": "0.5 seconds"},
    )
    spec["placement"] = {"pinned": ["sa"]}  # starts on sa (the other broker joins later): a preference
    waves = [generate(DatagenConfig(out_dir=str(src), records=100, batch=20))]
    AdminClient(zk, layout).create_tasks([parse_spec(spec)])
    sa = BrokerProcess.zkctl(
        spark_env, zk_hosts, "sa", *_spark_args(tmp_path), "--lazy-session", log=tmp_path / "sa.log"
    )
    sb = None
    # the broker's checkpoint root is scoped by the cluster root
    checkpoint = Path(checkpoint_location(str(tmp_path / "ckpt" / cluster_dir(layout.root)), "iso"))
    try:
        wait_for(
            lambda: (st := _status(zk, layout, "iso")) and st.state == "RUNNING" and st.metrics.get("rows", 0) >= 100,
            240,
            "the isolated pipeline to run on sa",
        )
        # 1. the guard killed while the broker runs: a fault, said, and the pipeline runs again
        first_guard = _guard_of(sa.proc.pid)
        first_guard.kill()
        st = wait_for(
            lambda: (st := _status(zk, layout, "iso")) and "lease guard" in (st.error or "") and st,
            30,
            "the broker to halt the pipeline of its lost guard and say why",
        )
        assert f"pid {first_guard.pid}" in (st.error or ""), st
        new_guard = wait_for(lambda: _guard_of(sa.proc.pid), 10, "a new guard")
        assert new_guard.pid != first_guard.pid
        waves.append(generate(DatagenConfig(out_dir=str(src), records=100, batch=20, start_id=5_000, prefix="w1")))
        wait_for(
            lambda: (st := _status(zk, layout, "iso")) and st.state == "RUNNING" and st.metrics.get("rows", 0) >= 100,
            240,
            "the pipeline to run again on sa after its restart",
        )
        lease_path = Path(spark_env["ZKC_STATE_DIR"]) / "leases" / f"sa-{sa.proc.pid}.json"
        lease = wait_for(lambda: (ls := read_lease(lease_path)) and ls.pgids and ls, 10, "sa's lease")
        (driver,) = lease.pgids

        sb = BrokerProcess.zkctl(
            spark_env, zk_hosts, "sb", *_spark_args(tmp_path), "--lazy-session", log=tmp_path / "sb.log"
        )
        wait_for(lambda: "sb" in zk.get_children(layout.broker_ids), 30, "sb to register")

        # 2. the broker paused and its guard killed at once: the driver alone keeps the deadline
        gone: dict[str, float] = {}

        def note_expiry(_data: bytes | None, _stat: object, event: WatchedEvent | None) -> bool:
            # the broker rewrites its registration (its load report): only the znode's deletion is the expiry
            if event is not None and event.type == EventType.DELETED:
                gone.setdefault("session", time.monotonic())
                return False
            return True

        zk.DataWatch(layout.broker("sa"), note_expiry)

        def note_death() -> None:
            deadline = time.monotonic() + 60
            while _group_runs(driver) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _group_runs(driver):
                gone["driver"], gone["driver_wall"] = time.monotonic(), time.time()

        # enough files for a micro-batch every half second up to the deadline and past it
        waves.append(generate(DatagenConfig(out_dir=str(src), records=1200, batch=20, start_id=10_000, prefix="w2")))
        wait_for(lambda: len(_commit_times(checkpoint)) >= 2, 60, "batches of the new wave")
        guard = _guard_of(sa.proc.pid)
        os.kill(sa.proc.pid, signal.SIGSTOP)  # the broker's process alone: its driver process goes on
        guard.kill()  # nobody outside enforces the deadline any more
        paused = time.monotonic()
        watcher = threading.Thread(target=note_death, name="watch-driver", daemon=True)
        watcher.start()
        lease = read_lease(lease_path)  # the last lease the paused broker wrote: it renews no more
        assert lease is not None and lease.expires is not None
        deadline_wall = lease.expires - time.monotonic() + time.time()
        before = _commit_times(checkpoint)
        wait_for(lambda: "driver" in gone, SESSION_S + 5, "the isolated driver to end its own run")
        wait_for(lambda: "session" in gone, SESSION_S + 10, "the paused broker's session to expire")
        assert gone["driver"] < gone["session"], (gone["driver"] - paused, gone["session"] - paused)
        assert gone["driver_wall"] <= deadline_wall + 0.5, gone["driver_wall"] - deadline_wall
        commits = _commit_times(checkpoint)
        late = {b: t - deadline_wall for b, t in commits.items() if t > deadline_wall}
        assert not late, f"batches committed past the deadline (seconds late): {late}"
        assert len(commits) > len(before), "the driver went on committing after the pause, up to its deadline"
        (run,) = [r for r in _driver_runs(spark_env, sa.proc.pid) if (r / "status.json").exists()]
        said = json.loads((run / "status.json").read_text())
        assert said["state"] == "FAILED" and "lease deadline" in said["error"], said

        taken = wait_for(
            lambda: (o := read_owners(zk, layout, ["iso"]).get("iso")) and o[0] == "sb" and o, 60, "sb to take it"
        )
        assert taken[2] > gone["driver_wall"], "sb took the task only after sa's driver was dead"
        wait_for(
            lambda: (st := _status(zk, layout, "iso")) and st.broker == "sb" and st.state == "RUNNING" and st,
            240,
            "the pipeline to run on sb",
        )
        sb_driver = wait_for(lambda: _driver_runs(spark_env, sb.proc.pid), 10, "sb's driver run")
        assert sb_driver[0].stat().st_ctime > gone["driver_wall"], "no second driver ran while sa's did"
        expected = set().union(*(w.ids() for w in waves))
        wait_for(lambda: set(sink_ids(spark, out)) >= expected, 240, "the moved pipeline to catch up", interval=2.0)
        ids = sink_ids(spark, out)
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated ids"
        assert set(ids) == expected

        print(
            f"\n[lease self-enforced] guard dead, broker paused: the driver ended {gone['driver'] - paused:.2f}s "
            f"after the pause, {deadline_wall - gone['driver_wall']:.2f}s before the deadline; the session expired "
            f"{gone['session'] - paused:.2f}s after the pause; {len(commits)} batches, none late; "
            f"{len(expected)} records exactly once"
        )
    finally:
        try:
            os.kill(sa.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        for b in (sa, sb):
            if b is not None:
                b.stop()


def test_a_paused_isolated_driver_is_reported_failed_not_running_with_frozen_metrics(tmp_path, monkeypatch):
    require_spark()
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(spark_process, "SILENT_S", 4.0)
    runner = SparkRunner(
        spark_master=TEST_MASTER, spark_conf=dict(TEST_CONF), checkpoint_root=str(tmp_path / "ckpt"), warm_session=False
    )
    spec = parse_spec(
        {
            "id": "frozen",
            "pipeline": {
                "source": {"type": "rate", "rows_per_second": 5},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "out")},
                "isolation": "process",
                "trigger": {"processing_time": "0.5 seconds"},
            },
        }
    )
    try:
        runner.start("frozen", spec, 1)
        st = wait_for(lambda: (st := runner.status("frozen")).metrics.get("batches") and st, 120, "a batch")
        assert st.state is RunState.RUNNING and st.metrics["driver_silent_s"] < spark_process.SILENT_S, st
        (group,) = runner.processes()[1]
        os.kill(group, signal.SIGSTOP)  # the driver's Python process alone: its JVM writes on
        st = wait_for(
            lambda: (st := runner.status("frozen")).state is RunState.FAILED and st, 30, "the silence to be seen"
        )
        assert "has not answered" in (st.error or "") and st.metrics["driver_silent_s"] >= 4.0, st
        runner.stop("frozen", 30.0)  # SIGTERM pends on a stopped process: the group is killed after the grace
        assert not _group_runs(group)
    finally:
        try:
            os.killpg(group, signal.SIGCONT)
        except (NameError, ProcessLookupError, UnboundLocalError):
            pass
        runner.close()
