"""``python -m broker_sim.runners.spark_driver RUN_DIR``: one pipeline in a Spark driver process of its own.

The child side of ``isolation: process`` (``spark_process`` is the broker's side). It reads ``RUN_DIR/launch.json``
(the task id, its spec, the checkpoint, the master and the driver's settings), creates its own SparkSession (so
its own JVM, with its own heap), runs the pipeline exactly as the shared runner does (``spark_jobs``) and
writes its status to ``RUN_DIR/status.json`` (atomically, when it changes, at most every ``PERIOD_S``): the
broker reads that file, never this process's memory. SIGTERM stops the query (bounded by the stop timeout in
the settings) and the session, then the process exits; a JVM that dies under it (an OutOfMemoryError ends
a local driver JVM at once, exit code 52) is reported as FAILED and the process exits 1.

Every status carries a heartbeat (``beat``, ``CLOCK_MONOTONIC``), so the broker tells a driver that stopped
answering (SIGSTOP, wedged) from one that runs. With a lease file in its launch (a broker with a lease guard),
the driver keeps its broker's lease itself (a named thread, ``driver-lease``): once the broker stops renewing
it (paused, gone) the driver ends its run, itself and its JVM, before the deadline, without the guard.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from broker_sim.runners.lease import LeaseKeeper, read_lease

PERIOD_S = 0.5
#: How often the driver reads its broker's lease: well inside the lease's lead (``lease.LEAD_S``).
LEASE_PERIOD_S = 0.05
LAUNCH_FILE = "launch.json"
STATUS_FILE = "status.json"


def write_status(run_dir: Path, body: dict[str, Any]) -> None:
    """Atomically (write, then rename): the broker never reads half a status."""
    tmp = run_dir / f".{STATUS_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(body, default=str))
    os.replace(tmp, run_dir / STATUS_FILE)


def _jvm_exit_code(wait_s: float = 5.0) -> int | None:
    """The exit code of this process's JVM once it has exited (None if it still runs after ``wait_s``)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is None:
        return None
    try:
        code: int | None = proc.wait(wait_s)
    except Exception:  # still running: a gateway failure of another kind
        code = proc.poll()
    return code


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m broker_sim.runners.spark_driver RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    from broker_sim.runners.spark_jobs import BatchRun, StreamingRun, error_kind, spark_error
    from broker_sim.runners.spark_session import SessionHolder
    from controller.protocol.tasks.spec import SparkPipeline

    launch = json.loads((run_dir / LAUNCH_FILE).read_text())
    task_id = str(launch["task_id"])
    pipeline = SparkPipeline.model_validate(launch["pipeline"])
    holder = SessionHolder(master=launch["master"], conf=dict(launch["conf"]), app_name=f"zkc-{task_id}")
    extra: dict[str, Any] = {"driver_pid": os.getpid()}
    started, done = threading.Event(), threading.Event()
    lease_file = launch.get("lease_file")
    if isinstance(lease_file, str):
        keeper = LeaseKeeper(int(launch["broker_pid"]))
        keeper.update(read_lease(Path(lease_file)))
        if keeper.lease is None:
            error = f"task {task_id}: cannot read its broker's lease {lease_file}: refusing to run unguarded"
            write_status(run_dir, {"state": "FAILED", "start_failed": True, "error": error})
            return 1
        watch = threading.Thread(
            target=_keep_lease,
            args=(run_dir, Path(lease_file), keeper, started, done),
            name="driver-lease",
            daemon=True,
        )
        watch.start()
    try:
        try:
            spark = holder.get()
            extra["driver_start_s"] = holder.startup_s
            run: StreamingRun | BatchRun
            if pipeline.mode == "batch":
                run = BatchRun(task_id, pipeline).start(spark)
            else:
                run = StreamingRun(task_id, pipeline, launch["checkpoint"]).start(spark)
        except BaseException as exc:  # reported to the broker, which refuses the start with it
            message, trace = spark_error(exc)
            write_status(
                run_dir,
                {
                    "state": "FAILED",
                    "start_failed": True,
                    "error": message,
                    "trace": trace,
                    "error_type": error_kind(exc),
                },
            )
            return 1
        started.set()
        return _supervise(run_dir, run, extra, stop, float(launch.get("stop_timeout_s", 30.0)))
    finally:
        done.set()
        try:
            holder.stop(10.0)
        except Exception:  # a JVM already gone: nothing left to stop
            pass


def _keep_lease(
    run_dir: Path, path: Path, keeper: LeaseKeeper, started: threading.Event, done: threading.Event
) -> None:
    """Read the broker's lease every ``LEASE_PERIOD_S``; at its deadline (``keeper.due``) say why, then end
    this process group (this process and its JVM: the query stops mid-batch, and its next run replays that
    batch from the checkpoint). Also while a stop is under way. Bounded: it ends with the run or at the
    deadline."""
    while not done.wait(LEASE_PERIOD_S):
        keeper.update(read_lease(path))
        if keeper.due(time.monotonic()):
            _end_at_deadline(run_dir, keeper, started.is_set())


def _end_at_deadline(run_dir: Path, keeper: LeaseKeeper, started: bool) -> None:
    error = (
        f"the driver ended its run at its broker's lease deadline: broker pid {keeper.broker_pid} did not renew "
        "its lease (paused or gone)"
    )
    try:
        write_status(run_dir, {"state": "FAILED", "start_failed": not started, "error": error})
    except OSError:
        pass  # the kill matters, not the word
    print(error, file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():  # the leader of its group (the broker spawns it so): the JVM goes with it
        os.killpg(os.getpid(), signal.SIGKILL)
    proc = _jvm_process()
    if proc is not None:
        proc.kill()
    os._exit(3)


def _jvm_process() -> Any:
    try:
        from pyspark import SparkContext

        return getattr(SparkContext._gateway, "proc", None)
    except Exception:  # no session yet
        return None


def _supervise(run_dir: Path, run: Any, extra: dict[str, Any], stop: threading.Event, stop_timeout_s: float) -> int:
    """Write the run's status every period until it ends (0: completed or stopped by SIGTERM; 1: failed).
    Bounded by the run: it ends when the pipeline does, when its JVM dies, or at the broker's SIGTERM."""
    from broker_sim.runners.base import RunState

    last: dict[str, Any] = {}
    while True:
        try:
            st = run.status()
            body = {
                "state": st.state.value,
                "error": st.error,
                "trace": st.trace,
                "error_type": st.error_type,
                "metrics": {**st.metrics, **extra},
            }
        except Exception as exc:  # the JVM went away under us (an OutOfMemoryError ends a local driver)
            body = {
                "state": RunState.FAILED.value,
                "error": f"the driver JVM is gone (exit code {_jvm_exit_code()}): {type(exc).__name__}: {exc}"[:2000],
                "metrics": {**last.get("metrics", {}), **extra},
            }
        write_status(run_dir, {**body, "beat": time.monotonic()})  # every period: the heartbeat the broker reads
        last = body
        if body["state"] != RunState.RUNNING.value:
            return 0 if body["state"] == RunState.COMPLETED.value else 1
        if stop.wait(PERIOD_S):
            run.stop(stop_timeout_s)
            write_status(run_dir, {**last, "state": RunState.STOPPED.value})
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
