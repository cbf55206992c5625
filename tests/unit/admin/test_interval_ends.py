"""When a dead session's open run ended: when the session did; a live session's run of a task it let go awaits its
end."""

from __future__ import annotations

from controller.admin.interval_ends import session_ends, unflushed_ends
from controller.protocol.records.task_records import RunInterval


def test_a_dead_sessions_open_run_ends_when_the_session_did():
    runs = [
        RunInterval("t1", "dead", 100.0),
        RunInterval("t2", "dead", 100.0),
        RunInterval("t3", "live", 100.0),
        RunInterval("t4", "back", 100.0),
    ]
    ends = session_ends(
        runs,
        registered={"dead": None, "live": 50.0, "back": 130.0},
        owners={"t1": ("other", 120.0), "t2": None, "t3": ("live", 60.0), "t4": ("back", 135.0)},
        flushed={"dead": 110.0, "back": 105.0},
    )
    assert ends == {0: 120.0, 1: 110.0, 3: 130.0}  # t3's broker is alive since before the run: still running


def test_a_live_sessions_open_run_of_a_task_it_let_go_awaits_its_end():
    """A live broker writes the end of a run to its log after it let go of the task: until then the log reads
    as if it still ran it, beside the next owner's start. Those runs are the ones a checker waits for."""
    runs = [
        RunInterval("t1", "live", 100.0, acquired=99.5),  # its owner znode: the one it took for this run
        RunInterval("t2", "live", 100.0, acquired=99.5),  # moved to another broker since
        RunInterval("t3", "live", 100.0, acquired=99.5),  # let go, nobody has it yet
        RunInterval("t4", "live", 100.0, acquired=99.5),  # let go, taken by another, and taken back since
        RunInterval("t5", "gone", 100.0),  # an ended session: session_ends closes it, nothing to wait for
        RunInterval("t6", "live", 100.0),  # a run recorded without its acquisition: its start stands for it
    ]
    pending = unflushed_ends(
        runs,
        registered={"live": 50.0, "gone": None},
        owners={
            "t1": ("live", 99.4),
            "t2": ("other", 120.0),
            "t3": None,
            "t4": ("live", 125.0),
            "t5": ("other", 120.0),
            "t6": ("live", 99.9),
        },
    )
    assert pending == [1, 2, 3]
