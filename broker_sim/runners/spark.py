"""The ``spark`` runner: a worker's pipelines on one shared SparkSession (one streaming query per task).

- ``SparkPipeline`` tasks run in this process's SparkSession (``spark_jobs``): streaming as one query with
  its checkpoint at ``<checkpoint_root>/<task_id>``, batch once in a named thread. Those with
  ``isolation: process`` run the same way in a driver process of their own (``spark_process``).
- ``DeclarativePipeline`` tasks are run by Spark's own Declarative Pipelines engine in child processes
  (``declarative``), on the same master and settings.
- ``NoopPipeline`` tasks are simulated (``noop``), so a Spark worker can take any task of its group.

``prepare`` (a planned roll's warm-up) does a streaming ``SparkPipeline``'s start up to the query itself (its
session, the analysed frame, the configured writer: ``spark_jobs.PreparedQuery``) on the broker's running
session; a ``start`` of the same spec then only starts the query. Other pipelines prepare nothing.

Thread-safe: the worker calls ``start``/``stop`` for different tasks concurrently; calls for one task are
serialised by a per-task lock. ``stop`` returns only once the task's Spark work has terminated, or raises.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from broker_sim.runners.base import RunState, RunStatus, TaskRunner
from broker_sim.runners.spark_jobs import BatchRun, PipelineStartError, PreparedQuery, StreamingRun
from broker_sim.runners.spark_process import DriverProcesses
from broker_sim.runners.spark_session import (
    SessionHolder,
    SparkSetupError,
    acquire_session,
    default_conf,
    local_master,
    release_session,
)
from controller.protocol.cluster.layout import DEFAULT_ROOT
from controller.protocol.records.registration_records import MAX_SESSION_ERROR_CHARS, SessionInfo, SessionState
from controller.protocol.tasks.spec import DeclarativePipeline, NoopPipeline, SparkPipeline, TaskSpec
from controller.protocol.tasks.storage import checkpoint_root as decide_checkpoint_root

log = logging.getLogger(__name__)

# A streaming query's stop interrupts its micro-batch and waits for the stream thread: about a second on an
# idle machine, 2-8 s measured on a loaded 2-core one. The worker fences this long before its session can
# expire (at most half the session timeout; see broker_sim/worker.py), so brokers on the spark runner want a
# session timeout of at least twice this.
DEFAULT_STOP_BUDGET_S = 4.0


class _Run(Protocol):
    def active(self) -> bool: ...

    def status(self) -> RunStatus: ...

    def stop(self, timeout: float) -> None: ...


def checkpoint_location(root: str, task_id: str) -> str:
    """``<root>/<task_id>``; ``root`` is a local directory or any Hadoop URL (``hdfs://``, ``s3a://``)."""
    if "://" in root or root.startswith("file:"):
        return f"{root.rstrip('/')}/{task_id}"
    return os.path.join(os.path.abspath(root), task_id)


class _NoopRun:
    """A NoopPipeline on a Spark worker: delegated to the no-op runner, so mixed groups work."""

    def __init__(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        from broker_sim.runners.noop import NoopRunner

        self._runner = NoopRunner()
        self._task_id = task_id
        self._runner.start(task_id, spec, generation)

    def active(self) -> bool:
        return self.status().state == RunState.RUNNING

    def status(self) -> RunStatus:
        return self._runner.status(self._task_id)

    def stop(self, timeout: float) -> None:
        self._runner.stop(self._task_id, timeout)


def warm_jvm(spark: Any) -> None:
    """Run one tiny streaming pipeline (JSON files -> SQL -> parquet, checkpointed, ``availableNow``) in a temporary
    directory: a fresh JVM loads and compiles the classes of the file source, the micro-batch engine and the
    parquet sink on its first query, which made a pipeline's first batch take 10-15 s on a busy 2-core machine.
    Paid here, before the broker joins, it is off every task's path. A failure is only logged: the session is up."""
    import tempfile

    tmp = tempfile.mkdtemp(prefix="zkc-warm-")
    try:
        src = os.path.join(tmp, "in")
        os.makedirs(src)
        with open(os.path.join(src, "warm.json"), "w", encoding="utf-8") as f:
            f.write('{"id": 1, "key": "k", "value": 1.0}\n')
        frame = spark.readStream.format("json").schema("id BIGINT, key STRING, value DOUBLE").load(src)
        query = (
            frame.selectExpr("id", "key", "value * 2 AS scaled")
            .writeStream.format("parquet")
            .option("path", os.path.join(tmp, "out"))
            .option("checkpointLocation", os.path.join(tmp, "chk"))
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(120):
            query.stop()
    except Exception as exc:  # a warm-up only: the session itself started
        log.warning("the SparkSession's warm-up pipeline failed (tasks will pay the first query): %s", exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class SparkRunner(TaskRunner):
    """Runs a worker's tasks on Spark. One instance per worker process (all share one SparkContext)."""

    name = "spark"
    runs_processes = True  # the driver JVM, Declarative Pipelines runs

    def __init__(
        self,
        spark_master: str | None = None,
        spark_conf: dict[str, str] | None = None,
        checkpoint_root: str | None = None,
        app_name: str = "zkcontroller-worker",
        stop_budget_s: float = DEFAULT_STOP_BUDGET_S,
        warm_session: bool = True,
    ) -> None:
        self.spark_master = spark_master or local_master()
        #: start the SparkSession before the broker joins (``warm_up``); False: the first task starts it
        self.warm_session = warm_session
        self._created_at = time.time()
        self._warm_error: str | None = None
        self._warm_s: float | None = None  # how long ``warm_up`` took: the session and the warm-up pipeline
        self.stop_budget_s = stop_budget_s
        # StreamingQuery.stop() waits forever by default (stopTimeout 0): bound it by the stop budget; a stop
        # that times out raises, and the worker treats that as "not stopped" (it escalates)
        stop_timeout_ms = {"spark.sql.streaming.stopTimeout": str(max(1, int(stop_budget_s * 1000)))}
        self.spark_conf = {**default_conf(self.spark_master), **stop_timeout_ms, **(spark_conf or {})}
        self.user_conf = dict(spark_conf or {})
        if checkpoint_root is None:  # a runner built alone (benchmarks, scripts): the brokers' default, decided now
            checkpoint_root = decide_checkpoint_root(
                None, os.environ, os.environ.get("ZKC_STATE_DIR", ".zkc"), DEFAULT_ROOT, os.getcwd()
            )
        self.checkpoint_root = str(checkpoint_root)
        self.app_name = app_name
        self._holder: SessionHolder | None = acquire_session(self.spark_master, self.spark_conf, app_name)
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[TaskSpec, _Run]] = {}
        self._task_locks: dict[str, threading.Lock] = {}
        #: task -> (the spec it was prepared for, what was prepared): taken by its start, dropped by ``discard``
        self._prepared: dict[str, tuple[TaskSpec, PreparedQuery]] = {}
        self._closed = False
        # pipelines with isolation "process": each in a driver process of its own (spark_process)
        self._drivers = DriverProcesses(self.spark_master, self.spark_conf, stop_budget_s)

    # ---- session --------------------------------------------------------------------------------------
    def session(self) -> Any:
        """The worker's SparkSession: started by ``warm_up`` before the broker joins, or by the first task."""
        if self._holder is None:
            raise SparkSetupError("this runner is closed")
        return self._holder.get()

    def session_info(self) -> SessionInfo:
        """The session as the registration reports it: a warm broker is ``starting`` until ``warm_up`` ends."""
        holder = self._holder
        if self._warm_error is not None:
            since = holder.started_at if holder is not None and holder.started_at else self._created_at
            return SessionInfo(SessionState.FAILED, since, error=self._warm_error[:MAX_SESSION_ERROR_CHARS])
        if holder is not None and holder.started and holder.started_at is not None:
            return SessionInfo(SessionState.READY, holder.started_at, startup_s=self._warm_s or holder.startup_s)
        if not self.warm_session:
            return SessionInfo(SessionState.LAZY, self._created_at)
        since = holder.started_at if holder is not None and holder.started_at else self._created_at
        return SessionInfo(SessionState.STARTING, since)

    def warm_up(self) -> None:
        """Start the SparkSession now (the JVM, the context): the broker joins its group only after this, so a
        task placed on it starts its query at once instead of waiting for a JVM."""
        if not self.warm_session:
            return
        t0 = time.monotonic()
        try:
            warm_jvm(self.session())
            self._warm_s = round(time.monotonic() - t0, 3)
        except SparkSetupError as exc:
            self._warm_error = str(exc)
            raise
        except Exception as exc:  # the JVM could not start (py4j, Spark's own errors): say so, one line
            self._warm_error = f"the SparkSession could not start on {self.spark_master}: {exc}".splitlines()[0]
            raise SparkSetupError(self._warm_error) from exc

    def _task_lock(self, task_id: str) -> threading.Lock:
        with self._lock:
            return self._task_locks.setdefault(task_id, threading.Lock())

    # ---- TaskRunner -----------------------------------------------------------------------------------
    def prepare(self, task_id: str, spec: TaskSpec) -> bool:
        """A streaming pipeline run in this driver, on a session already started (a prepare never starts a
        JVM for a task that may not come): its session, frame and writer now, its query at ``start``."""
        pipeline = spec.pipeline
        if not isinstance(pipeline, SparkPipeline) or pipeline.mode == "batch" or pipeline.isolation == "process":
            return False
        holder = self._holder
        if holder is None or not holder.started:
            return False
        with self._task_lock(task_id):
            with self._lock:
                if self._closed or task_id in self._runs:
                    return False
            checkpoint = checkpoint_location(self.checkpoint_root, task_id)
            prepared = StreamingRun.prepare(holder.get(), task_id, pipeline, checkpoint)
            with self._lock:
                if self._closed:
                    return False
                self._prepared[task_id] = (spec, prepared)
        return True

    def discard(self, task_id: str) -> None:
        """Drop the references only (the JVM frees the session and plan with them): no call into Spark."""
        with self._lock:
            self._prepared.pop(task_id, None)

    def prepared(self) -> set[str]:
        """Tasks prepared and not started (nor discarded)."""
        with self._lock:
            return set(self._prepared)

    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        with self._task_lock(task_id):
            with self._lock:
                if self._closed:
                    raise SparkSetupError("this runner is closed")
                current = self._runs.get(task_id)
            if current is not None:
                old_spec, old_run = current
                if old_spec == spec and old_run.active():
                    return  # already running this very spec
                old_run.stop(60.0)
                with self._lock:
                    self._runs.pop(task_id, None)
            with self._lock:
                kept = self._prepared.pop(task_id, None)
            run = self._start_run(task_id, spec, generation, kept[1] if kept is not None and kept[0] == spec else None)
            with self._lock:
                self._runs[task_id] = (spec, run)

    def _start_run(self, task_id: str, spec: TaskSpec, generation: int, prepared: PreparedQuery | None = None) -> _Run:
        pipeline = spec.pipeline
        if isinstance(pipeline, SparkPipeline):
            checkpoint = checkpoint_location(self.checkpoint_root, task_id)
            if pipeline.isolation == "process":
                return self._drivers.start(task_id, pipeline, checkpoint)
            spark = self.session()
            if pipeline.mode == "batch":
                return BatchRun(task_id, pipeline).start(spark)
            return StreamingRun(task_id, pipeline, checkpoint).start(spark, prepared)
        if isinstance(pipeline, DeclarativePipeline):
            from broker_sim.runners.declarative import DeclarativeRun

            return DeclarativeRun(task_id, pipeline, master=self.spark_master, spark_conf=self.user_conf).start()
        if isinstance(pipeline, NoopPipeline):
            return _NoopRun(task_id, spec, generation)
        raise PipelineStartError(f"task {task_id}: the spark runner cannot run a {type(pipeline).__name__}")

    def stop(self, task_id: str, timeout: float = 60.0) -> None:
        with self._task_lock(task_id):
            with self._lock:
                current = self._runs.get(task_id)
            if current is None:
                return
            current[1].stop(timeout)  # raises if it could not confirm the stop: the task stays ours
            with self._lock:
                self._runs.pop(task_id, None)

    def status(self, task_id: str) -> RunStatus:
        with self._lock:
            current = self._runs.get(task_id)
        if current is None:
            return RunStatus(RunState.STOPPED)
        try:
            return current[1].status()
        except Exception as exc:  # the driver JVM went away, say: report it, never crash the caller's loop
            return RunStatus(RunState.FAILED, error=f"cannot read the task's status from Spark: {exc!r}"[:2000])

    def batch_phases(self, task_id: str) -> dict[str, int]:
        """Where the last batch of a streaming task run in this driver spent its time (Spark's ``durationMs``):
        for profiling a broker's pipelines; empty for any other task, or before the first batch."""
        with self._lock:
            current = self._runs.get(task_id)
        run = current[1] if current is not None else None
        return run.phases() if isinstance(run, StreamingRun) else {}

    def running(self) -> set[str]:
        with self._lock:
            return set(self._runs)

    def processes(self) -> tuple[set[int], set[int]]:
        """The driver JVM this runner's session launched (it runs every streaming query and batch job) and the
        process groups of Declarative Pipelines runs."""
        pids: set[int] = set()
        pgids: set[int] = set()
        holder = self._holder
        if holder is not None:
            pid = holder.jvm_pid()
            if pid is not None:
                pids.add(pid)
        with self._lock:
            runs = [run for _, run in self._runs.values()]
        for run in runs:
            pgids |= set(getattr(run, "process_groups", lambda: set())())
        return pids, pgids | self._drivers.process_groups()  # isolated drivers, also while they start

    def attach_lease(self, path: Path) -> None:
        """Each isolated driver keeps the broker's lease itself: it ends its run by the deadline."""
        self._drivers.lease_file = path

    def fault(self, reason: str) -> set[str]:
        """The isolated drivers are halted (each reported FAILED with the reason); the shared driver's queries
        go on under the new guard."""
        return self._drivers.fault(reason)

    def engine_lost(self) -> str | None:
        """The shared driver JVM exited under its session (isolated drivers fail alone, see ``spark_process``)."""
        holder = self._holder
        return None if holder is None else holder.death()

    def kill(self) -> None:
        """The broker halts: what was prepared goes with the driver JVM the lease guard kills."""
        with self._lock:
            self._prepared.clear()
        super().kill()

    def close(self) -> None:
        """Stop every task (in parallel, each in a named thread), then the SparkSession and its JVM."""
        with self._lock:
            self._closed = True
            ids = list(self._runs)
            self._prepared.clear()
        self._drivers.close()
        errors: list[BaseException] = []

        def _stop(t: str) -> None:
            try:
                self.stop(t)
            except BaseException as exc:  # collected; close stops the rest anyway
                errors.append(exc)

        threads = [threading.Thread(target=_stop, args=(t,), name=f"spark-close-{t}", daemon=True) for t in ids]
        for th in threads:
            th.start()
        for th in threads:
            th.join(90.0)
        holder, self._holder = self._holder, None
        if holder is not None:
            release_session(holder)
        if errors:
            raise errors[0]


__all__ = ["SparkRunner", "checkpoint_location", "PipelineStartError", "SparkSetupError"]
