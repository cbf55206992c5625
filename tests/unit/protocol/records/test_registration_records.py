"""Warm brokers and what a pipeline is doing, the pure parts: a registration's session readiness as decoded
(untrusted, bounded), which members the coordinator may place work on, the figures read from a status's
metrics (untrusted), the file source's backlog from a checkpoint's source log, and the per-task Prometheus
collector's bounds."""

from __future__ import annotations

import json
import math
import socket
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from broker_sim.runners.backlog import FileBacklog
from broker_sim.runners.spark_session import SparkSetupError, check_master_reachable, standalone_masters
from controller.admin.views import TaskPage, TaskRow
from controller.api.task_metrics import TaskMetricsCollector
from controller.protocol.group.readiness import broker_ready, placeable
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import BrokerInfo, SessionInfo, SessionState
from controller.protocol.tasks.pipeline_metrics import figures, rate_text, sparkline


def _registration(session: object) -> bytes:
    body = {"version": 1, "broker_id": "b1", "host": "h", "pid": 1, "session": session}
    return json.dumps(body).encode()


# ---- the registration's session ----------------------------------------------------------------------
def test_session_round_trips_and_old_registrations_have_none() -> None:
    info = BrokerInfo("b1", "h", 1, runner="spark", session=SessionInfo(SessionState.READY, 1e9, startup_s=9.5))
    assert codecs.decode(BrokerInfo, codecs.encode(info)) == info
    old = b'{"version": 1, "broker_id": "b1", "host": "h", "pid": 1}'
    assert codecs.decode(BrokerInfo, old).session is None


@pytest.mark.parametrize(
    ("session", "reason"),
    [
        ({"state": "warm", "since": 1.0}, "is not one of"),
        ({"state": "ready"}, "missing field 'session.since'"),
        ({"state": "ready", "since": -5}, "not a wall time"),
        ({"state": "ready", "since": 1.0, "startup_s": -1}, "startup_s"),
        ({"state": "ready", "since": 1.0, "startup_s": 1e9}, "startup_s"),
        ({"state": "failed", "since": 1.0, "error": "x" * 501}, "over 500"),
        ({"state": "ready", "since": "now"}, "expected number"),
        ("ready", "expected an object"),
    ],
)
def test_a_session_out_of_bounds_is_a_payload_error(session: object, reason: str) -> None:
    with pytest.raises(PayloadError, match=reason):
        codecs.decode(BrokerInfo, _registration(session))


def test_a_session_that_is_not_a_finite_number_is_refused() -> None:
    data = b'{"version": 1, "broker_id": "b1", "host": "h", "pid": 1, "session": {"state": "ready", "since": NaN}}'
    with pytest.raises(PayloadError, match="not a wall time"):
        codecs.decode(BrokerInfo, data)


def test_only_a_ready_or_lazy_session_or_none_may_be_given_work() -> None:
    def info(state: SessionState | None) -> BrokerInfo:
        return BrokerInfo("b", "h", 1, session=None if state is None else SessionInfo(state, 1.0))

    assert broker_ready(info(None))  # a runner without a session (noop)
    assert broker_ready(info(SessionState.READY)) and broker_ready(info(SessionState.LAZY))
    assert not broker_ready(info(SessionState.STARTING)) and not broker_ready(info(SessionState.FAILED))
    assert not broker_ready(None)  # a registration that does not decode does not say it is ready
    members = {"a": 1, "b": 2, "c": 3}
    assert placeable(members, {"b", "x"}) == {"a": 1, "c": 3}
    assert placeable(members, set()) == members


def test_status_shows_a_session_in_one_cell() -> None:
    from cli.cluster import session_text

    assert session_text(None) == "" and session_text({"state": "lazy", "since": 1.0}) == "lazy"
    assert session_text({"state": "ready", "since": 1.0, "startup_s": 12.34}) == "ready 12.3s"
    assert session_text({"state": "starting", "since": time.time() - 4.2}) == "starting 4s"
    assert session_text({"state": "failed", "since": 1.0, "error": "no java"}) == "failed"


# ---- a pipeline's figures ------------------------------------------------------------------------------
def test_figures_keep_valid_numbers_and_drop_the_rest() -> None:
    f = figures(
        {
            "rows": 1200,
            "batches": True,  # a boolean is not a count
            "input_rows_per_s": 148.25,
            "processed_rows_per_s": -3,
            "backlog_files": 2**60,
            "rate_history": [1, "2", None, math.inf, 3.5, -1, *range(30)],
        }
    )
    assert (f.rows, f.batches, f.input_rows_per_s, f.processed_rows_per_s, f.backlog_files) == (
        1200,
        None,
        148.25,
        None,
        None,
    )
    assert f.rate_history == tuple(float(v) for v in range(10, 30))  # the last 20 entries, all valid here
    assert figures(None) == figures("<script>") == figures({})  # type: ignore[arg-type]


def test_rate_text_and_its_sparkline() -> None:
    assert sparkline((0.0, 5.0, 10.0)) == "▁▅█"
    assert sparkline((0.0, 0.0)) == "▁▁" and sparkline(()) == ""
    assert rate_text(figures({"input_rows_per_s": 150.4, "rate_history": [75, 150]})) == "150/s ▅█"
    assert rate_text(figures({"input_rows_per_s": 2.25})) == "2.2/s"
    assert rate_text(figures({"rows": 3})) == ""


# ---- the file source's backlog -----------------------------------------------------------------------------
def test_backlog_counts_source_files_not_in_the_source_log(tmp_path) -> None:
    src, chk = tmp_path / "in", tmp_path / "chk"
    src.mkdir()
    for i in range(5):
        (src / f"part-{i}.json").write_text("{}\n")
    (src / ".part-9.json.crc").write_text("")  # hidden and in-progress names are not data to Spark
    (src / "_temporary").mkdir()
    backlog = FileBacklog(str(src), str(chk), interval_s=0)
    assert backlog.files() == 5  # no checkpoint yet: nothing read
    log = chk / "sources" / "0"
    log.mkdir(parents=True)
    entry = lambda i: json.dumps({"path": f"file://{src}/part-{i}.json", "timestamp": 1, "batchId": 0})  # noqa: E731
    (log / "0").write_text("v1\n" + entry(0) + "\n" + entry(1) + "\n")
    assert backlog.files() == 3
    (log / "1").write_text("v1\n" + entry(2) + "\n")
    (log / "2.compact").write_text("v1\n" + "\n".join(entry(i) for i in range(4)) + "\n")
    assert backlog.files() == 1
    assert FileBacklog(str(src), str(chk), interval_s=0).files() == 1  # a fresh reader: the compaction alone
    assert FileBacklog(str(tmp_path / "gone"), str(chk), interval_s=0).files() is None
    assert FileBacklog(str(src), str(chk), interval_s=0, max_files=3).files() is None  # past the bound: no figure
    assert FileBacklog.of("s3a://bucket/in", str(chk)) is None  # not a local directory: no backlog figure


# ---- the Spark master ----------------------------------------------------------------------------------------
def test_an_unreachable_standalone_master_is_refused_with_what_to_do() -> None:
    assert standalone_masters("local[2]") == [] and standalone_masters("spark://m1:7077,m2:7078") == [
        ("m1", 7077),
        ("m2", 7078),
    ]
    with pytest.raises(SparkSetupError, match="not host:port"):
        standalone_masters("spark://nohost")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: a refused connection
        with pytest.raises(SparkSetupError, match=r"cannot reach the Spark master .* start it"):
            check_master_reachable(f"spark://127.0.0.1:{port}", timeout=2)
        check_master_reachable("local[1]")  # nothing to reach


# ---- per-task Prometheus metrics ---------------------------------------------------------------------------
def _row(task: str, owner: str | None, metrics: dict, status: str = "RUNNING", shown: str | None = None) -> TaskRow:
    return TaskRow(task, group="g", owner=owner, status=status, shown=shown or status, metrics=metrics)


def test_task_metrics_are_bounded_validated_and_cached() -> None:
    now = [0.0]
    reads: list[int] = []
    pages = [
        TaskPage(
            (
                _row(
                    "t1",
                    "b1",
                    {"rows": 10, "batches": 2, "input_rows_per_s": 5.0, "backlog_files": 3, "load_share": 0.5},
                ),
                _row("t2", "b2", {"rows": "<b>", "input_rows_per_s": math.nan, "load_share": 1e9}),
                _row("t3", "b9", {"rows": 99}, shown="STALE"),  # its writer's session is gone: no figures
            ),
            next_cursor="t3",
        )
    ]

    def read(limit: int) -> TaskPage:
        reads.append(limit)
        if not pages:
            raise ConnectionError("ZooKeeper away")
        return pages.pop()

    registry = CollectorRegistry()
    registry.register(TaskMetricsCollector(read, max_tasks=3, ttl_s=5.0, clock=lambda: now[0]))
    text = generate_latest(registry).decode()
    assert reads == [3]
    assert 'zkc_task_rows{group="g",task="t1"} 10.0' in text
    assert 'zkc_task_backlog_files{group="g",task="t1"} 3.0' in text
    assert 'zkc_task_load_share{group="g",task="t1"} 0.5' in text  # (t2's absurd share is left out below)
    assert 'zkc_task_running{group="g",task="t1"} 1.0' in text and 'zkc_task_running{group="g",task="t3"} 0.0' in text
    assert 'task="t2"' not in text.replace('zkc_task_running{group="g",task="t2"} 1.0', "")  # no bad figure
    assert 'zkc_task_rows{group="g",task="t3"}' not in text
    assert "zkc_task_metrics_truncated 1.0" in text and "zkc_task_metrics_tasks 3.0" in text
    generate_latest(registry)
    assert reads == [3]  # within the ttl: no read
    now[0] = 6.0
    text = generate_latest(registry).decode()  # the read fails: the last page still answers
    assert reads == [3, 3] and 'zkc_task_rows{group="g",task="t1"} 10.0' in text
    off = CollectorRegistry()
    off.register(TaskMetricsCollector(read, max_tasks=0))
    assert "zkc_task" not in generate_latest(off).decode() and reads == [3, 3]
