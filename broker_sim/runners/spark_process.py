"""``isolation: process``: a Spark pipeline in a driver process of its own, supervised by the broker.

Why: the shared runner runs every pipeline of a broker in one driver JVM, so a pipeline that exhausts that
JVM's heap (a local driver JVM exits on an OutOfMemoryError) or wedges it takes its neighbours with it. An
isolated pipeline runs in a child process (``python -m broker_sim.runners.spark_driver``) with its own
SparkSession, so its own JVM and heap (``driver_memory``); it dies alone, and the broker reports it FAILED
with the reason and restarts it per its restart policy like any failed task. The cost is a JVM per pipeline
(memory, and a JVM start on every start of the task): docs/pipelines.md has the figures.

The child leads its own process group (its JVM is in it), is SIGKILLed if the broker dies
(``spawn(..., die_with_parent=True)``) and is known to the broker from the instant it is spawned
(``DriverProcesses``): the hard fence kills the group by its id (``TaskRunner.kill``, the lease guard) also
while the pipeline is still starting. Its status comes through a file the child rewrites (``status.json``),
read bounded and validated: what another process wrote is a claim, not a value to trust.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from broker_sim.runners.base import RunState, RunStatus
from broker_sim.runners.procs import group_alive, spawn
from broker_sim.runners.spark_driver import LAUNCH_FILE, STATUS_FILE
from broker_sim.runners.spark_jobs import MAX_ERROR_CHARS, MAX_TRACE_CHARS, PipelineStartError
from broker_sim.runners.spark_session import check_java
from controller.protocol.records.task_records import MAX_FAILURE_KIND_CHARS
from controller.protocol.tasks.spec import SparkPipeline

log = logging.getLogger(__name__)

#: How long an isolated pipeline may take to start: a JVM and a SparkSession, then the query.
START_TIMEOUT_S = 180.0
MAX_STATUS_BYTES = 64 * 1024
MAX_METRICS = 64
MAX_SERIES = 100
RSS_PERIOD_S = 5.0
#: A running driver rewrites its status every ``PERIOD_S`` with a heartbeat; silent this long, it is taken for
#: stopped (SIGSTOP) or wedged and reported FAILED, whatever its last status said.
SILENT_S = 30.0
_REASON = re.compile(r"(java\.lang\.OutOfMemoryError[^\n]*|\[INVALID_DRIVER_MEMORY[^\n]*)")
_POLL_S = 0.1


def read_status(path: Path) -> dict[str, Any] | None:
    """The child's last status, validated: a known state, bounded text, flat metrics and short number series;
    None if absent or bad."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATUS_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_STATUS_BYTES:
        return None
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("state") not in {s.value for s in RunState}:
        return None
    out: dict[str, Any] = {"state": body["state"], "start_failed": body.get("start_failed") is True}
    beat = body.get("beat")
    out["beat"] = float(beat) if isinstance(beat, (int, float)) and not isinstance(beat, bool) else None
    for key, limit in (("error", MAX_ERROR_CHARS), ("trace", MAX_TRACE_CHARS), ("error_type", MAX_FAILURE_KIND_CHARS)):
        value = body.get(key)
        out[key] = value[:limit] if isinstance(value, str) else None
    metrics = body.get("metrics")
    out["metrics"] = {}
    if isinstance(metrics, dict):
        for k, v in list(metrics.items())[:MAX_METRICS]:
            if isinstance(v, str):
                v = v[:500]
            elif isinstance(v, list):  # a series (the last batches' rates): numbers only, bounded
                if len(v) > MAX_SERIES or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                    continue
            elif not (v is None or isinstance(v, (bool, int, float))):
                continue
            out["metrics"][str(k)[:100]] = v
    return out


def _log_tail(path: Path, max_bytes: int = 64 * 1024) -> str:
    """The end of the driver's output, without JVM stack frames."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("at "))


def _group_rss_bytes(pid: int) -> int | None:
    """Resident memory of the driver process and its descendants (its JVM)."""
    try:
        import psutil

        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    except Exception:  # gone between the calls
        return None


class DriverProcess:
    """One isolated pipeline: its driver process, its run directory, its last status."""

    def __init__(
        self,
        task_id: str,
        pipeline: SparkPipeline,
        checkpoint: str,
        master: str,
        conf: Mapping[str, str],
        stop_timeout_s: float,
        on_cleanup: Callable[[DriverProcess], None] = lambda _d: None,
        lease_file: Path | None = None,
    ) -> None:
        self.task_id = task_id
        self.lease_file = lease_file
        self._fault: str | None = None
        self.on_cleanup = on_cleanup
        self.pipeline = pipeline
        self.mode = pipeline.mode
        self.checkpoint = checkpoint
        self.master = master
        self.conf = dict(conf)
        if pipeline.driver_memory is not None:
            self.conf["spark.driver.memory"] = pipeline.driver_memory
        self.stop_timeout_s = stop_timeout_s
        self.started = time.monotonic()
        self.start_s: float | None = None
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"{task_id}-", dir=drivers_dir()))
        self.proc: subprocess.Popen[Any] | None = None
        self._lock = threading.Lock()
        self._rss: tuple[float, int | None] = (0.0, None)
        self._final: RunStatus | None = None
        self._cleaned = False

    @property
    def log(self) -> Path:
        return self.run_dir / "driver.log"

    # ---- start ----------------------------------------------------------------------------------------
    def spawn(self) -> None:
        check_java()
        launch = {
            "task_id": self.task_id,
            "pipeline": self.pipeline.model_dump(mode="json", by_alias=True),
            "checkpoint": self.checkpoint,
            "master": self.master,
            "conf": self.conf,
            "stop_timeout_s": self.stop_timeout_s,
            "broker_pid": os.getpid(),  # (whose run this is: a later broker removes it once that one is gone)
            # the broker's lease: the driver ends its run by the deadline itself (``lease.LeaseKeeper``)
            "lease_file": None if self.lease_file is None else str(self.lease_file.resolve()),
        }
        (self.run_dir / LAUNCH_FILE).write_text(json.dumps(launch))
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS")
        }
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_code_root(), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "broker_sim.runners.spark_driver", str(self.run_dir)]
        with self._lock:
            self.proc = spawn(cmd, env=env, cwd=self.run_dir, log=self.log, die_with_parent=True)

    def wait_started(self, cancelled: threading.Event, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once the child runs the pipeline; raise PipelineStartError with its reason otherwise."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            body = read_status(self.run_dir / STATUS_FILE)
            if body is not None and not body["start_failed"]:
                self.start_s = round(time.monotonic() - self.started, 3)
                return
            if self._fault is not None:  # halted by its broker while it started
                raise PipelineStartError(f"task {self.task_id}: {self._fault}")
            if body is not None or self.proc.poll() is not None:
                self.proc.poll()
                reason, _ = self._failure((body or {}).get("error"), self.proc.returncode)
                reason = reason.removeprefix(f"task {self.task_id}: ")  # the child's PipelineStartError names it
                raise PipelineStartError(f"task {self.task_id}: its driver process did not start: {reason}")
            if cancelled.is_set():
                raise PipelineStartError(f"task {self.task_id}: stopped while its driver process was starting")
            if time.monotonic() >= deadline:
                raise PipelineStartError(
                    f"task {self.task_id}: its driver process did not start within {timeout_s:.0f}s"
                )
            time.sleep(_POLL_S)

    # ---- the _Run interface ---------------------------------------------------------------------------
    def active(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> RunStatus:
        if self._final is not None:
            return self._final
        assert self.proc is not None
        exited = self.proc.poll()  # before the read: a status written before the exit is then the last one
        body = read_status(self.run_dir / STATUS_FILE) or {"state": "STARTING", "metrics": {}}
        metrics = {**body["metrics"], "isolation": "process", "driver_start_s": self.start_s}
        metrics["driver_rss_mb"] = self._rss_mb()
        state = RunState(body["state"])
        if self._fault is not None:  # halted by its broker (killed, or being killed): the reason is the broker's
            status = RunStatus(
                RunState.FAILED, error=self._fault, trace=self._failure(None, exited)[1], metrics=metrics
            )
            if exited is not None:
                self._final = status
            return status
        if exited is None and state in (RunState.RUNNING, RunState.STARTING):
            silent = None if body.get("beat") is None else max(0.0, time.monotonic() - body["beat"])
            if silent is not None:
                metrics["driver_silent_s"] = round(silent, 1)
                if silent >= SILENT_S:
                    error = (
                        f"its driver process (pid {self.proc.pid}) has not answered for {silent:.0f}s (stopped or "
                        "wedged): taken for failed"
                    )
                    return RunStatus(RunState.FAILED, error=error, metrics=metrics)
            return RunStatus(RunState.RUNNING, metrics=metrics)
        if state in (RunState.COMPLETED, RunState.STOPPED):  # finished, or stopped by our SIGTERM
            status = RunStatus(state, metrics=metrics)
        else:  # it said FAILED, or it died without saying why
            error, trace = self._failure(body.get("error"), exited)
            # a JVM's fatal error found in its output is the reason (as in ``_failure``): its class is the kind
            fatal = _REASON.findall(_log_tail(self.log))
            kind = fatal[-1].split(":")[0].split()[0] if fatal else (body.get("error_type") or "DriverExited")
            status = RunStatus(
                RunState.FAILED, error=error, trace=body.get("trace") or trace, metrics=metrics, error_type=kind
            )
        if exited is not None:
            self._final = status
        return status

    def fault(self, reason: str) -> None:
        """Halt the driver now (SIGKILL to its group): its broker can no longer guarantee its deadline. Its
        status is then FAILED with ``reason``; a query killed mid-batch is replayed from its checkpoint."""
        self._fault = reason
        with self._lock:
            proc = self.proc
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _failure(self, said: str | None, exited: int | None) -> tuple[str, str]:
        """(error, trace) of a failed driver: a JVM's fatal error found in its output (an OutOfMemoryError ends
        a local driver's JVM, and the Python side then only sees the connection refused) before what the
        driver said, before how it exited."""
        tail = _log_tail(self.log)
        fatal = _REASON.findall(tail)
        if fatal:
            error = f"{fatal[-1].strip()} (the task's driver process; its JVM exited)"
        elif said:
            error = said
        else:
            last = (tail.strip().splitlines() or ["no output"])[-1][:500]
            error = f"the task's driver process exited with code {exited}: {last}"
        return error[:MAX_ERROR_CHARS], tail[-MAX_TRACE_CHARS:]

    def _rss_mb(self) -> float | None:
        at, rss = self._rss
        now = time.monotonic()
        if now - at >= RSS_PERIOD_S and self.proc is not None and self.proc.poll() is None:
            rss = _group_rss_bytes(self.proc.pid)
            self._rss = (now, rss)
        return None if rss is None else round(rss / 2**20, 1)

    def process_groups(self) -> set[int]:
        with self._lock:
            proc = self.proc
        return {proc.pid} if proc is not None and (proc.poll() is None or group_alive(proc.pid)) else set()

    def stop(self, timeout: float) -> None:
        """SIGTERM the driver (it stops its query, bounded by the stop budget, and its session), SIGKILL its
        group after the stop budget (at most half the timeout): a query killed mid-batch is replayed from its
        checkpoint by the next start, so the kill costs no exactly-once. Return once every process of the group
        is gone, or raise TimeoutError."""
        proc = self.proc
        deadline = time.monotonic() + timeout
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            grace_end = time.monotonic() + min(timeout / 2, self.stop_timeout_s)
            killed = False
            while proc.poll() is None or group_alive(proc.pid):
                now = time.monotonic()
                if not killed and (now >= grace_end or proc.poll() is not None):
                    # the leader is gone (or too slow): nothing of the group may outlive it
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                    killed = True
                if now >= deadline:
                    raise TimeoutError(f"task {self.task_id}: its driver process still runs {timeout:.0f}s after stop")
                time.sleep(0.05)
        self.cleanup()

    def cleanup(self) -> None:
        with self._lock:
            if self._cleaned:
                return
            self._cleaned = True
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.on_cleanup(self)


def _code_root() -> str:
    """The directory holding ``broker_sim``: the child imports the very code the broker runs."""
    return str(Path(__file__).resolve().parent.parent.parent)


def drivers_dir() -> Path:
    """Where isolated drivers' run directories live (one per run: its launch file, status file and log)."""
    drivers = Path(os.environ.get("ZKC_STATE_DIR", ".zkc")).resolve() / "drivers"
    drivers.mkdir(parents=True, exist_ok=True)
    return drivers


def sweep_stale_runs(drivers: Path) -> list[Path]:
    """Remove the run directories whose broker is gone: a broker killed with ``kill -9`` cannot clean up after
    itself (its drivers die with it). A run names its broker's pid in its launch file; a directory whose
    launch file is unreadable, or whose broker lives, is left (at most 10,000 looked at)."""
    removed: list[Path] = []
    for i, run in enumerate(sorted(drivers.iterdir()) if drivers.is_dir() else []):
        if i >= 10_000:
            break
        try:
            pid = json.loads((run / LAUNCH_FILE).read_text()).get("broker_pid")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(pid, int) or pid <= 0 or pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(run, ignore_errors=True)
        removed.append(run)
    if removed:
        log.info("removed %d isolated drivers' run directories left by brokers gone", len(removed))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


class DriverProcesses:
    """The isolated drivers of one runner, known from spawn to stop: what the hard fence kills."""

    def __init__(self, master: str, conf: Mapping[str, str], stop_timeout_s: float) -> None:
        sweep_stale_runs(drivers_dir())
        self.master = master
        self.conf = dict(conf)
        self.stop_timeout_s = stop_timeout_s
        self._lock = threading.Lock()
        self._live: dict[int, DriverProcess] = {}
        self._cancel = threading.Event()
        #: the broker's lease file, handed to every driver started from now on (None: no guard, no lease)
        self.lease_file: Path | None = None

    def start(self, task_id: str, pipeline: SparkPipeline, checkpoint: str) -> DriverProcess:
        """Spawn the task's driver and return once its pipeline runs (or raise with the reason)."""
        driver = DriverProcess(
            task_id,
            pipeline,
            checkpoint,
            self.master,
            self.conf,
            self.stop_timeout_s,
            on_cleanup=self.forget,
            lease_file=self.lease_file,
        )
        with self._lock:
            self._live[id(driver)] = driver
        try:
            driver.spawn()
            driver.wait_started(self._cancel)
        except BaseException:
            driver.stop(30.0)  # its group gone, then forgotten
            raise
        return driver

    def forget(self, driver: DriverProcess) -> None:
        with self._lock:
            self._live.pop(id(driver), None)

    def process_groups(self) -> set[int]:
        with self._lock:
            drivers = list(self._live.values())
        groups: set[int] = set()
        for d in drivers:
            groups |= d.process_groups()
        return groups

    def fault(self, reason: str) -> set[str]:
        """Halt every driver (``DriverProcess.fault``); the ids of their tasks."""
        with self._lock:
            drivers = list(self._live.values())
        for d in drivers:
            d.fault(reason)
        return {d.task_id for d in drivers}

    def close(self) -> None:
        """No start may wait any more (a closing runner stops what runs itself)."""
        self._cancel.set()


__all__ = ["DriverProcess", "DriverProcesses", "read_status", "START_TIMEOUT_S"]
