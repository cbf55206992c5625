"""The cost of ``isolation: process`` (docs/pipelines.md): memory per driver and start time, beside the shared
driver, on one Spark runner, same run.

``python -m benchmarks.isolation_cost [--tasks N] [--driver-memory 1g]`` starts the shared SparkSession (warmed
up, as a broker's before it joins), then N
streaming pipelines (rate source -> parquet, one micro-batch a second) on it, then the same N pipelines with
``isolation: process``; it reports each start, the resident memory (RSS) of the shared driver JVM with N
pipelines on it, and of each isolated driver (its Python process and its JVM), after every pipeline has run
``--settle`` seconds. Results go to ``benchmarks/results/isolation_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "isolation_cost.json"


def _rss_mb(pid: int, children: bool) -> float:
    import psutil

    proc = psutil.Process(pid)
    procs = [proc, *proc.children(recursive=True)] if children else [proc]
    return round(sum(p.memory_info().rss for p in procs) / 2**20, 1)


def _spec(task_id: str, out: Path, isolation: str, driver_memory: str | None) -> Any:
    from controller.protocol.tasks.spec import parse_spec

    pipeline: dict[str, Any] = {
        "source": {"type": "rate", "rows_per_second": 10},
        "sink": {"type": "files", "format": "parquet", "path": str(out / task_id)},
        "trigger": {"processing_time": "1 second"},
        "isolation": isolation,
    }
    if driver_memory is not None:
        pipeline["driver_memory"] = driver_memory
    return parse_spec({"id": task_id, "pipeline": pipeline})


def measure(tasks: int, driver_memory: str, settle_s: float, master: str) -> dict[str, Any]:
    from broker_sim.runners.spark import SparkRunner

    work = Path(tempfile.mkdtemp(prefix="zkc-isolation-cost-"))
    conf = {"spark.driver.memory": driver_memory, "spark.sql.shuffle.partitions": "1"}
    runner = SparkRunner(spark_master=master, spark_conf=conf, checkpoint_root=str(work / "ckpt"))
    out: dict[str, Any] = {"tasks": tasks, "driver_memory": driver_memory, "master": master, "cpus": os.cpu_count()}
    try:
        t0 = time.monotonic()
        runner.warm_up()  # as a broker does before it joins: the session and a warm-up pipeline
        out["shared_session_start_s"] = round(time.monotonic() - t0, 2)
        shared_starts, isolated_starts = [], []
        for i in range(tasks):
            t0 = time.monotonic()
            runner.start(f"shared-{i}", _spec(f"shared-{i}", work / "out", "shared", None), 1)
            shared_starts.append(round(time.monotonic() - t0, 2))
        for i in range(tasks):
            t0 = time.monotonic()
            runner.start(f"isolated-{i}", _spec(f"isolated-{i}", work / "out", "process", driver_memory), 1)
            isolated_starts.append(round(time.monotonic() - t0, 2))
        time.sleep(settle_s)
        pids, groups = runner.processes()
        states = {t: runner.status(t).state.value for t in runner.running()}
        assert set(states.values()) == {"RUNNING"}, states
        out.update(
            shared_task_start_s=shared_starts,
            isolated_task_start_s=isolated_starts,
            shared_jvm_rss_mb=_rss_mb(next(iter(pids)), children=False),
            isolated_driver_rss_mb=sorted(_rss_mb(g, children=True) for g in groups),
            rows={t: runner.status(t).metrics.get("rows") for t in sorted(states)},
        )
        out["isolated_driver_rss_median_mb"] = round(statistics.median(out["isolated_driver_rss_mb"]), 1)
    finally:
        runner.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.isolation_cost")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds every pipeline runs before the RSS")
    parser.add_argument("--master", default="local[1]")
    args = parser.parse_args(argv)
    result = measure(args.tasks, args.driver_memory, args.settle, args.master)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
