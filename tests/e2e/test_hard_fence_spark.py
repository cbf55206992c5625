"""The hard fence deadline with the Spark runner, in real broker processes: a paused broker (SIGSTOP of the
worker process alone) cannot let its driver JVM go on committing micro-batches past the deadline (the lease
guard kills it while the session is still alive), a broker whose query's stop hangs (its driver JVM
wedged) while ZooKeeper is out of reach halts before its task starts elsewhere, and a broker whose driver JVM
dies under it (kill -9) halts at once, so that its pipeline moves and resumes from its checkpoint."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from broker_sim.runners.procs import process_alive
from broker_sim.sim.datagen import DatagenConfig, generate
from broker_sim.sim.netproxy import NetProxy
from broker_sim.worker.deadline import EXIT_HALTED, Lease
from controller.admin import AdminClient
from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import parse_spec
from controller.protocol.tasks.storage import cluster_dir
from tests.broker_processes import BrokerProcess, first_owner_after
from tests.broker_processes import owners as read_owners
from tests.cli_support import until
from tests.spark_support import TEST_CONF, files_task, sink_ids, wait_for

SESSION_S = 8.0


def _rate_task(task_id: str, out: Path):
    return parse_spec(
        {
            "id": task_id,
            "pipeline": {
                "kind": "spark",
                "source": {"type": "rate", "rows_per_second": 20},
                "sink": {"type": "files", "format": "parquet", "path": str(out)},
                "trigger": {"processing_time": "0.5 seconds"},
            },
        }
    )


def _spark_args(tmp_path: Path) -> list[str]:
    args = [
        "--runner",
        "spark",
        "--spark-master",
        "local[1]",
        "--checkpoint-root",
        str(tmp_path / "ckpt"),
        "--session-timeout",
        str(SESSION_S),
    ]
    for k, v in {**TEST_CONF, "spark.sql.shuffle.partitions": "1"}.items():
        args += ["--spark-conf", f"{k}={v}"]
    return args


def _commits(tmp_path: Path, root: str, task: str) -> list[Path]:
    """The task's committed batches: under the broker's checkpoint root, scoped by the cluster root."""
    d = tmp_path / "ckpt" / cluster_dir(root) / task / "commits"
    return sorted(p for p in d.glob("[0-9]*")) if d.is_dir() else []


def _lease(cli_env, bid: str, pid: int) -> Lease | None:
    path = Path(cli_env["ZKC_STATE_DIR"]) / "leases" / f"{bid}-{pid}.json"
    try:
        return Lease.decode(path.read_text())
    except (OSError, ValueError):
        return None


def _note_death(pid: int, gone: dict[str, float]) -> None:
    deadline = time.monotonic() + 60
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not process_alive(pid):
        gone["jvm"] = time.monotonic()


def test_a_paused_broker_cannot_commit_batches_past_its_deadline(controller, zk, zk_hosts, layout, spark_env, tmp_path):
    AdminClient(zk, layout).create_tasks([_rate_task("s1", tmp_path / "out")])
    broker = BrokerProcess.zkctl(spark_env, zk_hosts, "sb", *_spark_args(tmp_path), log=tmp_path / "sb.log")
    try:
        until(lambda: len(_commits(tmp_path, layout.root, "s1")) >= 2, 180, "two committed micro-batches")
        lease = _lease(spark_env, "sb", broker.proc.pid)
        assert lease is not None and lease.pids and lease.expires is not None, lease
        jvm = lease.pids[0]
        assert process_alive(jvm)
        gone: dict[str, float] = {}
        zk.exists(layout.broker("sb"), watch=lambda _e: gone.setdefault("session", time.monotonic()))
        watcher = threading.Thread(target=_note_death, args=(jvm, gone), name="watch-jvm", daemon=True)
        watcher.start()
        os.kill(broker.proc.pid, signal.SIGSTOP)  # the worker process alone: its JVM goes on
        paused = time.monotonic()
        until(lambda: "jvm" in gone, SESSION_S + 5, "the guard to kill the driver JVM")
        until(lambda: "session" in gone, SESSION_S + 10, "the paused broker's session to expire")
        # the JVM died (noticed within 10 ms) before the session expired: nobody else could have started the task
        assert gone["jvm"] < gone["session"], (gone["jvm"] - paused, gone["session"] - paused)
        assert gone["jvm"] - paused < SESSION_S
        done = len(_commits(tmp_path, layout.root, "s1"))
        time.sleep(1.0)
        assert len(_commits(tmp_path, layout.root, "s1")) == done  # nothing commits any more
        os.kill(broker.proc.pid, signal.SIGCONT)  # it finds itself past its deadline: it halts
        until(lambda: broker.exited_at is not None, 20, "the resumed broker to halt")
        log = (tmp_path / "sb.log").read_text()
        assert broker.proc.returncode == EXIT_HALTED, log[-3000:]
        # halted for being past its deadline, or because the fence's stop of the dead JVM's query failed first
        assert "HALTING" in log, log[-3000:]
    finally:
        try:
            os.kill(broker.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        broker.stop()


def test_a_partitioned_spark_broker_whose_query_will_not_stop_halts_before_the_task_moves(
    controller, zk, zk_hosts, layout, spark_env, tmp_path
):
    AdminClient(zk, layout).create_tasks([_rate_task("s2", tmp_path / "out")])
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    proxy = NetProxy(host, int(port), name="proxy-spark")
    broker = other = None
    try:
        broker = BrokerProcess.zkctl(spark_env, proxy.address, "sb", *_spark_args(tmp_path), log=tmp_path / "sb.log")
        until(lambda: len(_commits(tmp_path, layout.root, "s2")) >= 1, 180, "a committed micro-batch")
        lease = _lease(spark_env, "sb", broker.proc.pid)
        assert lease is not None and lease.pids, lease
        jvm = lease.pids[0]
        os.kill(jvm, signal.SIGSTOP)  # a wedged driver: the query's stop cannot return
        proxy.partition()
        cut = time.time()
        other = BrokerProcess.zkctl(
            spark_env,
            zk_hosts,
            "other",
            "--runner",
            "noop",
            "--session-timeout",
            str(SESSION_S),
            log=tmp_path / "other.log",
        )
        taken = first_owner_after(zk, layout, ["s2"], "other", 60)
        until(lambda: broker.exited_at is not None, 10, "the wedged broker to exit")
        log = (tmp_path / "sb.log").read_text()
        assert broker.proc.returncode == EXIT_HALTED, log[-3000:]
        assert "HALTING" in log, log[-3000:]
        assert broker.exited_at < taken, (broker.exited_at - cut, taken - cut)
        assert not process_alive(jvm)
    finally:
        proxy.heal()
        proxy.close()
        for b in (broker, other):
            if b is not None:
                b.stop()


def _status(zk, layout, t: str) -> task_records.TaskStatus | None:
    try:
        data, _ = zk.get(layout.status(t))
    except Exception:
        return None
    return codecs.decode(task_records.TaskStatus, data)


#: how long a broker may take from its driver JVM's death to its exit: the watchdog looks every 0.25 s at most
#: (a loaded 2-core machine delays a thread by seconds, not tens of them)
HALT_BOUND_S = 10.0


@pytest.mark.timeout(420)
def test_a_broker_whose_driver_jvm_died_halts_and_its_pipeline_moves_exactly_once(
    controller, zk, zk_hosts, layout, spark_env, spark, tmp_path
):
    src, out = tmp_path / "in", tmp_path / "out"
    spec = files_task("dd", src, out, "SELECT id, key, value FROM input", max_files=2)
    spec["pipeline"]["trigger"] = {"processing_time": "0.5 seconds"}
    spec["placement"] = {"pinned": ["sa"]}  # starts on sa (the other broker joins later): a preference
    first = generate(DatagenConfig(out_dir=str(src), records=200, batch=20))
    AdminClient(zk, layout).create_tasks([parse_spec(spec)])
    sa = BrokerProcess.zkctl(spark_env, zk_hosts, "sa", *_spark_args(tmp_path), log=tmp_path / "sa.log")
    sb = None
    try:
        wait_for(
            lambda: (st := _status(zk, layout, "dd")) and st.state == "RUNNING" and st.metrics.get("rows", 0) >= 60,
            180,
            "the pipeline to run on sa",
        )
        lease = wait_for(lambda: (ls := _lease(spark_env, "sa", sa.proc.pid)) and ls.pids and ls, 10, "sa's lease")
        (jvm,) = lease.pids  # the driver JVM sa's session launched: every query of sa runs in it
        with open(f"/proc/{jvm}/cmdline", "rb") as f:
            assert b"java" in f.read()
        sb = BrokerProcess.zkctl(
            spark_env, zk_hosts, "sb", *_spark_args(tmp_path), "--lazy-session", log=tmp_path / "sb.log"
        )
        wait_for(lambda: "sb" in zk.get_children(layout.broker_ids), 30, "sb to register")

        os.kill(jvm, signal.SIGKILL)  # the OOM killer, a crash: not the broker's own stop
        killed = time.time()
        wait_for(lambda: sa.proc.poll() is not None, HALT_BOUND_S, "the broker to halt", interval=0.05)
        halted = sa.exited_at or time.time()  # (its watcher notices within 10 ms, for its first 300 s)
        log = (tmp_path / "sa.log").read_text()
        assert sa.proc.returncode == EXIT_HALTED, log[-3000:]
        assert f"HALTING: its Spark driver JVM (pid {jvm}) exited with signal 9 (SIGKILL)" in log, log[-3000:]

        # the pipeline moves to sb once sa's session expired, and resumes from its checkpoint there
        second = generate(DatagenConfig(out_dir=str(src), records=200, batch=20, start_id=10_000, prefix="more"))
        taken = wait_for(
            lambda: (o := read_owners(zk, layout, ["dd"]).get("dd")) and o[0] == "sb" and o, 60, "sb to take it"
        )
        assert taken[2] > halted, "sb took the task only after sa had exited"
        wait_for(
            lambda: (st := _status(zk, layout, "dd")) and st.broker == "sb" and st.state == "RUNNING" and st,
            180,
            "the pipeline to run on sb",
        )
        expected = set(first.ids()) | set(second.ids())
        wait_for(lambda: set(sink_ids(spark, out)) >= expected, 180, "the moved pipeline to catch up", interval=2.0)
        ids = sink_ids(spark, out)
        assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicated ids"
        assert set(ids) == expected
        runs = [i for i in AdminClient(zk, layout).intervals() if i.task_id == "dd"]
        assert [i.broker for i in runs] == ["sa", "sb"], runs
        print(
            f"\n[dead driver] sa halted {halted - killed:.2f}s after its JVM's kill -9; sb took the task "
            f"{taken[2] - killed:.2f}s after it; {len(expected)} records exactly once across the move"
        )
    finally:
        for b in (sa, sb):
            if b is not None:
                b.stop()
