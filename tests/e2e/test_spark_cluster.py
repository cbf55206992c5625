"""A streaming task moving between workers, one of them on a real Spark standalone cluster: exactly-once.

Worker A is this process's SparkRunner (local master). Worker B is a SparkRunner in a child process with
``spark_master="spark://127.0.0.1:PORT"``: a master and a worker started from the pyspark install, stopped
by pid afterwards. Both use the same checkpoint root, as workers sharing storage would. While the generator
writes, the task stops and restarts on A, moves to B, and comes back to A; at the end the sink holds every
expected id exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from broker_sim.runners.base import RunState
from broker_sim.runners.spark import SparkRunner
from broker_sim.sim.datagen import Datagen, DatagenConfig
from controller.protocol.tasks.spec import parse_spec
from tests.spark_support import files_task, run_task_in_child, sink_ids, standalone_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # JVM starts: slow on a loaded machine

CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.cores.max": "1",
    "spark.driver.memory": "512m",
}


def _rows(runner: SparkRunner, task_id: str) -> int:
    return int(runner.status(task_id).metrics.get("rows", 0))


def test_task_moves_between_workers_and_onto_a_cluster_exactly_once(
    spark_runner: SparkRunner, spark: Any, tmp_path: Path
) -> None:
    src, out, tid = tmp_path / "in", tmp_path / "out", "move-me"
    # 50 files over ~15 s. At most 3 files (90 rows) per 1-second trigger, the query consumes more slowly than
    # the generator writes, so every phase below finds input waiting, however slow the machine.
    gen = Datagen(DatagenConfig(out_dir=str(src), records=1500, rate=100, batch=30))
    expected = [i for i in gen.config.expected_ids() if i % 3 != 0]
    spec_doc = files_task(
        tid,
        src,
        out,
        "SELECT id, key, value FROM input WHERE id % 3 <> 0",
        max_files=3,
        trigger={"processing_time": "1 second"},
    )
    spec = parse_spec(spec_doc)
    timings: dict[str, float] = {}
    with standalone_cluster(tmp_path / "cluster") as cluster:
        gen.start()
        try:
            t0 = time.monotonic()
            spark_runner.start(tid, spec, 1)  # worker A
            timings["start"] = time.monotonic() - t0
            assert spark_runner.status(tid).state == RunState.RUNNING
            wait_for(lambda: _rows(spark_runner, tid) >= 90, 90, "rows on the first run")
            t0 = time.monotonic()
            spark_runner.stop(tid)
            timings["stop"] = time.monotonic() - t0
            assert spark_runner.status(tid).state == RunState.STOPPED
            assert tid not in {q.name for q in spark.streams.active}

            spark_runner.start(tid, spec, 2)  # A again: resumes from the checkpoint
            wait_for(lambda: _rows(spark_runner, tid) >= 60, 60, "rows after the restart on A")
            spark_runner.stop(tid)

            child = run_task_in_child(
                spec_doc,
                checkpoint_root=spark_runner.checkpoint_root,
                workdir=tmp_path,
                master=cluster.url,
                conf=CLUSTER_CONF,
                until_rows=60,
                max_s=150,
            )  # worker B
            apps = cluster.state().get("completedapps", []) + cluster.state().get("activeapps", [])

            spark_runner.start(tid, spec, 3)  # back on A for the rest
            gen.join(90)
            wait_for(lambda: len(sink_ids(spark, out)) >= len(expected), 120, "the sink to catch up")
            spark_runner.stop(tid)
        finally:
            gen.stop()
            spark_runner.stop(tid)
    assert child.result["state"] == "RUNNING" and child.result["spark_master"] == cluster.url, child.result
    assert child.result["metrics"]["rows"] >= 60, child.result
    assert child.result["executors"] >= 1, "worker B's batches ran on the cluster's executor"
    assert any(app.get("name") == "zkcontroller-worker" for app in apps), apps
    ids = sink_ids(spark, out)
    assert len(ids) == len(set(ids)), "a record was written twice"
    assert sorted(ids) == expected, f"lost {len(set(expected) - set(ids))} records"
    print(
        f"A: start {timings['start']:.2f}s stop {timings['stop']:.2f}s; B (child, cluster): {child.result} "
        f"in {child.elapsed_s}s"
    )
