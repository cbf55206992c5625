"""Spark Declarative Pipelines projects as tasks, run by Spark's own engine (tests/data/sdp_project).

The project has two flows: ``raw_events``, a streaming table over JSON files, and ``key_counts``, a
materialized view reading it. A run killed mid-way leaves no process behind; the next owner's runs complete
and the tables hold every record exactly once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from broker_sim.runners.base import RunState
from broker_sim.runners.declarative import DeclarativeError, validate_declarative
from broker_sim.runners.spark import SparkRunner
from broker_sim.sim.datagen import DatagenConfig, generate
from controller.protocol.tasks.spec import DeclarativePipeline, TaskSpec
from tests.spark_support import TEST_CONF, copy_project, require_spark, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # JVM starts: slow on a loaded machine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _writing(metrics: dict[str, Any]) -> bool:
    return any(state in ("RUNNING", "COMPLETED") for state in metrics.get("flows", {}).values())


def _raw_ids(spark: Any, project: Path) -> list[int]:
    table = project / "spark-warehouse" / "raw_events"
    if not (table / "_spark_metadata").exists():
        return []
    return [r.id for r in spark.read.parquet(str(table)).select("id").collect()]  # via the sink's commit log


def test_declarative_task_killed_mid_run_then_runs_complete(
    spark_runner: SparkRunner, spark: Any, tmp_path: Path
) -> None:
    """A run is killed while its flows write; the next owner's runs (every second) complete, pick up new
    input incrementally, and the tables hold every record exactly once."""
    project = copy_project("sdp_project", tmp_path / "project")
    generate(DatagenConfig(out_dir=str(project / "input"), records=2000, batch=250))
    tid = "sdp-counts"
    once = TaskSpec(id=tid, pipeline=DeclarativePipeline(kind="declarative", project=str(project)))
    every_second = TaskSpec(
        id=tid, pipeline=DeclarativePipeline(kind="declarative", project=str(project), interval_s=1.0)
    )
    spark_runner.start(tid, once, 1)  # returns once the task's Spark Connect server listens
    try:
        running = wait_for(
            lambda: _writing(s := spark_runner.status(tid).metrics) and s, 180, "the first run to start writing"
        )
        server_pid = running["server_pid"]
        spark_runner.stop(tid, timeout=60)  # kills the run in progress and the server, and waits for both
        assert not _alive(server_pid), "the Spark Connect server outlived stop()"
        assert spark_runner.status(tid).state == RunState.STOPPED

        spark_runner.start(tid, every_second, 2)  # the next owner: a fresh server, same project, same tables
        # metrics of a moment when the latest run is the one that completed (the next starts a second later)
        first = wait_for(
            lambda: (m := spark_runner.status(tid).metrics).get("last_run_ok") and m,
            240,
            "a run of the new owner to complete",
        )
        status = spark_runner.status(tid)
        assert status.state == RunState.RUNNING, f"{status.error}\n{status.trace}"
        assert first["flows_completed"] == 2 and first["flows_failed"] == 0, first
        assert set(first["flows"]) == {"spark_catalog.default.raw_events", "spark_catalog.default.key_counts"}

        generate(DatagenConfig(out_dir=str(project / "input"), records=500, batch=250, start_id=2000))
        wait_for(lambda: len(_raw_ids(spark, project)) >= 2500, 180, "a later run to ingest the new files")
        seen = spark_runner.status(tid).metrics["runs_ok"]
        last = wait_for(
            lambda: (m := spark_runner.status(tid).metrics)["runs_ok"] > seen and m["last_run_ok"] and m,
            120,
            "one more run to complete (key_counts recomputed)",
        )
        # every run of the new owner succeeded, except at most one that found the checkpoint the killed run
        # left half-written (when the kill landed inside a flow's first batch) and was rebuilt by the next
        assert last["rebuilds"] <= 1 and last["runs"] == last["runs_ok"] + last["rebuilds"], last
        assert last["server_pid"] == first["server_pid"], last
        assert spark_runner.status(tid).state == RunState.RUNNING
    finally:
        spark_runner.stop(tid, timeout=60)

    assert sorted(_raw_ids(spark, project)) == list(range(2500)), "raw_events must hold every record exactly once"
    counts = {r.key: r.n for r in spark.read.parquet(str(project / "spark-warehouse" / "key_counts")).collect()}
    assert counts == {f"k{i}": 250 for i in range(10)}


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
