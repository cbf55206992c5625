"""Which tasks a bulk restart takes (``zkctl task restart [--failed]``) and the restart progress ``task describe``
reports, from rows and statuses alone (the restarts themselves: tests/integration/admin/test_restarts.py)."""

from __future__ import annotations

import pytest

from controller.admin.views import SkippedRestart, TaskRow, restart_candidates, restart_progress
from controller.protocol.records import task_records
from controller.protocol.tasks.spec import RestartPolicy


def row(task_id: str, shown: str | None, state: str | None = "RUNNING", **kw) -> TaskRow:
    return TaskRow(task_id, "default", state, "noop", 1, status=shown, shown=shown, **kw)


ROWS = [
    row("ok", "RUNNING"),
    row("failed", "FAILED"),
    row("paused", "FAILED", state="PAUSED"),
    row("leaving", "FAILED", deleting=True),
    row("stale", "STALE"),
    row("nobody", "UNASSIGNED"),
    row("new", None),
    row("done", "COMPLETED"),
    row("retrying", "RESTARTING"),
    TaskRow("garbage", invalid="not JSON", shown="INVALID"),
]


def test_only_failed_takes_the_tasks_shown_failed_and_says_why_it_leaves_some():
    chosen, skipped = restart_candidates(ROWS, only_failed=True)
    assert chosen == ["failed"]
    assert skipped == [
        SkippedRestart("paused", "PAUSED: resume it to run it again"),
        SkippedRestart("leaving", "being deleted"),
    ]


def test_every_task_is_taken_without_only_failed():
    chosen, skipped = restart_candidates(ROWS, only_failed=False)
    assert chosen == ["ok", "failed", "stale", "nobody", "new", "done", "retrying"]
    assert [s.task_id for s in skipped] == ["paused", "leaving", "garbage"]


def status(state: str, failures: int) -> task_records.TaskStatus:
    return task_records.TaskStatus(broker="b0", state=state, generation=1, updated=0.0, failures=failures)


@pytest.mark.parametrize(
    "st, attempts, gave_up, next_delay",
    [
        (None, 0, False, None),
        (status("RUNNING", 0), 0, False, None),
        (status("RESTARTING", 1), 1, False, 1.0),
        (status("RESTARTING", 3), 3, False, 4.0),
        (status("RUNNING", 3), 3, False, None),
        (status("FAILED", 4), 3, True, None),
        (status("FAILED", 1), 1, False, None),  # a permanent failure (an invalid spec) with attempts left
    ],
)
def test_progress_through_the_policy(st, attempts, gave_up, next_delay):
    p = restart_progress(RestartPolicy(max_attempts=3, backoff_initial_s=1.0, backoff_max_s=8.0), st)
    assert (p.attempts, p.gave_up, p.next_delay_s) == (attempts, gave_up, next_delay)
    assert (p.max_attempts, p.backoff_initial_s, p.backoff_max_s) == (3, 1.0, 8.0)
