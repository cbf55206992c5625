"""Spark Declarative Pipelines projects as tasks, run by Spark's own engine (tests/data/sdp_project).

The project has two flows: ``raw_events``, a streaming table over JSON files, and ``key_counts``, a
materialized view reading it. A run killed mid-way leaves no process behind; the next run completes and the
tables hold every record exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from broker_sim.datagen import DatagenConfig, generate
from broker_sim.runners.base import RunState
from broker_sim.runners.declarative import DeclarativeError, validate_declarative
from broker_sim.runners.spark import SparkRunner
from controller.taskspec import DeclarativePipeline, TaskSpec
from tests.spark_support import TEST_CONF, copy_project, require_spark, spark, spark_runner, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _writing(metrics: dict[str, Any]) -> bool:
    return any(state in ("RUNNING", "COMPLETED") for state in metrics.get("flows", {}).values())


def test_declarative_task_killed_mid_run_then_next_run_completes(spark_runner: SparkRunner, spark: Any,
                                                                tmp_path: Path) -> None:
    project = copy_project("sdp_project", tmp_path / "project")
    generate(DatagenConfig(out_dir=str(project / "input"), records=2000, batch=250))
    tid = "sdp-counts"
    spec = TaskSpec(id=tid, pipeline=DeclarativePipeline(kind="declarative", project=str(project)))

    spark_runner.start(tid, spec, 1)  # returns once the task's Spark Connect server listens
    try:
        running = wait_for(lambda: _writing(s := spark_runner.status(tid).metrics) and s, 180,
                           "the first run to start writing")
        server_pid = running["server_pid"]
        spark_runner.stop(tid, timeout=60)  # kills the run in progress and the server, and waits for both
        assert not _alive(server_pid), "the Spark Connect server outlived stop()"
        assert spark_runner.status(tid).state == RunState.STOPPED

        spark_runner.start(tid, spec, 2)  # the next owner: a fresh server, same project, same tables
        done = wait_for(lambda: (s := spark_runner.status(tid)).state != RunState.RUNNING and s, 240,
                        "the second run to finish")
        assert done.state == RunState.COMPLETED, f"{done.error}\n{done.trace}"
        assert done.metrics["last_run_ok"] is True
        assert done.metrics["flows_completed"] == 2 and done.metrics["flows_failed"] == 0, done.metrics
        assert set(done.metrics["flows"]) == {"spark_catalog.default.raw_events", "spark_catalog.default.key_counts"}
    finally:
        spark_runner.stop(tid, timeout=60)

    warehouse = project / "spark-warehouse"
    ids = [r.id for r in spark.read.parquet(str(warehouse / "raw_events")).select("id").collect()]
    assert sorted(ids) == list(range(2000)), "raw_events must hold every record exactly once"
    counts = {r.key: r.n for r in spark.read.parquet(str(warehouse / "key_counts")).collect()}
    assert counts == {f"k{i}": 200 for i in range(10)}


def test_validate_declarative_uses_sparks_dry_run(tmp_path: Path) -> None:
    require_spark()
    with pytest.raises(DeclarativeError, match="no spark-pipeline.yml"):
        validate_declarative(tmp_path)  # caught before any JVM starts
    (tmp_path / "spark-pipeline.yml").write_text("name: x\nstorage: file:///tmp/x\nbogus: 1\n")
    with pytest.raises(DeclarativeError, match="PIPELINE_SPEC_UNEXPECTED_FIELD"):
        validate_declarative(tmp_path)  # Spark's own spec loader
    broken = copy_project("sdp_broken", tmp_path / "broken")
    with pytest.raises(DeclarativeError, match=r"dry-run failed.*TABLE_OR_VIEW_NOT_FOUND.*raw_events_missing"):
        validate_declarative(broken, spark_conf=TEST_CONF)
