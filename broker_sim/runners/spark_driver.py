"""``python -m broker_sim.runners.spark_driver RUN_DIR``: one pipeline in a Spark driver process of its own.

The child side of ``isolation: process`` (``spark_process`` is the broker's side). It reads ``RUN_DIR/launch.json``
(the task id, its spec, the checkpoint, the master and the driver's settings), creates its own SparkSession (so
its own JVM, with its own heap), runs the pipeline exactly as the shared runner does (``spark_jobs``) and
writes its status to ``RUN_DIR/status.json`` (atomically, when it changes, at most every ``PERIOD_S``): the
broker reads that file, never this process's memory. SIGTERM stops the query (bounded by the stop timeout in
the settings) and the session, then the process exits; a JVM that dies under it (an OutOfMemoryError ends
a local driver JVM at once, exit code 52) is reported as FAILED and the process exits 1.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

PERIOD_S = 0.5
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

    from broker_sim.runners.spark_jobs import BatchRun, StreamingRun, spark_error
    from broker_sim.runners.spark_session import SessionHolder
    from controller.protocol.tasks.spec import SparkPipeline

    launch = json.loads((run_dir / LAUNCH_FILE).read_text())
    task_id = str(launch["task_id"])
    pipeline = SparkPipeline.model_validate(launch["pipeline"])
    holder = SessionHolder(master=launch["master"], conf=dict(launch["conf"]), app_name=f"zkc-{task_id}")
    extra: dict[str, Any] = {"driver_pid": os.getpid()}
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
            write_status(run_dir, {"state": "FAILED", "start_failed": True, "error": message, "trace": trace})
            return 1
        return _supervise(run_dir, run, extra, stop, float(launch.get("stop_timeout_s", 30.0)))
    finally:
        try:
            holder.stop(10.0)
        except Exception:  # a JVM already gone: nothing left to stop
            pass


def _supervise(run_dir: Path, run: Any, extra: dict[str, Any], stop: threading.Event, stop_timeout_s: float) -> int:
    """Write the run's status when it changes until it ends (0: completed or stopped by SIGTERM; 1: failed).
    Bounded by the run: it ends when the pipeline does, when its JVM dies, or at the broker's SIGTERM."""
    from broker_sim.runners.base import RunState

    last: dict[str, Any] = {}
    while True:
        try:
            st = run.status()
            body = {"state": st.state.value, "error": st.error, "trace": st.trace, "metrics": {**st.metrics, **extra}}
        except Exception as exc:  # the JVM went away under us (an OutOfMemoryError ends a local driver)
            body = {
                "state": RunState.FAILED.value,
                "error": f"the driver JVM is gone (exit code {_jvm_exit_code()}): {type(exc).__name__}: {exc}"[:2000],
                "metrics": {**last.get("metrics", {}), **extra},
            }
        if body != last:
            write_status(run_dir, body)
            last = body
        if body["state"] != RunState.RUNNING.value:
            return 0 if body["state"] == RunState.COMPLETED.value else 1
        if stop.wait(PERIOD_S):
            run.stop(stop_timeout_s)
            write_status(run_dir, {**last, "state": RunState.STOPPED.value})
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
