"""Spark checkpoints read and rewound without Spark (``controller.protocol.tasks.checkpoints``): the parsers refuse
garbage with a clear error, and each reset plan removes and writes exactly what keeps the checkpoint and the
file sink's log at the same position. The bytes below are what Spark 4 writes (copied from a real run)."""

from __future__ import annotations

import json

import pytest

from controller.protocol.tasks import checkpoints as ck
from controller.protocol.tasks.checkpoints import CheckpointError, CheckpointLogs, LogName
from controller.protocol.tasks.storage import ResetTarget, StorageError

OFFSETS_2 = (
    b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795686768852,"conf":{"spark.sql.shuffle.partitions":"1"}}\n'
    b'{"logOffset":2}'
)
SOURCE_0 = b'v1\n{"path":"file:///tmp/in/f0.json","timestamp":1795686764932,"batchId":0}'
SINK_0 = (
    b'v1\n{"path":"file:///tmp/out/part-0.parquet","size":530,"isDir":false,"modificationTime":1795686768079,'
    b'"blockReplication":1,"blockSize":33554432,"action":"add"}'
)


def names(*batches: int | str) -> tuple[LogName, ...]:
    return tuple(ck.log_names([str(b) for b in batches], "test"))


def logs(offsets=(0, 1, 2), commits=(0, 1, 2), sources=(0, 1, 2), sink=(0, 1, 2), stateful=False) -> CheckpointLogs:
    return CheckpointLogs(
        names(*offsets), names(*commits), {0: names(*sources)}, names(*sink) if sink is not None else None, stateful
    )


# ---- parsing -------------------------------------------------------------------------------------


def test_parses_what_spark_writes():
    entry = ck.parse_offsets(2, OFFSETS_2, "offsets/2")
    assert (entry.batch, entry.timestamp_ms, entry.sources) == (2, 1795686768852, ({"logOffset": 2},))
    assert ck.parse_source_log(SOURCE_0, "sources/0/0") == [ck.SourceFile("file:///tmp/in/f0.json", 1795686764932, 0)]
    (sink,) = ck.parse_sink_log(SINK_0, "_spark_metadata/0")
    assert (sink.path, sink.size, sink.action) == ("file:///tmp/out/part-0.parquet", 530, "add")
    ck.parse_commit(b'v1\n{"nextBatchWatermarkMs":0}', "commits/2")
    assert ck.parse_offsets(0, b'v1\n{"batchTimestampMs":5}\n-', "o").sources == (None,)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty (a truncated write?)"),
        (b"v2\n{}", "log version 'v2', only 'v1' is read"),
        (b"\xff\xfe garbage", "not UTF-8"),
        (b"v1\n", "0 line(s) after the version"),
        (b'v1\n{"batchTimestampMs":1}', "1 line(s) after the version, expected metadata and sources"),
        (b'v1\n{"batchTimestampMs":1', "expected metadata and sources"),  # truncated mid-line
        (b'v1\n{"batchTimestampMs":1\n-', "not JSON"),
        (b'v1\n{"batchTimestampMs":"yesterday"}\n-', "'batchTimestampMs' missing or not int"),
        (b"v1\n[1, 2]\n-", "expected a JSON object, got list"),
        (b"v1\n" + b"[" * 100_000 + b"\n-", "not JSON"),  # nesting past the parser's recursion
    ],
)
def test_garbage_offsets_are_refused_naming_the_file(data, message):
    with pytest.raises(CheckpointError, match="^ck/offsets/3: ") as exc:
        ck.parse_offsets(3, data, "ck/offsets/3")
    assert message in str(exc.value)


def test_garbage_logs_are_refused():
    with pytest.raises(CheckpointError, match="'batchId' missing or not int"):
        ck.parse_source_log(b'v1\n{"path":"f","timestamp":1}', "s")
    with pytest.raises(CheckpointError, match="'size' missing or not int"):
        ck.parse_sink_log(b'v1\n{"path":"f","size":true,"action":"add"}', "s")  # a bool is not a size
    with pytest.raises(CheckpointError, match="expected 1"):
        ck.parse_commit(b"v1\n{}\n{}", "c")
    with pytest.raises(CheckpointError, match="over the"):
        ck.parse_sink_log(b"v1\n" + b" " * ck.MAX_LOG_BYTES, "s")


def test_log_names_keep_batches_and_compactions_only():
    got = ck.log_names(
        ["10", ".10.crc", "9.compact", "2", "x", "01", "-1", "3.compact.tmp", "99999999999999999999"], "d"
    )
    assert got == [LogName(2), LogName(9, True), LogName(10)]
    assert [n.name for n in got] == ["2", "9.compact", "10"]


# ---- plans ---------------------------------------------------------------------------------------


def test_to_earliest_removes_the_checkpoint_and_the_sinks_log():
    plan = ck.plan_to_earliest(logs())
    assert (plan.position, plan.remove_dirs) == (-1, ("", "sink:_spark_metadata"))
    assert plan.sink_batches_removed == (0, 1, 2)
    assert ck.plan_to_earliest(logs(sink=None)).remove_dirs == ("",)  # a console sink has no log


def test_to_batch_forgets_later_batches_in_checkpoint_and_sink():
    # batch 3 planned and its sink commit written, but not its commit: the crash window Spark replays
    plan = ck.plan_to_batch(logs(offsets=(0, 1, 2, 3), sources=(0, 1, 2, 3), sink=(0, 1, 2, 3)), 1)
    assert plan.position == 1
    assert set(plan.remove_logs) == {
        "offsets/2",
        "offsets/3",
        "commits/2",
        "sources/0/2",
        "sources/0/3",
        "sink:_spark_metadata/2",
        "sink:_spark_metadata/3",
    }
    assert plan.sink_batches_removed == (2, 3)
    assert ck.plan_to_batch(logs(), 2).remove_logs == ()  # the last committed batch: nothing after it


@pytest.mark.parametrize(
    ("state", "batch", "message"),
    [
        (logs(), 3, "batch 3 is not a committed batch still in the checkpoint (kept: 0 to 2)"),
        (logs(offsets=(5, 6), commits=(5, 6)), 4, "(kept: 5 to 6)"),
        (logs(offsets=(), commits=()), 0, "no batch has been committed yet"),
        (logs(stateful=True), 1, "the query keeps state"),
        (
            logs(offsets=range(12), commits=range(12), sources=("9.compact", 10, 11), sink=range(12)),
            5,
            "lies before the compaction of sources/0 at batch 9",
        ),
        (logs(sink=(0, "1.compact", 2)), 0, "compaction of the sink's _spark_metadata at batch 1"),
    ],
)
def test_to_batch_refusals_say_what_is_possible(state, batch, message):
    with pytest.raises(CheckpointError) as exc:
        ck.plan_to_batch(state, batch)
    assert message in str(exc.value)


def test_to_batch_at_a_compaction_is_allowed():
    state = logs(offsets=range(12), commits=range(12), sources=("9.compact", 10, 11), sink=("9.compact", 10, 11))
    plan = ck.plan_to_batch(state, 9)
    assert set(plan.remove_logs) == {
        "offsets/10",
        "offsets/11",
        "commits/10",
        "commits/11",
        "sources/0/10",
        "sources/0/11",
        "sink:_spark_metadata/10",
        "sink:_spark_metadata/11",
    }


def _latest(last: int, pending, taken=(), sink=()):
    entry = ck.parse_offsets(last, OFFSETS_2.replace(b'"logOffset":2', f'"logOffset":{last}'.encode()), "o")
    return ck.LatestInputs(entry, {0: pending}, {0: list(taken)}, list(sink))


def test_to_latest_commits_one_empty_batch_taking_the_waiting_files():
    plan = ck.plan_to_latest(logs(offsets=(0, 1, 2, 3)), _latest(2, [("file:///in/f9", 7)]), now_ms=1000)
    assert plan.position == 3 and plan.remove_logs == ("offsets/3",)  # the begun batch 3 is planned anew
    written = dict(plan.write)
    assert list(written)[-1] == "commits/3"  # the commit last: the batch counts once everything is there
    assert ck.parse_source_log(written["sources/0/3"], "s") == [ck.SourceFile("file:///in/f9", 7, 3)]
    assert ck.parse_sink_log(written["sink:_spark_metadata/3"], "s") == []
    offsets = ck.parse_offsets(3, written["offsets/3"], "o")
    assert offsets.sources == ({"logOffset": 3},) and offsets.timestamp_ms == 1000
    assert offsets.metadata["conf"] == {"spark.sql.shuffle.partitions": "1"}  # the query's settings kept


def test_to_latest_on_a_compaction_batch_writes_the_compacted_logs():
    taken = [ck.SourceFile(f"file:///in/f{i}", i, i) for i in range(9)]
    sink = ck.parse_sink_log(SINK_0, "s")
    state = logs(offsets=range(9), commits=range(9), sources=range(9), sink=range(9))
    plan = ck.plan_to_latest(state, _latest(8, [("file:///in/new", 99)], taken, sink), now_ms=1)
    written = dict(plan.write)
    compacted = ck.parse_source_log(written["sources/0/9.compact"], "s")
    assert compacted == taken + [ck.SourceFile("file:///in/new", 99, 9)]
    assert [e.raw for e in ck.parse_sink_log(written["sink:_spark_metadata/9.compact"], "s")] == [
        json.loads(SINK_0.split(b"\n")[1])
    ]


def test_to_latest_refusals():
    with pytest.raises(CheckpointError, match="start the task once"):
        ck.plan_to_latest(logs(offsets=(0,), commits=()), _latest(0, []), now_ms=1)
    with pytest.raises(CheckpointError, match="keeps state"):
        ck.plan_to_latest(logs(stateful=True), _latest(2, []), now_ms=1)


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        ((True, False, None), True),
        ((False, True, None), True),
        ((False, False, 0), True),
        ((False, False, None), False),
        ((True, True, None), False),
        ((True, False, 3), False),
        ((False, False, -1), False),
        ((False, False, True), False),  # JSON true is not a batch
        ((False, False, "3"), False),
        ((False, False, 10**16), False),
    ],
)
def test_reset_target_is_exactly_one_valid_choice(args, ok):
    if ok:
        ResetTarget.parse(*args)
    else:
        with pytest.raises(StorageError):
            ResetTarget.parse(*args)


def test_the_query_id_is_read_or_left_out():
    assert (
        ck.parse_metadata(b'{"id":"6f6c7cdd-f20a-4e0c-9354-73ab75187bc8"}', "m")
        == "6f6c7cdd-f20a-4e0c-9354-73ab75187bc8"
    )
    assert ck.parse_metadata(b'{"id": 7}', "m") is None and ck.parse_metadata(b"[]", "m") is None
    with pytest.raises(CheckpointError, match="^m: a line is not JSON"):
        ck.parse_metadata(b'{"id": "trunc', "m")
