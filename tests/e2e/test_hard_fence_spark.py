"""The hard fence deadline with the Spark runner, in real broker processes: a paused broker (SIGSTOP of the
worker process alone) cannot let its driver JVM go on committing micro-batches past the deadline (the lease
guard kills it while the session is still alive), and a broker whose query's stop hangs (its driver JVM
wedged) while ZooKeeper is out of reach halts before its task starts elsewhere."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from broker_sim.runners.procs import process_alive
from broker_sim.sim.netproxy import NetProxy
from broker_sim.worker.deadline import EXIT_HALTED, Lease
from controller.admin import AdminClient
from controller.protocol.tasks.spec import parse_spec
from controller.protocol.tasks.storage import cluster_dir
from tests.broker_processes import BrokerProcess, first_owner_after
from tests.cli_support import until
from tests.spark_support import TEST_CONF

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
