"""B6 (prepare) — a Spark task's start with and without the planned roll's warm-up (``SparkRunner.prepare``):
one streaming pipeline (JSON files -> SQL -> Parquet, a one-second trigger) started through the spark runner
from its existing checkpoint, as a moved task starts on the broker that receives it. "cold": ``start`` alone;
"prepared": ``prepare`` (timed apart: it runs before the task arrives), then ``start``. The two alternate on
one warm session; each start is timed until ``start`` returns (the query started: what the worker waits for
before it records the run). The share of the cold start a prepare takes off is what the no-op runner's
``prepare_share`` defaults to (docs/benchmarks.md § "The planned roll").

``python -m benchmarks.b6_prepare [--reps N]``: prints the table, writes ``benchmarks/results/b6_prepare.json``."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, Bench, machine_info, median, quiet_logging, table
from broker_sim.sim.datagen import SCHEMA_DDL, DatagenConfig, generate

NAME = "b6_prepare"
TITLE = "B6 Spark task start, cold vs prepared"


def _spec(task_id: str, src: str, out: str) -> Any:
    from controller.protocol.tasks.spec import FilesSink, FilesSource, SparkPipeline, TaskSpec, Transform, Trigger

    pipeline = SparkPipeline(
        source=FilesSource(type="files", format="json", path=src, schema=SCHEMA_DDL, max_files_per_trigger=10),
        transform=Transform(sql="SELECT id, key, value * 2 AS doubled, ts FROM input WHERE value % 3 <> 0"),
        sink=FilesSink(type="files", format="parquet", path=out),
        trigger=Trigger(processing_time="1 second"),
    )
    return TaskSpec(id=task_id, pipeline=pipeline)


def run(bench: Bench, reps: int = 7) -> dict[str, Any]:
    from broker_sim.runners import make_runner

    work = Path(tempfile.mkdtemp(prefix="zkc-b6p-"))
    runner: Any = None
    got: dict[str, list[float]] = {"cold": [], "prepared": [], "prepare": []}
    try:
        src = str(work / "in")
        generate(DatagenConfig(out_dir=src, records=20_000, batch=1000))
        runner = make_runner(
            "spark", checkpoint_root=str(work / "checkpoints"), spark_conf={"spark.sql.shuffle.partitions": "2"}
        )
        t0 = time.monotonic()
        runner.warm_up()
        bench.log(f"session and warm-up pipeline in {time.monotonic() - t0:.1f}s")
        specs = {how: _spec(f"b6p-{how}", src, str(work / "out" / how)) for how in ("cold", "prepared")}
        for spec in specs.values():  # a first run writes each checkpoint: every timed start resumes one
            runner.start(spec.id, spec, 1)
            time.sleep(2.0)
            runner.stop(spec.id)
        for r in range(reps + 1):  # round 0 warms both paths and is not counted
            order = ["cold", "prepared"] if r % 2 else ["prepared", "cold"]
            for how in order:
                spec = specs[how]
                prep = None
                if how == "prepared":
                    t = time.monotonic()
                    assert runner.prepare(spec.id, spec), "the spark runner prepared nothing"
                    prep = time.monotonic() - t
                t = time.monotonic()
                runner.start(spec.id, spec, 1)
                took = time.monotonic() - t
                runner.stop(spec.id)
                if r > 0:
                    got[how].append(round(took, 3))
                    if prep is not None:
                        got["prepare"].append(round(prep, 3))
                bench.log(
                    f"{'warm-up' if r == 0 else f'round {r}/{reps}'} {how:<9} start {took:.3f}s"
                    + (f" (prepare {prep:.3f}s before)" if prep is not None else "")
                )
    finally:
        if runner is not None:
            runner.close()
        shutil.rmtree(work, ignore_errors=True)
    cold, warm, prep = median(got["cold"]), median(got["prepared"]), median(got["prepare"])
    share = round(1 - warm / cold, 2) if cold and warm is not None else None
    headers = ["start", "runs", "median s", "min s", "max s"]
    rows = [
        [how, len(xs), median(xs), min(xs), max(xs)]
        for how, xs in (("cold (start alone)", got["cold"]), ("prepared (start after prepare)", got["prepared"]))
    ]
    rows.append(
        ["prepare, before the task arrives", len(got["prepare"]), prep, min(got["prepare"]), max(got["prepare"])]
    )
    print(table(headers, rows))
    print(f"a prepare takes {share:.0%} off the start" if share is not None else "no figures")
    doc = {
        "setup": {"reps": reps, "trigger": "1 second", "rows": 20_000},
        "runs": got,
        "median_s": {"cold": cold, "prepared": warm, "prepare": prep},
        "share_prepaid": share,
        "table": {"headers": headers, "rows": rows},
    }
    bench.write(NAME, doc)
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks.b6_prepare", description=__doc__)
    p.add_argument("--reps", type=int, default=7, help="timed rounds of each (after one untimed)")
    args = p.parse_args()
    quiet_logging()
    run(Bench(quick=False, machine=machine_info(), out_dir=RESULTS_DIR), reps=args.reps)
