"""What an isolated pipeline's driver process writes about itself (``status.json``) is a claim from another
process: ``spark_process.read_status`` takes a known state, bounded text and flat metrics, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_sim.runners.spark_jobs import MAX_ERROR_CHARS
from broker_sim.runners.spark_process import MAX_METRICS, MAX_SERIES, MAX_STATUS_BYTES, read_status
from controller.protocol.records.task_records import MAX_FAILURE_KIND_CHARS


def _write(tmp_path: Path, body: object) -> Path:
    path = tmp_path / "status.json"
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def test_a_running_driver_status_is_read_as_written(tmp_path):
    body = {"state": "RUNNING", "metrics": {"rows": 40, "batches": 3, "run_id": "r1", "input_rows_per_s": 9.5}}
    got = read_status(_write(tmp_path, body))
    assert got == {
        "state": "RUNNING",
        "start_failed": False,
        "error": None,
        "trace": None,
        "error_type": None,
        "metrics": body["metrics"],
        "beat": None,
    }


@pytest.mark.parametrize("beat, read", [(12.5, 12.5), (7, 7.0), ("12.5", None), (True, None), ([1], None)])
def test_the_heartbeat_is_a_number_or_nothing(tmp_path, beat, read):
    assert read_status(_write(tmp_path, {"state": "RUNNING", "beat": beat}))["beat"] == read


@pytest.mark.parametrize(
    "body",
    [
        "",
        "not json",
        "[1, 2]",
        "[" * 100_000,
        {"state": "EXPLODED"},
        {"state": 3},
        {"metrics": {}},
    ],
    ids=["empty", "not-json", "a-list", "deep", "unknown-state", "state-not-text", "no-state"],
)
def test_garbage_is_no_status(tmp_path, body):
    assert read_status(_write(tmp_path, body)) is None


def test_a_missing_or_oversized_file_is_no_status(tmp_path):
    assert read_status(tmp_path / "absent.json") is None
    huge = {"state": "RUNNING", "error": "x" * MAX_STATUS_BYTES}
    assert read_status(_write(tmp_path, huge)) is None


def test_text_is_bounded_and_only_flat_metrics_are_kept(tmp_path):
    body = {
        "state": "FAILED",
        "start_failed": "yes",  # only a real true says the start failed
        "error": "e" * (MAX_ERROR_CHARS + 100),
        "trace": 42,
        "error_type": "k" * 1000,
        "metrics": {
            "rows": 1,
            "rate_history": [1.5, 2, 3.0],
            "nested": {"a": 1},
            "texts": ["a"],
            "long": list(range(MAX_SERIES + 1)),
            "name": "n" * 1000,
            **{f"k{i}": i for i in range(100)},
        },
    }
    got = read_status(_write(tmp_path, body))
    assert got is not None
    assert got["state"] == "FAILED" and got["start_failed"] is False
    assert len(got["error"]) == MAX_ERROR_CHARS and got["trace"] is None
    assert len(got["error_type"]) == MAX_FAILURE_KIND_CHARS
    assert got["metrics"]["rate_history"] == [1.5, 2, 3.0]
    assert not {"nested", "texts", "long"} & set(got["metrics"])
    assert len(got["metrics"]["name"]) == 500 and len(got["metrics"]) <= MAX_METRICS
