"""A pipeline's own log on its broker: records about the task routed to its file, rotation bounds it, and the
tail and follow reads return whole lines within their bound. Real files, no ZooKeeper."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from broker_sim.worker.safe_files import Budget
from broker_sim.worker.task_logs import MAX_LOG_FILE_BYTES, TaskLogs

log = logging.getLogger("tests.task_logs")


def test_records_about_a_task_go_to_its_own_file_and_come_back_as_lines(tmp_path: Path) -> None:
    logs = TaskLogs(str(tmp_path / "logs")).start()
    try:
        logs.track("t1")
        logs.track("t2")
        log.warning("worker b0: starting %s: %s", "t1", "boom")
        log.warning("worker b0: starting %s", "t2")
        log.warning("nothing about a task: %s", "t3")
        logs.note("t1", "state FAILED: a\nmultiline error")
    finally:
        logs.stop()  # drains the queue: everything logged before is written
    got = logs.read("t1", "b0", 10, None, Budget())
    assert got is not None and got.broker == "b0" and not got.truncated
    assert got.lines[0].endswith("worker b0: starting t1: boom")
    assert len(got.lines) == 3 and got.lines[1].endswith(" state FAILED: a") and got.lines[2] == "  multiline error"
    assert logs.read("t3", "b0", 10, None, Budget()) is None
    assert logs.read("t1", "b0", 1, None, Budget()).lines == ("  multiline error",)
    more = logs.read("t1", "b0", 10, got.offset, Budget())
    assert more is not None and more.lines == () and more.offset == got.offset


def test_a_log_rotates_at_its_bound_and_a_follow_after_the_rotation_reads_the_new_file(tmp_path: Path) -> None:
    logs = TaskLogs(str(tmp_path / "logs")).start()
    line = "x" * 999
    try:
        for _ in range(MAX_LOG_FILE_BYTES // 1000 + 50):
            logs.note("big", line)
    finally:
        logs.stop()
    path = logs.path_of("big")
    assert os.path.getsize(path) < MAX_LOG_FILE_BYTES and os.path.getsize(path + ".1") <= MAX_LOG_FILE_BYTES + 1100
    before = MAX_LOG_FILE_BYTES + 10  # a follower that had read the old file to its end
    got = logs.read("big", "b0", 5, before, Budget())
    assert got is not None and got.offset == os.path.getsize(path) and all(ln.endswith(line) for ln in got.lines)
