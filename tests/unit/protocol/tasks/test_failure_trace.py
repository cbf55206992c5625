"""A task's last failure, pure: the stack trace cut to its bound keeps the lines that name the cause (a JVM
``Caused by:`` deep in the middle, Py4J's framing) with the head and tail; a status's ``last_failure`` is
untrusted input, decoded within its bounds or refused whole with the reason. No ZooKeeper."""

from __future__ import annotations

import json

import pytest

from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import MAX_FAILURE_TRACE_CHARS, LastFailure, TaskStatus
from controller.protocol.tasks.failure_trace import bound_trace


def spark_trace(frames: int) -> str:
    """The shape of a streaming query's failure: Python, Py4J, the query's exception, frames, the cause."""
    top = [
        "Traceback (most recent call last):",
        '  File "spark_jobs.py", line 290, in status',
        "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] Query terminated",
        "org.apache.spark.sql.streaming.StreamingQueryException: Query terminated with exception",
    ]
    middle = [f"\tat org.apache.spark.sql.execution.Frame{i}.run(Frame{i}.scala:{i})" for i in range(frames)]
    cause = [
        "Caused by: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] bad record 7",
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.raiseError(QueryExecutionErrors.scala:1)",
    ]
    more = [f"\tat org.apache.spark.rdd.Deep{i}.compute(Deep{i}.scala:{i})" for i in range(frames)]
    return "\n".join(top + middle + cause + more + ["\t... 42 more"])


def test_a_short_trace_is_kept_whole():
    assert bound_trace(spark_trace(3)) == spark_trace(3)


def test_a_long_trace_keeps_its_head_its_causes_and_its_tail_within_the_bound():
    text = spark_trace(2000)
    assert len(text) > 10 * MAX_FAILURE_TRACE_CHARS
    cut = bound_trace(text)
    assert len(cut) <= MAX_FAILURE_TRACE_CHARS
    assert cut.startswith("Traceback (most recent call last):")
    assert "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED]" in cut
    assert "Caused by: org.apache.spark.SparkRuntimeException: [USER_RAISED_EXCEPTION] bad record 7" in cut
    assert "QueryExecutionErrors$.raiseError" in cut  # the frame under the cause: where it was raised
    assert cut.endswith("\t... 42 more")
    assert "lines omitted)" in cut


def test_a_trace_of_one_enormous_line_is_still_bounded():
    assert len(bound_trace("x" * 10 * MAX_FAILURE_TRACE_CHARS)) <= MAX_FAILURE_TRACE_CHARS
    assert len(bound_trace("Caused by: " + "y" * 50_000 + "\n" + "z\n" * 40_000, limit=2000)) <= 2000


def status(**failure) -> bytes:
    body = {"version": 1, "broker": "b1", "state": "FAILED", "generation": 3, "updated": 1.0, "last_failure": failure}
    return json.dumps(body).encode()


GOOD = {"error": "bad record 7", "kind": "org.apache.spark.SparkRuntimeException", "at": 1700000000.5, "restarts": 2}


def test_a_last_failure_round_trips_and_an_older_status_has_none():
    failure = LastFailure(**GOOD, trace="Caused by: x")
    decoded = codecs.decode(TaskStatus, codecs.encode(TaskStatus("b1", "FAILED", 3, 1.0, last_failure=failure)))
    assert decoded.last_failure == failure
    old = b'{"version": 1, "broker": "b1", "state": "RUNNING", "generation": 3, "updated": 1.0}'
    assert codecs.decode(TaskStatus, old).last_failure is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"trace": "t" * (MAX_FAILURE_TRACE_CHARS + 1)}, "trace is over"),
        ({"error": "e" * 4001}, "error is over"),
        ({"kind": ""}, "kind must be"),
        ({"kind": "k" * 201}, "kind must be"),
        ({"restarts": -1}, "restarts -1"),
        ({"restarts": 10**7}, "restarts 10000000"),
        ({"at": -5.0}, "not a wall time"),
        ({"at": 1e400}, "not a wall time"),
        ({"kind": 7}, "kind"),
        ({"trace": ["not", "text"]}, "trace"),
    ],
)
def test_a_last_failure_out_of_bounds_is_refused_with_the_reason(change, reason):
    with pytest.raises(PayloadError, match="last_failure") as err:
        codecs.decode(TaskStatus, status(**{**GOOD, **change}), "/zkc/status/t1")
    assert reason in str(err.value) and "/zkc/status/t1" in str(err.value)
