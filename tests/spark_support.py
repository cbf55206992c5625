"""What the Spark tests share: one SparkRunner (one SparkSession) per test session, a runner in a child process
(the "other worker"), a standalone Spark master + worker from the pyspark install, and project copies.

Every process started here is stopped by its id (its process group), also when a test fails. Nothing is
skipped: a missing Java or pyspark fails loudly with what to install.

Run as ``python -m tests.spark_support run-task ...`` it is that child worker: it starts one task on its
own SparkRunner, waits for a condition, stops the task, closes the runner and prints a JSON result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_sim.runners.procs import spawn, stop_process
from broker_sim.runners.spark_session import SparkSetupError, check_java, spark_home
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
# Test JVMs are short-lived: most of their CPU would go to the C2 JIT and parallel GC threads, so they run
# C1-only with the serial collector (about a third less CPU on a 2-core machine). Not a production setting.
TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TEST_CONF = {
    "spark.driver.memory": "768m",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": TEST_JVM_OPTS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTS,
}
TEST_MASTER = "local[2]"


def require_spark() -> str:
    """Java and the Spark inside pyspark, or fail saying what to install."""
    try:
        check_java()
        return spark_home()
    except SparkSetupError as exc:
        pytest.fail(f"Spark tests need it: {exc}", pytrace=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """``tests.waiting.wait_until`` polling less often: a Spark condition is a query of its own."""
    return wait_until(cond, timeout, what, interval)


def copy_project(name: str, dst: Path) -> Path:
    """Copy ``tests/data/<name>`` to ``dst``; its spec's ``/__PROJECT__`` becomes the copy's path."""
    shutil.copytree(DATA / name, dst)
    for spec in dst.glob("spark-pipeline.y*ml"):
        spec.write_text(spec.read_text().replace("/__PROJECT__", str(dst)))
    return dst


def files_task(
    task_id: str, src: Path, out: Path, sql: str, max_files: int | None = None, **pipeline: Any
) -> dict[str, Any]:
    """A task spec document: JSON files of ``broker_sim.sim.datagen`` records -> ``sql`` -> parquet files."""
    from broker_sim.sim.datagen import SCHEMA_DDL

    source: dict[str, Any] = {"type": "files", "format": "json", "path": str(src), "schema": SCHEMA_DDL}
    if max_files is not None:
        source["max_files_per_trigger"] = max_files
    return {
        "id": task_id,
        "pipeline": {
            "kind": "spark",
            "source": source,
            "transform": {"sql": sql},
            "sink": {"type": "files", "format": "parquet", "path": str(out)},
            **pipeline,
        },
    }


def sink_ids(spark: Any, path: Path) -> list[int]:
    """Ids in a file sink, read the way Spark reads it: through the sink's ``_spark_metadata`` commit log."""
    if not (path / "_spark_metadata").exists():
        return []
    return [r.id for r in spark.read.parquet(str(path)).select("id").collect()]


# ---- the shared in-process runner ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def spark_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SparkRunner (so one SparkSession and JVM) for all Spark tests of the session; closed at the end."""
    require_spark()
    from broker_sim.runners.spark import SparkRunner

    runner = SparkRunner(
        spark_master=TEST_MASTER,
        spark_conf=dict(TEST_CONF),
        checkpoint_root=str(tmp_path_factory.mktemp("checkpoints")),
    )
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture(scope="session")
def spark(spark_runner: Any) -> Any:
    return spark_runner.session()


@pytest.fixture
def spark_env(cli_env: dict[str, str]) -> dict[str, str]:
    """``cli_env`` for broker processes on the spark runner, once Java and Spark are known to be there."""
    require_spark()
    return cli_env


@dataclass(frozen=True)
class SparkWorkerCluster:
    """A controller and one spark worker in this process, and an admin client on their root."""

    admin: Any
    worker: Any


@pytest.fixture
def spark_worker(
    zk: Any, zk_settings: Any, layout: Any, tmp_path: Path, spark_runner: Any
) -> Iterator[SparkWorkerCluster]:
    """A controller and one worker ``sb0`` on the spark runner, its checkpoints under ``tmp_path/ck``. The
    worker's runner shares ``spark_runner``'s session (reference counted: closing it keeps the session's JVM for
    the other tests); everything is stopped afterwards, also when the test fails."""
    from broker_sim.runners.spark import SparkRunner
    from broker_sim.worker import Worker, WorkerConfig
    from controller.admin import AdminClient
    from controller.daemon import Controller, ControllerConfig
    from controller.protocol.group.vocabulary import GroupConfig

    ck = tmp_path / "ck"
    runner = SparkRunner(spark_master=TEST_MASTER, spark_conf=dict(TEST_CONF), checkpoint_root=str(ck))
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=10.0))).start()
    worker = None
    try:
        assert ctl.wait_active(15)
        config = WorkerConfig(
            "sb0", zk_settings, status_interval_s=0.2, on_halt="kill", runner="spark", checkpoint_root=str(ck)
        )
        worker = Worker(config, runner=runner).start()
        yield SparkWorkerCluster(AdminClient(zk, layout), worker)
    finally:
        if worker is not None:
            worker.stop()
        else:
            runner.close()
        ctl.stop()


# ---- a runner in a child process -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChildResult:
    result: dict[str, Any]
    output: str
    elapsed_s: float


def run_task_in_child(
    spec: dict[str, Any],
    *,
    checkpoint_root: str,
    workdir: Path,
    master: str = TEST_MASTER,
    conf: dict[str, str] | None = None,
    until_rows: int = 0,
    until_state: str | None = None,
    max_s: float = 120.0,
) -> ChildResult:
    """Run one task on a SparkRunner in another process until ``until_rows`` rows / ``until_state``, then stop it."""
    spec_file = workdir / f"{spec['id']}-spec.json"
    spec_file.write_text(json.dumps(spec))
    out_file = workdir / f"{spec['id']}-child.json"
    log = workdir / f"{spec['id']}-child.log"
    cmd = [
        sys.executable,
        "-m",
        "tests.spark_support",
        "run-task",
        "--spec",
        str(spec_file),
        "--master",
        master,
        "--checkpoint-root",
        checkpoint_root,
        "--until-rows",
        str(until_rows),
        "--max-s",
        str(max_s),
        "--out",
        str(out_file),
    ]
    if until_state:
        cmd += ["--until-state", until_state]
    for k, v in {**TEST_CONF, **(conf or {})}.items():
        cmd += ["--conf", f"{k}={v}"]
    t0 = time.monotonic()
    proc = spawn(cmd, cwd=REPO, log=log, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        proc.wait(timeout=max_s + 90)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_process(proc, grace_s=5, timeout_s=30)  # by its id, whatever happened
    output = log.read_text(errors="replace") if log.exists() else ""
    if not out_file.exists():
        tail = "\n".join(output.splitlines()[-40:])
        pytest.fail(f"child runner wrote no result (exit {proc.returncode}); its log ends with:\n{tail}", pytrace=False)
    return ChildResult(json.loads(out_file.read_text()), output, round(time.monotonic() - t0, 3))


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.spark_support")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run-task")
    p.add_argument("--spec", required=True)
    p.add_argument("--master", required=True)
    p.add_argument("--checkpoint-root", required=True)
    p.add_argument("--conf", action="append", default=[])
    p.add_argument("--until-rows", type=int, default=0)
    p.add_argument("--until-state", default=None)
    p.add_argument("--max-s", type=float, default=120.0)
    p.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from broker_sim.runners.spark import SparkRunner
    from controller.protocol.tasks.spec import parse_spec

    spec = parse_spec(json.loads(Path(args.spec).read_text()))
    conf = dict(c.split("=", 1) for c in args.conf)
    result: dict[str, Any] = {"master": args.master}
    t0 = time.monotonic()
    runner = SparkRunner(spark_master=args.master, spark_conf=conf, checkpoint_root=args.checkpoint_root)
    try:
        sc = runner.session().sparkContext
        result.update(session_start_s=round(time.monotonic() - t0, 3), spark_master=sc.master)
        t1 = time.monotonic()
        runner.start(spec.id, spec, 1)
        result["task_start_s"] = round(time.monotonic() - t1, 3)
        deadline = time.monotonic() + args.max_s
        status = runner.status(spec.id)
        while time.monotonic() < deadline:
            status = runner.status(spec.id)
            if status.state.value in ("FAILED",) or (args.until_state and status.state.value == args.until_state):
                break
            if args.until_rows and status.metrics.get("rows", 0) >= args.until_rows:
                break
            time.sleep(0.2)
        result["executors"] = max(0, int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1)  # minus the driver
        t2 = time.monotonic()
        runner.stop(spec.id, timeout=60)
        result["task_stop_s"] = round(time.monotonic() - t2, 3)
        result.update(state=status.state.value, error=status.error, metrics=status.metrics)
    except Exception as exc:  # reported to the parent, which fails the test with it
        result.update(state="ERROR", error=f"{type(exc).__name__}: {exc}")
    finally:
        runner.close()
        Path(args.out).write_text(json.dumps(result))
    return 0 if result.get("state") not in ("ERROR", "FAILED") else 1


# ---- a standalone Spark cluster from the pyspark install ---------------------------------------------------
@dataclass(frozen=True)
class StandaloneCluster:
    url: str
    webui: str
    master_pid: int
    worker_pid: int

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as resp:
            return json.loads(resp.read())


@contextmanager
def standalone_cluster(
    workdir: Path, cores: int = 1, memory: str = "1g", timeout: float = 120.0
) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and one worker (``spark-class ...deploy.master.Master`` / ``...Worker``).

    Both run in their own process groups and are stopped by id on exit, executors (the worker's children)
    included.
    """
    home = require_spark()
    port, ui_port, worker_ui = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_HOME": home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTS,
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_LOG_DIR": str(workdir / "logs"),
    }
    spark_class = os.path.join(home, "bin", "spark-class")
    workdir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        master = spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            env=env,
            cwd=workdir,
            log=workdir / "master.log",
        )
        procs.append(master)
        url, webui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}"
        wait_for(lambda: _listening(port) or _died(master, workdir / "master.log"), timeout, "the Spark master")
        worker = spawn(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(worker_ui),
                "--work-dir",
                str(workdir / "work"),
            ],
            env=env,
            cwd=workdir,
            log=workdir / "worker.log",
        )
        procs.append(worker)
        cluster = StandaloneCluster(url=url, webui=webui, master_pid=master.pid, worker_pid=worker.pid)
        wait_for(
            lambda: _alive_workers(cluster) >= 1 or _died(worker, workdir / "worker.log"),
            timeout,
            "the Spark worker to register with the master",
        )
        yield cluster
    finally:
        for proc in reversed(procs):
            stop_process(proc, grace_s=10, timeout_s=30)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive_workers(cluster: StandaloneCluster) -> int:
    try:
        return int(cluster.state().get("aliveworkers", 0))
    except OSError:
        return 0


def _died(proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is None:
        return False
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
    pytest.fail(
        f"{proc.args[1] if len(proc.args) > 1 else proc.args} exited with {proc.returncode}:\n{tail}", pytrace=False
    )


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
