"""The status rules without ZooKeeper: a status names the session that wrote it, is STALE unless the session
holding the task wrote it, and a task to run that nobody holds is UNASSIGNED since the later of its creation and
its last status (every admin read, against a real ZooKeeper: tests/integration/admin/test_status_truth.py)."""

from __future__ import annotations

from controller.admin.views import shown_status, stale_after, unassigned_since
from controller.protocol.records import codecs, task_records
from controller.protocol.records.task_records import OwnerInfo, TaskStatus


def _status(state="RUNNING", broker="b1", session="0x10"):
    return TaskStatus(broker=broker, state=state, generation=3, updated=100.0, session=session)


def test_an_old_status_payload_without_its_session_still_decodes():
    old = b'{"broker": "b1", "state": "RUNNING", "generation": 2, "updated": 5.0, "version": 1}'
    assert codecs.decode(TaskStatus, old).session is None
    assert task_records.session_hex(0x1000ABC) == "0x1000abc" and task_records.session_hex(None) is None
    st = _status()
    assert codecs.decode(TaskStatus, codecs.encode(st)) == st


def test_a_status_is_stale_unless_the_session_holding_the_task_wrote_it():
    owner = OwnerInfo(broker="b1", generation=3)
    assert not stale_after(_status(), owner, 0x10)  # the owner's session wrote it
    assert stale_after(_status(), owner, 0x11)  # an earlier life of b1 wrote it
    assert stale_after(_status(broker="b2"), owner, 0x10)  # another broker wrote it
    assert stale_after(_status(), None, None)  # nobody holds the task
    assert not stale_after(_status(session=None), owner, 0x11)  # an old payload: the broker is all we know
    for final in ("COMPLETED", "FAILED", "STOPPED"):  # only a claim to be running can be stale
        assert not stale_after(_status(state=final), None, None)


def test_unassigned_means_to_run_and_held_by_nobody_since_the_later_of_creation_and_the_last_status():
    assert unassigned_since("RUNNING", False, None, 10.0, None) == 10.0
    assert unassigned_since("RUNNING", False, _status(state="STOPPED"), 10.0, 25.0) == 25.0
    assert unassigned_since("RUNNING", True, None, 10.0, None) is None  # held
    assert unassigned_since("PAUSED", False, None, 10.0, None) is None  # not to run
    assert unassigned_since("RUNNING", False, _status(state="COMPLETED"), 10.0, 25.0) is None  # finished
    assert shown_status(_status(), True, 5.0) == "UNASSIGNED"
    assert shown_status(_status(), True, None) == "STALE"
    assert shown_status(_status(state="FAILED"), False, None) == "FAILED"
    assert shown_status(None, False, None) is None
