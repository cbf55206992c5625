"""The JSON form of a streaming query's progress: Spark's own JSON read back, bounded, garbage refused."""

from __future__ import annotations

import json

from broker_sim.runners.spark_jobs import Progress
from broker_sim.runners.spark_listener import MAX_PROGRESS_CHARS, JsonEvents, parse_progress

QID, RID = "7c2fb1a4-1f4e-4c36-9d39-0c5e3a0b8f11", "0f6a3f0e-2b9d-4a53-8c1e-6d2a0e7f4b22"
SPARK_PROGRESS = {  # the shape of StreamingQueryProgress.json for a files -> parquet query (Spark 4)
    "id": QID,
    "runId": RID,
    "name": "p000",
    "timestamp": "2026-11-28T13:00:00.000Z",
    "batchId": 7,
    "batchDuration": 412,
    "numInputRows": 50,
    "inputRowsPerSecond": 10.0,
    "processedRowsPerSecond": 121.4,
    "durationMs": {"addBatch": 250, "getBatch": 3, "latestOffset": 20, "queryPlanning": 60, "triggerExecution": 412},
    "stateOperators": [],
    "sources": [
        {
            "description": "FileStreamSource[file:/in]",
            "startOffset": {"logOffset": 6},
            "endOffset": {"logOffset": 7},
            "latestOffset": None,
            "numInputRows": 50,
            "inputRowsPerSecond": 10.0,
            "processedRowsPerSecond": 121.4,
        }
    ],
    "sink": {"description": "FileSink[/out]", "numOutputRows": -1},
}


def test_sparks_json_folds_like_the_event_it_stands_for() -> None:
    p = parse_progress(json.dumps(SPARK_PROGRESS))
    assert p is not None and str(p.id) == QID and p.batchId == 7
    folded = Progress().add(p, trigger_s=5.0, now=0.0)
    assert (folded.batches, folded.rows, folded.batch_ms, folded.last_batch_id) == (1, 50, 412, 7)
    assert dict(folded.phases_ms)["addBatch"] == 250


def test_what_is_not_a_progress_is_dropped_not_raised() -> None:
    assert parse_progress("{not json") is None
    assert parse_progress(json.dumps({"id": QID})) is None  # missing fields
    assert parse_progress(json.dumps([1, 2])) is None
    assert parse_progress(" " * (MAX_PROGRESS_CHARS + 1)) is None


def test_an_event_that_cannot_be_read_is_no_progress_and_no_error() -> None:
    """The gateway may close under a callback as the driver stops: the callback returns, it never raises."""
    got: list[object] = []
    ended: list[str] = []

    class Gone:  # what a Java event proxy does once the gateway is closed
        def progress(self) -> object:
            raise ConnectionError("gateway closed")

        def runId(self) -> object:  # noqa: N802
            raise ConnectionError("gateway closed")

    events = JsonEvents(got.append, ended.append)
    events.onQueryProgress(Gone())
    events.onQueryTerminated(Gone())
    assert got == [] and ended == [""]  # an unreadable end still says "ask the JVM"
