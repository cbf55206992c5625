"""``isolation: process`` with real Spark in real broker processes: a pipeline in a driver process of its own.

1. A bad neighbour: a broker runs a pipeline on its shared driver and an isolated one whose query exhausts
   its 512m driver heap for real (an array of 200 million longs per row). The OutOfMemoryError ends the
   isolated driver's JVM alone: the hog is restarted per its policy, then FAILED with the reason, while the
   shared pipeline goes on in its first run, on the same JVM, and no owner znode or generation changes.
2. The hard fence and a move: a broker whose process is paused (SIGSTOP) cannot let its isolated driver go
   on committing micro-batches: the lease guard kills the driver's process group before the broker's
   session expires. The pipeline then moves to the other broker, resumes from its checkpoint in a new driver
   process, and the sink holds every generated record exactly once.
3. The fence during a start: the runner knows an isolated driver from its spawn, so a kill at the fence
   deadline while the driver is still starting ends it and its JVM.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from broker_sim.runners.procs import kill_processes
from broker_sim.runners.spark import SparkRunner
from broker_sim.runners.spark_jobs import PipelineStartError
from broker_sim.sim.datagen import DatagenConfig, generate
from broker_sim.worker.deadline import EXIT_HALTED
from controller.admin import AdminClient
from controller.protocol.records import codecs, group_messages, task_records
from controller.protocol.tasks.spec import parse_spec
from tests.broker_processes import BrokerProcess
from tests.broker_processes import owners as read_owners
from tests.e2e.test_hard_fence_spark import _lease, _spark_args
from tests.spark_support import TEST_CONF, TEST_MASTER, files_task, require_spark, sink_ids, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SESSION_S = 8.0
#: a row's array of 200 million longs (1.6 GB) in a 512m heap; ``value * 0`` keeps the optimizer from
#: folding it at planning time, so it is a task's allocation, as a real data-dependent blow-up is
HOG_SQL = "SELECT value, size(sequence(0, value * 0 + 200000000)) AS n FROM input"


def _status(zk, layout, t: str) -> task_records.TaskStatus | None:
    try:
        data, _ = zk.get(layout.status(t))
    except Exception:
        return None
    return codecs.decode(task_records.TaskStatus, data)


def _generation(zk, layout, group: str = "default") -> int:
    data, _ = zk.get(layout.group_state(group))
    return codecs.decode(group_messages.GroupStateInfo, data).generation


def _group_members(pgid: int) -> list[str]:
    """Names of the processes of the group ``pgid`` that run (a killed leader stays a zombie while its parent,
    a paused broker, cannot reap it: that is not running)."""
    names = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                names.append(proc.name())
        except (ProcessLookupError, psutil.Error):
            continue
    return names


def _group_runs(pgid: int) -> bool:
    return bool(_group_members(pgid))


def _intervals(zk, layout, t: str) -> list[task_records.RunInterval]:
    return [i for i in AdminClient(zk, layout).intervals() if i.task_id == t]


def test_an_oom_in_an_isolated_pipeline_leaves_its_neighbour_running(
    controller, zk, zk_hosts, layout, spark_env, tmp_path
):
    steady = parse_spec(
        {
            "id": "steady",
            "pipeline": {
                "source": {"type": "rate", "rows_per_second": 10},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "steady-out")},
                "trigger": {"processing_time": "1 second"},
            },
        }
    )
    max_attempts = 1
    hog = parse_spec(
        {
            "id": "hog",
            "restart": {"max_attempts": max_attempts, "backoff_initial_s": 0.5},
            "pipeline": {
                "source": {"type": "rate", "rows_per_second": 5},
                "transform": {"sql": HOG_SQL},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "hog-out")},
                "isolation": "process",
                "driver_memory": "512m",
            },
        }
    )
    admin = AdminClient(zk, layout)
    admin.create_tasks([steady])
    broker = BrokerProcess.zkctl(spark_env, zk_hosts, "sb", *_spark_args(tmp_path), log=tmp_path / "sb.log")
    try:
        before = wait_for(
            lambda: (st := _status(zk, layout, "steady")) and st.state == "RUNNING" and st.metrics.get("rows") and st,
            180,
            "the shared pipeline to run",
        )
        lease = wait_for(lambda: (ls := _lease(spark_env, "sb", broker.proc.pid)) and ls.pids and ls, 10, "the lease")
        shared_jvm = lease.pids[0]
        admin.create_tasks([hog])
        wait_for(lambda: "hog" in read_owners(zk, layout, ["hog"]), 30, "the hog to be taken")
        owners = read_owners(zk, layout, ["steady", "hog"])  # broker, session, creation time of each owner znode
        generation = _generation(zk, layout)  # the hog's creation's rebalance done: it owns the hog
        failed = wait_for(
            lambda: (st := _status(zk, layout, "hog")) and st.state == "FAILED" and st,
            240,
            "the hog to fail for good",
        )
        assert failed.broker == "sb" and failed.failures == max_attempts + 1, failed
        assert "OutOfMemoryError" in (failed.error or ""), failed.error
        why = failed.last_failure  # why it failed, kept in its status: the JVM's fatal error, with its trace
        assert why is not None and why.kind == "java.lang.OutOfMemoryError" and why.restarts == max_attempts, why
        assert why.trace and "OutOfMemoryError" in why.trace, why.trace
        assert AdminClient(zk, layout).describe_task("hog").last_failure["kind"] == "java.lang.OutOfMemoryError"
        assert failed.metrics.get("isolation") == "process", failed.metrics

        # the neighbour: the same run on the same JVM, its rows still growing; nothing moved or rebalanced
        rows = _status(zk, layout, "steady").metrics["rows"]
        after = wait_for(
            lambda: (
                (st := _status(zk, layout, "steady"))
                and st.state == "RUNNING"
                and st.metrics["rows"] >= rows + 20
                and st
            ),
            60,
            "the shared pipeline's rows to keep growing",
        )
        assert after.metrics["run_id"] == before.metrics["run_id"], (before.metrics, after.metrics)
        assert os.path.exists(f"/proc/{shared_jvm}")
        assert _lease(spark_env, "sb", broker.proc.pid).pids == (shared_jvm,)
        assert read_owners(zk, layout, ["steady", "hog"]) == owners, "an owner znode was let go or taken anew"
        assert _generation(zk, layout) == generation, "the group rebalanced"
        steady_runs = _intervals(zk, layout, "steady")
        assert len(steady_runs) == 1 and steady_runs[0].end is None, steady_runs
        hog_runs = wait_for(
            lambda: len(r := _intervals(zk, layout, "hog")) == max_attempts + 1 and r, 30, "the hog's runs recorded"
        )
        assert {i.broker for i in hog_runs} == {"sb"}
        wait_for(
            lambda: not _lease(spark_env, "sb", broker.proc.pid).pgids, 10, "the hog's driver processes to be gone"
        )
        print(
            f"\n[isolation oom] hog FAILED after {failed.failures} runs: {failed.error[:100]!r}; steady rows "
            f"{before.metrics['rows']} -> {after.metrics['rows']} in run {after.metrics['run_id'][:8]}; "
            f"generation {generation}"
        )
    finally:
        broker.stop()


def test_a_paused_broker_cannot_run_its_isolated_driver_past_its_deadline_and_the_pipeline_moves_exactly_once(
    controller, zk, zk_hosts, layout, spark_env, spark, tmp_path
):
    src, out = tmp_path / "in", tmp_path / "out"
    spec = files_task(
        "iso",
        src,
        out,
        "SELECT id, key, value FROM input",
        max_files=2,
        isolation="process",
        trigger={"processing_time": "0.5 seconds"},
    )
    spec["placement"] = {"pinned": ["sa"]}  # starts on sa (the other broker joins later): a preference
    first = generate(DatagenConfig(out_dir=str(src), records=200, batch=20))
    AdminClient(zk, layout).create_tasks([parse_spec(spec)])
    sa = BrokerProcess.zkctl(
        spark_env, zk_hosts, "sa", *_spark_args(tmp_path), "--lazy-session", log=tmp_path / "sa.log"
    )
    sb = None
    try:
        wait_for(
            lambda: (st := _status(zk, layout, "iso")) and st.state == "RUNNING" and st.metrics.get("rows", 0) >= 100,
            180,
            "the isolated pipeline to run on sa",
        )
        lease = wait_for(lambda: (ls := _lease(spark_env, "sa", sa.proc.pid)) and ls.pgids and ls, 10, "sa's lease")
        assert not lease.pids, "no task of sa runs on a shared driver: its JVM never started"
        (driver,) = lease.pgids
        sb = BrokerProcess.zkctl(
            spark_env, zk_hosts, "sb", *_spark_args(tmp_path), "--lazy-session", log=tmp_path / "sb.log"
        )
        wait_for(lambda: "sb" in zk.get_children(layout.broker_ids), 30, "sb to register")

        gone: dict[str, float] = {}
        zk.exists(layout.broker("sa"), watch=lambda _e: gone.setdefault("session", time.monotonic()))

        def note_death() -> None:
            deadline = time.monotonic() + 60
            while _group_runs(driver) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not _group_runs(driver):
                gone["driver"], gone["driver_wall"] = time.monotonic(), time.time()

        watcher = threading.Thread(target=note_death, name="watch-driver", daemon=True)
        watcher.start()
        os.kill(sa.proc.pid, signal.SIGSTOP)  # the broker's process alone: its driver process goes on
        paused = time.monotonic()
        second = generate(DatagenConfig(out_dir=str(src), records=200, batch=20, start_id=10_000, prefix="more"))
        wait_for(lambda: "driver" in gone, SESSION_S + 5, "the guard to kill the isolated driver's process group")
        wait_for(lambda: "session" in gone, SESSION_S + 10, "the paused broker's session to expire")
        assert gone["driver"] < gone["session"], (gone["driver"] - paused, gone["session"] - paused)
        taken = wait_for(
            lambda: (o := read_owners(zk, layout, ["iso"]).get("iso")) and o[0] == "sb" and o, 60, "sb to take it"
        )
        assert taken[2] > gone["driver_wall"], "sb took the task only after sa's driver was dead"

        # the task moves to sb and resumes from its checkpoint in a driver process of sb's
        third = generate(DatagenConfig(out_dir=str(src), records=200, batch=20, start_id=20_000, prefix="last"))
        wait_for(
            lambda: (st := _status(zk, layout, "iso")) and st.broker == "sb" and st.state == "RUNNING" and st,
            180,
            "the pipeline to run on sb",
        )
        expected = set(first.ids()) | set(second.ids()) | set(third.ids())
        wait_for(lambda: set(sink_ids(spark, out)) >= expected, 180, "the moved pipeline to catch up", interval=2.0)
        ids = sink_ids(spark, out)
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated ids"
        assert set(ids) == expected
        st = wait_for(  # sb's own driver read (at least) the last wave: its status says so (written in batches)
            lambda: (st := _status(zk, layout, "iso")) and st.metrics.get("rows", 0) >= len(third.ids()) and st,
            30,
            "sb's status to count the last wave",
        )
        assert st.broker == "sb" and st.state == "RUNNING" and st.metrics.get("isolation") == "process", st

        os.kill(sa.proc.pid, signal.SIGCONT)  # it finds itself past its deadline: it halts
        wait_for(lambda: sa.exited_at is not None, 20, "the resumed broker to halt")
        assert sa.proc.returncode == EXIT_HALTED, (tmp_path / "sa.log").read_text()[-3000:]
        runs = wait_for(lambda: len(r := _intervals(zk, layout, "iso")) >= 2 and r, 30, "both runs recorded")
        assert [i.broker for i in runs] == ["sa", "sb"], runs
        print(
            f"\n[isolation fence] driver killed {gone['driver'] - paused:.2f}s after the pause, the session "
            f"expired at {gone['session'] - paused:.2f}s; {len(expected)} records exactly once across the move"
        )
    finally:
        try:
            os.kill(sa.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        for b in (sa, sb):
            if b is not None:
                b.stop()


def test_the_fence_kills_an_isolated_driver_that_is_still_starting(tmp_path, monkeypatch):
    """The runner knows an isolated driver from its spawn: a kill at the fence deadline during its start ends
    the child and its JVM, and the start reports that it did not start."""
    require_spark()
    monkeypatch.setenv("ZKC_STATE_DIR", str(tmp_path / "state"))
    # the test process's master: its shared session (the ``spark`` fixture's, if started) is never touched here
    runner = SparkRunner(
        spark_master=TEST_MASTER, spark_conf=dict(TEST_CONF), checkpoint_root=str(tmp_path / "ckpt"), warm_session=False
    )
    spec = parse_spec(
        {
            "id": "slow-start",
            "pipeline": {
                "source": {"type": "rate"},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "out")},
                "isolation": "process",
            },
        }
    )
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            runner.start("slow-start", spec, 1)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    starter = threading.Thread(target=start, name="start-slow-start", daemon=True)
    starter.start()
    try:
        (group,) = wait_for(lambda: runner.processes()[1], 30, "the driver process to be spawned", interval=0.05)
        wait_for(lambda: "java" in _group_members(group), 60, "the driver's JVM to be launched", interval=0.05)
        assert not outcome and "slow-start" not in runner.running(), "still starting"
        # what the deadline watchdog's kill does to the runner's process groups (TaskRunner.kill also kills the
        # shared driver JVM, which in this process is the other tests' session)
        kill_processes((), runner.processes()[1])
        starter.join(60)
        assert len(outcome) == 1 and isinstance(outcome[0], PipelineStartError), outcome
        assert not _group_runs(group), _group_members(group)
        assert runner.processes()[1] == set()
        assert list((tmp_path / "state" / "drivers").iterdir()) == []
    finally:
        runner.close()
