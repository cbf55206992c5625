"""The spark runner on real Spark and real files: batch, runtime failures, start errors.

One SparkSession for all Spark tests (``tests.spark_support.spark_runner``). The streaming move between
workers (exactly-once) is in test_spark_cluster.py, where the other worker runs on a standalone cluster.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from broker_sim.runners.base import RunState
from broker_sim.runners.spark import PipelineStartError, SparkRunner
from broker_sim.sim.datagen import DatagenConfig, generate
from controller.protocol.tasks.spec import TaskSpec, parse_spec
from tests.spark_support import files_task, wait_for

pytestmark = pytest.mark.slow


def test_batch_completes_and_rerun_is_idempotent(spark_runner: SparkRunner, spark: Any, tmp_path: Path) -> None:
    src, out, tid = tmp_path / "in", tmp_path / "out", "batch-counts"
    generate(DatagenConfig(out_dir=str(src), records=500, batch=100))
    spec = parse_spec(
        files_task(tid, src, out, "SELECT key, count(*) AS n, min(id) AS id FROM input GROUP BY key", mode="batch")
    )
    results = []
    for generation in (1, 2):
        spark_runner.start(tid, spec, generation)  # the second start reruns the completed task
        status = wait_for(lambda: (s := spark_runner.status(tid)).state != RunState.RUNNING and s, 120, "the batch")
        assert status.state == RunState.COMPLETED, status.error
        assert status.metrics["rows_written"] == 10
        results.append(sorted((r.key, r.n) for r in spark.read.parquet(str(out)).collect()))
    spark_runner.stop(tid)
    assert results[0] == results[1] == [(f"k{i}", 50) for i in range(10)]


def test_runtime_failure_is_reported_and_does_not_disturb_others(
    spark_runner: SparkRunner, spark: Any, tmp_path: Path
) -> None:
    generate(DatagenConfig(out_dir=str(tmp_path / "bad-in"), records=100, batch=50))
    good = parse_spec(
        {
            "id": "steady",
            "pipeline": {
                "kind": "spark",
                "source": {"type": "rate", "rows_per_second": 20},
                "transform": {"sql": "SELECT value AS id, timestamp FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "good-out")},
                "trigger": {"processing_time": "1 second"},
            },
        }
    )
    bad = parse_spec(
        files_task(
            "poisoned",
            tmp_path / "bad-in",
            tmp_path / "bad-out",
            "SELECT CASE WHEN id = 42 THEN raise_error(concat('poison record ', id)) ELSE id END AS id FROM input",
        )
    )
    errors: list[BaseException] = []

    def start(spec: TaskSpec) -> None:
        try:
            spark_runner.start(spec.id, spec, 1)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,), name=f"test-start-{s.id}") for s in (good, bad)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    try:
        failed = wait_for(
            lambda: (s := spark_runner.status("poisoned")).state == RunState.FAILED and s,
            90,
            "the poisoned task to fail",
        )
        assert "USER_RAISED_EXCEPTION" in failed.error and "poison record 42" in failed.error, failed.error
        assert failed.trace and "org.apache.spark" in failed.trace
        assert failed.error_type == "org.apache.spark.SparkRuntimeException", failed.error_type  # the cause's class
        assert "Caused by: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION]" in failed.trace, (
            failed.trace
        )
        batches = spark_runner.status("steady").metrics["batches"]
        wait_for(
            lambda: spark_runner.status("steady").metrics["batches"] >= batches + 2,
            60,
            "the steady task to keep running after the other failed",
        )
        assert spark_runner.status("steady").state == RunState.RUNNING
        pools = spark.sparkContext._jsc.sc()
        assert pools.getPoolForName("steady").isDefined(), "each task runs in its own FAIR pool"
        assert spark.sparkContext.getConf().get("spark.scheduler.mode") == "FAIR"
    finally:
        spark_runner.stop("steady")
        spark_runner.stop("poisoned")
    assert spark_runner.running() == set()


def test_start_refuses_what_spark_refuses(spark_runner: SparkRunner, tmp_path: Path) -> None:
    bad_column = parse_spec(files_task("bad-column", tmp_path / "in", tmp_path / "out", "SELECT nope FROM input"))
    with pytest.raises(PipelineStartError, match=r"UNRESOLVED_COLUMN.*nope"):
        spark_runner.start("bad-column", bad_column, 1)
    assert spark_runner.status("bad-column").state == RunState.STOPPED
    static = parse_spec(
        files_task(
            "static-conf",
            tmp_path / "in",
            tmp_path / "out2",
            "SELECT * FROM input",
            spark_options={"spark.executor.memory": "2g"},
        )
    )
    with pytest.raises(PipelineStartError, match="cannot be set per task"):
        spark_runner.start("static-conf", static, 1)
    assert spark_runner.running() == set()


def test_a_streaming_stop_is_bounded_by_the_stop_budget_and_the_jvm_is_known(
    spark_runner: SparkRunner, spark: Any
) -> None:
    """``StreamingQuery.stop()`` waits forever by default: the runner bounds it by its stop budget (a stop
    that times out raises, and the worker escalates), and names the driver JVM the lease guard must kill."""
    budget_ms = int(spark_runner.stop_budget_s * 1000)
    assert spark.conf.get("spark.sql.streaming.stopTimeout") == str(budget_ms)
    pids, _groups = spark_runner.processes()
    jvm = spark.sparkContext._gateway.proc.pid
    assert pids == {jvm}
    with open(f"/proc/{jvm}/cmdline", "rb") as f:
        assert b"java" in f.read()


def test_a_prepared_streaming_task_writes_nothing_until_its_start_which_uses_it(
    spark_runner: SparkRunner, spark: Any, tmp_path: Path
) -> None:
    """A planned roll's warm-up: ``prepare`` builds the task's session, frame and writer and starts no query
    (no sink, no checkpoint, not running); the start of the same spec takes what was prepared and runs as
    a cold one would; a batch pipeline prepares nothing."""
    from broker_sim.runners.spark import checkpoint_location
    from tests.spark_support import sink_ids

    src, out, tid = tmp_path / "in", tmp_path / "out", "prepared-stream"
    generate(DatagenConfig(out_dir=str(src), records=200, batch=50))
    spec = parse_spec(files_task(tid, src, out, "SELECT id, key FROM input"))
    assert spark_runner.prepare(tid, spec)
    assert tid in spark_runner.prepared() and tid not in spark_runner.running()
    assert spark_runner.status(tid).state is RunState.STOPPED
    assert not out.exists() and not Path(checkpoint_location(spark_runner.checkpoint_root, tid)).exists()
    assert all(q.name != tid for q in spark.streams.active)
    spark_runner.start(tid, spec, 1)
    try:
        assert tid not in spark_runner.prepared()  # taken by the start

        def ids() -> list[int]:
            try:
                return sorted(sink_ids(spark, out))
            except Exception:  # (the sink's log written before its first file: no schema to read yet)
                return []

        wait_for(lambda: ids() == list(range(200)), 120, "every record in the sink")
    finally:
        spark_runner.stop(tid)
    batch = parse_spec(files_task("prepared-batch", src, tmp_path / "b-out", "SELECT id FROM input", mode="batch"))
    assert not spark_runner.prepare("prepared-batch", batch)
    assert spark_runner.prepare("gone", parse_spec(files_task("gone", src, tmp_path / "g-out", "SELECT id FROM input")))
    spark_runner.discard("gone")
    assert "gone" not in spark_runner.prepared()


def test_a_streaming_run_stopped_reads_stopped_not_completed(spark_runner: SparkRunner, tmp_path: Path) -> None:
    """A streaming query that was stopped is inactive with no error, as is one whose data ran out: its run
    says STOPPED once a stop began, never COMPLETED (a status read while the stop was under way took the
    task for completed, and a completed task is not started again)."""
    spec = parse_spec(
        {
            "id": "rate-stop",
            "pipeline": {
                "kind": "spark",
                "source": {"type": "rate", "rows_per_second": 10},
                "transform": {"sql": "SELECT value AS id, timestamp FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "out")},
                "trigger": {"processing_time": "1 second"},
            },
        }
    )
    spark_runner.start("rate-stop", spec, 1)
    try:
        run = spark_runner._runs["rate-stop"][1]  # the run itself: the runner forgets it once stopped
        wait_for(lambda: run.status().state == RunState.RUNNING, 60, "the query running")
    finally:
        spark_runner.stop("rate-stop")
    assert run.status().state == RunState.STOPPED


def test_progress_crosses_as_json_and_a_run_that_ends_reads_ended(spark_runner: SparkRunner, tmp_path: Path) -> None:
    """Each batch's progress reaches the run through the JSON listener (batches, rows, Spark's split of the
    batch), and a query that ends by itself (``available_now`` out of data) reads COMPLETED although a running
    query's activeness is asked of the JVM only every few seconds: the listener says it ended."""
    src = tmp_path / "in"
    generate(DatagenConfig(out_dir=str(src), records=300, batch=100))
    spec = parse_spec(
        files_task("json-progress", src, tmp_path / "out", "SELECT id FROM input", trigger={"available_now": True})
    )
    spark_runner.start("json-progress", spec, 1)
    try:
        status = wait_for(
            lambda: (s := spark_runner.status("json-progress")).state != RunState.RUNNING and s, 120, "the run's end"
        )
        assert status.state == RunState.COMPLETED, status.error
        assert status.metrics["rows"] == 300 and status.metrics["batches"] >= 1
        phases = spark_runner.batch_phases("json-progress")
        assert {"addBatch", "latestOffset", "triggerExecution"} <= phases.keys()
        assert all(isinstance(v, int) and v >= 0 for v in phases.values())
    finally:
        spark_runner.stop("json-progress")
    assert spark_runner.batch_phases("json-progress") == {}  # a task not running here has none
