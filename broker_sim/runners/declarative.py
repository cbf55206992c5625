"""Spark Declarative Pipelines (SDP) projects as tasks: we schedule and fence them, Spark's engine runs them.

How Spark runs a project: ``spark-pipelines run`` is pyspark's ``pyspark/pipelines/cli.py`` (the SDP
client) behind ``spark-submit --remote local``, which boots a Spark Connect server on the fixed port 15002
in a fresh JVM for every run. A second run on the same machine would clash on that port, and every run
would pay a JVM start. So a task gets its own Spark Connect server (``SparkConnectServer`` via
``spark-submit``, on a free loopback port, with an auth token), and each run is Spark's unchanged CLI,
``python -m pyspark.pipelines.cli run --spec ...``, talking to it (``SPARK_REMOTE``). The server lives while
the task is ours; every process is a child in its own process group and ``stop`` kills the client and the
server by their ids and waits for both: once ``stop`` returns nothing of the project runs here any more.

Tables must outlive a server (the next run may be on another worker), so unless the project or the worker
chooses a catalog, the server uses a Hive catalog with an embedded Derby metastore in the project directory
(``metastore_db``, tables under ``spark-warehouse``): the in-memory default forgets tables between runs and
the next run then fails with LOCATION_ALREADY_EXISTS. Derby admits one JVM at a time; the task fences runs
across workers and a lock file (``.zkc-sdp.lock``) refuses a second task on the same project here.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_sim.runners.base import RunState, RunStatus
from broker_sim.runners.procs import spawn, stop_process
from broker_sim.runners.spark_jobs import PipelineStartError
from broker_sim.runners.spark_session import SparkSetupError, check_java, default_conf, is_local, spark_home
from controller.protocol.tasks.spec import DeclarativePipeline, SpecError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
SPEC_FILE_NAMES = ("spark-pipeline.yml", "spark-pipeline.yaml")
LOCK_FILE = ".zkc-sdp.lock"
SERVER_START_TIMEOUT_S = 180.0
_EVENT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?: (?P<msg>.*)$")
_FLOW = re.compile(r"^Flow (?P<flow>\S+?) (?:is|has) (?P<state>[A-Z_]+)\b")
_RUN = re.compile(r"^Run is (?P<state>[A-Z_]+)\b")
_PY_ERROR = re.compile(r"^(?:[\w.]+\.)?(?P<cls>\w+(?:Exception|Error)): (?P<msg>.+)$")
_PY_ERROR_BARE = re.compile(r"^(?:[\w.]+\.)?(?P<cls>\w+(?:Exception|Error)):?$")


log = logging.getLogger(__name__)

# Spark errors that mean a flow's checkpoint was left half-written by a killed run (see _loop)
_REBUILD_ON = ("STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY",)


class DeclarativeError(SpecError):
    """A Declarative Pipelines project Spark refuses (missing spec, bad YAML, a graph that does not resolve)."""


# ---- what a run did -------------------------------------------------------------------------------------
@dataclass
class RunRecord:
    """One ``spark-pipelines run``: its flows' states as Spark reported them, and how it ended."""

    number: int
    started: float = field(default_factory=time.time)
    state: str = "RUNNING"  # Spark's run state (COMPLETED, FAILED, CANCELED) or KILLED when we stopped it
    flows: dict[str, str] = field(default_factory=dict)
    finished: float | None = None
    exit_code: int | None = None
    error: str | None = None
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=300))
    rebuilt: bool = False  # failed on a half-written checkpoint left by a killed owner; the next run rebuilds
    _failure_event: str | None = None
    _spark_error: str | None = None
    _py_error: str | None = None
    _py_error_cls: str | None = None  # an exception line whose message follows on the next line

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and self.exit_code == 0

    def feed(self, line: str) -> None:
        """Fold one line of the SDP client's output (its event log, then any traceback) into the record."""
        self.output.append(line)
        text = line.strip()
        if m := _EVENT.match(line):
            msg = m.group("msg")
            if f := _FLOW.match(msg):
                self.flows[f.group("flow")] = f.group("state")
            elif r := _RUN.match(msg):
                self.state = r.group("state")
            if "fail" in msg.lower() and self._failure_event is None:
                self._failure_event = msg
        elif text.startswith("Error: ") and self._spark_error is None:  # Spark's message under a failure event
            self._spark_error = text.removeprefix("Error: ")
        elif e := _PY_ERROR.match(text):
            self._py_error, self._py_error_cls = f"{e.group('cls')}: {e.group('msg')}", None
        elif (e := _PY_ERROR_BARE.match(text)) is not None:
            self._py_error_cls = e.group("cls")
        elif self._py_error_cls and text:
            self._py_error, self._py_error_cls = f"{self._py_error_cls}: {text}", None

    def finish(self, exit_code: int | None, killed: bool) -> None:
        self.finished = time.time()
        self.exit_code = exit_code
        if killed:
            self.state = "KILLED"
        elif exit_code != 0 and self.state in ("RUNNING", "COMPLETED"):
            self.state = "FAILED"
        if self.ok or killed:
            return
        failed = [f for f, s in self.flows.items() if s == "FAILED"]
        if self._spark_error:
            self.error = f"{self._failure_event} {self._spark_error}" if self._failure_event else self._spark_error
        elif self._py_error:
            self.error = self._py_error
        elif failed:
            self.error = f"flows failed: {', '.join(failed)}"
        else:
            self.error = f"spark-pipelines exited with code {exit_code}"

    def metrics(self) -> dict[str, Any]:
        states = list(self.flows.values())
        return {
            "last_run": self.number,
            "last_run_state": self.state,
            "last_run_ok": self.ok,
            "last_run_s": round((self.finished or time.time()) - self.started, 3),
            "flows": dict(self.flows),
            "flows_completed": states.count("COMPLETED"),
            "flows_failed": states.count("FAILED"),
        }


# ---- the project ----------------------------------------------------------------------------------------
def project_spec_file(project: str | Path) -> Path:
    """The project's ``spark-pipeline.yml``, checked by Spark's own spec loader (fields, libraries globs)."""
    root = Path(project)
    if not root.is_dir():
        raise DeclarativeError(f"declarative project {project}: not a directory")
    found = [root / n for n in SPEC_FILE_NAMES if (root / n).is_file()]
    if not found:
        raise DeclarativeError(
            f"declarative project {project}: no {' or '.join(SPEC_FILE_NAMES)} in it "
            f"(create one with `spark-pipelines init`)"
        )
    if len(found) > 1:
        raise DeclarativeError(f"declarative project {project}: both {SPEC_FILE_NAMES[0]} and {SPEC_FILE_NAMES[1]}")
    try:
        from pyspark.pipelines.cli import load_pipeline_spec
    except ImportError as exc:
        raise SparkSetupError(
            f"Spark Declarative Pipelines need pyspark[connect] and pyyaml ({exc}): "
            "pip install 'pyspark[connect]==4.3.0' pyyaml"
        ) from None
    try:
        load_pipeline_spec(found[0])
    except Exception as exc:  # PySparkException, yaml errors, KeyError on a malformed libraries entry
        raise DeclarativeError(f"declarative project {project}: {found[0].name}: {exc}") from None
    return found[0]


def _project_configuration(spec_file: Path) -> dict[str, str]:
    from pyspark.pipelines.cli import load_pipeline_spec

    return dict(load_pipeline_spec(spec_file).configuration)


def catalog_conf(project: Path) -> dict[str, str]:
    """A persistent catalog inside the project: Hive with an embedded Derby metastore."""
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(project / "spark-warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={project / 'metastore_db'};create=true",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [ln for ln in text if not ln.startswith("\tat ")]
    return "\n".join(keep[-lines:])


# ---- the Spark Connect server a task's runs talk to ------------------------------------------------------
@dataclass
class ConnectServer:
    """A Spark Connect server in a child process (its own process group), reachable on loopback only."""

    proc: subprocess.Popen[bytes]
    port: int
    token: str
    log: Path
    startup_s: float

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}"  # 'localhost' lets the client send the token without TLS

    def stop(self, timeout_s: float) -> None:
        stop_process(self.proc, grace_s=min(10.0, timeout_s / 2), timeout_s=timeout_s)

    @classmethod
    def start(
        cls,
        *,
        master: str,
        conf: dict[str, str],
        cwd: Path,
        log: Path,
        name: str,
        timeout_s: float = SERVER_START_TIMEOUT_S,
        stop_event: threading.Event | None = None,
    ) -> ConnectServer:
        """Launch ``SparkConnectServer`` and return once it accepts connections (or raise with its log's tail)."""
        check_java()
        home = spark_home()
        token = secrets.token_hex(16)
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS")
        }
        env.update(SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
        if is_local(master):
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between our probe and the server's bind
            port = _free_port()
            settings = {
                **conf,
                "spark.connect.grpc.binding.address": "127.0.0.1",
                "spark.connect.grpc.binding.port": str(port),
            }
            cmd = [
                os.path.join(home, "bin", "spark-submit"),
                "--class",
                SERVER_CLASS,
                "--name",
                name,
                "--master",
                master,
            ]
            for key, value in settings.items():
                cmd += ["--conf", f"{key}={value}"]
            t0 = time.monotonic()
            proc = spawn(cmd, env=env, cwd=cwd, log=log, die_with_parent=True)  # no orphan after a kill -9
            deadline = t0 + timeout_s
            while time.monotonic() < deadline and proc.poll() is None:
                if stop_event is not None and stop_event.is_set():
                    stop_process(proc, grace_s=2.0, timeout_s=30.0)
                    raise PipelineStartError(f"{name}: stopped while the Spark Connect server was starting")
                if _listening(port):
                    return cls(proc=proc, port=port, token=token, log=log, startup_s=round(time.monotonic() - t0, 3))
                time.sleep(0.2)
            stop_process(proc, grace_s=2.0, timeout_s=30.0)
            last_error = _tail(log)
            if "Address already in use" not in last_error and "BindException" not in last_error:
                break
        raise PipelineStartError(
            f"{name}: the Spark Connect server did not come up within {timeout_s:.0f}s; "
            f"its log ends with:\n{last_error}"
        )


def run_cli(command: str, spec_file: Path, server: ConnectServer, extra: Iterable[str] = ()) -> subprocess.Popen[str]:
    """Spark's SDP client (what ``spark-pipelines`` runs) against ``server``; output on a pipe."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_LOCAL_REMOTE", "PYSPARK_SUBMIT_ARGS")}
    env.update(
        SPARK_REMOTE=server.url,
        SPARK_CONNECT_AUTHENTICATE_TOKEN=server.token,
        PYTHONUNBUFFERED="1",
        SPARK_HOME=spark_home(),
    )
    cmd = [sys.executable, "-m", "pyspark.pipelines.cli", command, "--spec", str(spec_file), *extra]
    return spawn(cmd, env=env, cwd=spec_file.parent, pipe_output=True, die_with_parent=True)


def _follow(proc: subprocess.Popen[str], record: RunRecord) -> int:
    """Feed the client's output into ``record`` until it exits (EOF comes at the latest when it is killed)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        record.feed(line.rstrip("\n"))
    return proc.wait()


class _ProjectLock:
    """An exclusive, non-blocking flock on ``<project>/.zkc-sdp.lock``: one run of a project per machine."""

    def __init__(self, project: Path, owner: str) -> None:
        self.path = project / LOCK_FILE
        self.owner = owner
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise PipelineStartError(f"{self.owner}: cannot create {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise PipelineStartError(
                f"{self.owner}: project {self.path.parent} is being run by another task ({holder or 'unknown'})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.owner} pid {os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


# ---- the task ---------------------------------------------------------------------------------------------
class DeclarativeRun:
    """A DeclarativePipeline task: a Connect server, then Spark's SDP runs once or every ``interval_s``."""

    mode = "declarative"

    def __init__(
        self, task_id: str, pipeline: DeclarativePipeline, master: str, spark_conf: dict[str, str] | None = None
    ) -> None:
        self.task_id = task_id
        self.pipeline = pipeline
        self.master = master
        self.spark_conf = dict(spark_conf or {})
        self.project = Path(pipeline.project).resolve()
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: ConnectServer | None = None
        self._client: subprocess.Popen[str] | None = None
        self._records: list[RunRecord] = []
        self._outcome: RunStatus | None = None
        self._next_run_at: float | None = None
        self._thread: threading.Thread | None = None
        self._workdir = Path(tempfile.mkdtemp(prefix=f"zkc-sdp-{task_id}-"))
        self._project_lock = _ProjectLock(self.project, f"task {task_id}")
        self._cleaned = False

    def server_conf(self, spec_file: Path) -> dict[str, str]:
        project_conf = _project_configuration(spec_file)
        conf = default_conf(self.master)
        conf["spark.local.dir"] = str(self._workdir / "local")  # scratch removed with the task, even after a SIGKILL
        if "spark.sql.catalogImplementation" not in {**self.spark_conf, **project_conf}:
            conf.update(catalog_conf(self.project))
        conf.update(self.spark_conf)
        conf.update(project_conf)  # static settings of the project (the client sets only runtime ones)
        return conf

    def start(self) -> DeclarativeRun:
        """Start the task's Connect server (blocks until it listens), then the run loop in a named thread."""
        try:
            spec_file = project_spec_file(self.project)
        except DeclarativeError as exc:
            raise PipelineStartError(f"task {self.task_id}: {exc}") from None
        self._project_lock.acquire()
        try:
            self._server = ConnectServer.start(
                master=self.master,
                conf=self.server_conf(spec_file),
                cwd=self.project,
                log=self._workdir / "connect-server.log",
                name=f"zkc-sdp-{self.task_id}",
                stop_event=self._stop,
            )
        except BaseException:
            self._cleanup(30.0)
            raise
        self._thread = threading.Thread(target=self._loop, args=(spec_file,), name=f"sdp-{self.task_id}", daemon=True)
        self._thread.start()
        return self

    def _loop(self, spec_file: Path) -> None:
        normal = ["--full-refresh-all"] if self.pipeline.full_refresh else []
        extra = normal
        number = 0
        try:
            while not self._stop.is_set():
                number += 1
                record = RunRecord(number)
                with self._lock:
                    if self._stop.is_set():
                        return
                    assert self._server is not None
                    self._client = run_cli("run", spec_file, self._server, extra)
                    self._records.append(record)
                    del self._records[:-20]
                code = _follow(self._client, record)
                record.finish(code, killed=self._stop.is_set())
                if self._stop.is_set():
                    return
                if not record.ok:
                    text = f"{record.error or ''}\n" + "\n".join(record.output)
                    if extra is normal and any(code in text for code in _REBUILD_ON):
                        # a previous owner was killed inside a flow's first batch: its checkpoint holds
                        # offsets that were never committed and Spark refuses it. Rebuild the tables from
                        # their sources with Spark's own full refresh (exactly once by recomputation).
                        log.warning(
                            "task %s: %s; running once with --full-refresh-all",
                            self.task_id,
                            next(code for code in _REBUILD_ON if code in text),
                        )
                        record.rebuilt = True
                        extra = ["--full-refresh-all"]
                        continue
                    self._outcome = RunStatus(
                        RunState.FAILED, error=record.error, trace="\n".join(record.output), metrics=self._metrics()
                    )
                    return
                extra = normal
                if self.pipeline.interval_s is None:
                    self._outcome = RunStatus(RunState.COMPLETED, metrics=self._metrics())
                    return
                self._next_run_at = time.monotonic() + self.pipeline.interval_s
                if self._stop.wait(self.pipeline.interval_s):
                    return
                self._next_run_at = None
        except BaseException as exc:  # a bug or a vanished interpreter: report, never hang the task
            self._outcome = RunStatus(RunState.FAILED, error=f"declarative run loop failed: {exc!r}")
        finally:
            if not self._stop.is_set():  # finished on its own: free the server now; stop() handles the rest
                self._cleanup(60.0)

    def _metrics(self) -> dict[str, Any]:
        with self._lock:
            records = list(self._records)
            server = self._server
        out: dict[str, Any] = {
            "mode": self.mode,
            "project": str(self.project),
            "runs": len(records),
            "runs_ok": sum(r.ok for r in records),
            "rebuilds": sum(r.rebuilt for r in records),
            "uptime_s": round(time.monotonic() - self.started, 3),
        }
        if server is not None:
            out.update(server_pid=server.proc.pid, server_port=server.port, server_start_s=server.startup_s)
        if records:
            out.update(records[-1].metrics())
        if self._next_run_at is not None:
            out["next_run_in_s"] = round(max(0.0, self._next_run_at - time.monotonic()), 3)
        return out

    def active(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> RunStatus:
        outcome = self._outcome
        if outcome is not None:
            return RunStatus(outcome.state, error=outcome.error, trace=outcome.trace, metrics=self._metrics())
        return RunStatus(RunState.RUNNING, metrics=self._metrics())

    def process_groups(self) -> set[int]:
        """The process groups of this run's client and server (each leads its own): what a halt kills."""
        with self._lock:
            client, server = self._client, self._server
        groups = set()
        if client is not None and client.poll() is None:
            groups.add(client.pid)
        if server is not None and server.proc.poll() is None:
            groups.add(server.proc.pid)
        return groups

    def _cleanup(self, timeout: float) -> None:
        """Kill the client and the server (by their ids) and wait for both; release the project. Idempotent."""
        deadline = time.monotonic() + timeout
        with self._lock:
            client, server = self._client, self._server
        if client is not None:
            stop_process(client, grace_s=min(3.0, timeout / 4), timeout_s=max(1.0, deadline - time.monotonic()))
        if server is not None:
            server.stop(max(1.0, deadline - time.monotonic()))
        with self._lock:
            if self._cleaned:
                return
            self._cleaned = True
        self._project_lock.release()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def stop(self, timeout: float) -> None:
        """Kill a run in progress and the server, and wait for them: afterwards no process of this task is left."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        self._cleanup(timeout)
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
            if self._thread.is_alive():
                raise TimeoutError(f"task {self.task_id}: declarative run loop still alive {timeout:.0f}s after stop")


def validate_declarative(
    project: str | Path,
    *,
    spark_master: str = "local[1]",
    spark_conf: dict[str, str] | None = None,
    timeout_s: float = 240.0,
) -> None:
    """Check a project with Spark's own ``dry-run`` (graph resolution, no data written); raise DeclarativeError.

    The dry run uses a throw-away in-memory catalog and warehouse, so it neither touches the project's
    tables nor contends with a run of it in progress. Costs a Spark Connect server start (seconds).
    """
    root = Path(project).resolve()
    spec_file = project_spec_file(root)
    workdir = Path(tempfile.mkdtemp(prefix="zkc-sdp-validate-"))
    try:
        conf = {
            **default_conf(spark_master),
            **(spark_conf or {}),
            **_project_configuration(spec_file),
            "spark.sql.catalogImplementation": "in-memory",
            "spark.sql.warehouse.dir": str(workdir / "warehouse"),
            "spark.local.dir": str(workdir / "local"),
        }
        try:
            server = ConnectServer.start(
                master=spark_master,
                conf=conf,
                cwd=workdir,
                log=workdir / "server.log",
                name="zkc-sdp-validate",
                timeout_s=timeout_s,
            )
        except PipelineStartError as exc:
            raise SparkSetupError(str(exc)) from None
        try:
            record = RunRecord(0)
            proc = run_cli("dry-run", spec_file, server)
            done = threading.Event()
            timer = threading.Timer(timeout_s, lambda: done.is_set() or stop_process(proc, grace_s=1, timeout_s=30))
            timer.name = "sdp-validate-timeout"
            timer.start()
            try:
                code = _follow(proc, record)
            finally:
                done.set()
                timer.cancel()
            record.finish(code, killed=False)
        finally:
            server.stop(60.0)
        if not record.ok:
            raise DeclarativeError(f"declarative project {project}: Spark's dry-run failed: {record.error}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = [
    "DeclarativeRun",
    "DeclarativeError",
    "ConnectServer",
    "RunRecord",
    "validate_declarative",
    "project_spec_file",
    "run_cli",
    "catalog_conf",
]
