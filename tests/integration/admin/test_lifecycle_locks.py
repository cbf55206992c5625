"""The lock over a task's lifecycle holds for every verb, against a real ZooKeeper: while a reset of its offsets
or its deletion is under way, pause, resume, stop, restart and delete are refused with the reason (a pause
then a resume cannot get round it), a reset is refused during a deletion, and every verb is in the task's
history. A verb that raced a deletion (its check before the request, its write after) is refused, not answered
as done: the history write it commits with its own fails. The reset itself with a controller and a worker:
tests/integration/admin/test_task_stop.py."""

from __future__ import annotations

import time

import pytest

from controller.admin import AdminClient, Conflict
from controller.admin.task_history import LifecycleLock
from controller.admin.task_ops import TaskAdmin
from controller.protocol.records import admin_records, codecs
from tests.offsets_support import spark_spec


def _actions(admin: AdminClient, task_id: str) -> list[str]:
    return [e.action for e in admin.history(task_id).events]


def _mark_resetting(zk, layout, admin: AdminClient, task_id: str, at: float) -> None:
    """What ``begin_reset`` writes: the history marked ``resetting`` (a reset that holds the lock)."""
    hist = admin.history(task_id)
    zk.set(layout.task_history(task_id), codecs.encode(admin_records.TaskHistory(hist.events, resetting=at)))


def test_every_verb_is_refused_while_a_reset_is_under_way_and_each_is_recorded(zk, layout, tmp_path):
    admin = AdminClient(zk, layout)
    admin.create_tasks([spark_spec("r1", tmp_path)])
    assert admin.stop("r1").changed
    _mark_resetting(zk, layout, admin, "r1", time.time())
    spec_before = zk.get(layout.task("r1"))
    for verb in (admin.pause, admin.resume, admin.restart, admin.stop, admin.delete_task):
        with pytest.raises(Conflict, match=r"a reset of its offsets began at .* refused"):
            verb("r1")
    assert zk.get(layout.task("r1")) == spec_before  # nothing changed: still STOPPED, same version
    assert zk.exists(layout.admin_delete_task("r1")) is None
    assert _actions(admin, "r1") == ["stop"]

    _mark_resetting(zk, layout, admin, "r1", time.time() - admin_records.RESET_LEASE_S - 1)  # a reset that died
    assert admin.pause("r1").state == "PAUSED"
    assert admin.resume("r1").state == "RUNNING"
    assert admin.restart("r1").changed
    assert admin.stop("r1").changed
    admin.delete_task("r1")
    assert _actions(admin, "r1") == ["stop", "pause", "resume", "restart", "stop", "delete"]
    assert [e.detail for e in admin.history("r1").events][1:3] == ["was STOPPED", "was PAUSED"]


def test_every_verb_and_a_reset_are_refused_while_a_deletion_is_under_way(zk, layout, tmp_path):
    """No controller here: the deletion stays requested."""
    admin = AdminClient(zk, layout)
    admin.create_tasks([spark_spec("d1", tmp_path), spark_spec("d2", tmp_path, state="STOPPED")])
    assert admin.delete_task("d1").already_pending is False
    for verb in (admin.pause, admin.resume, admin.restart, admin.stop):
        with pytest.raises(Conflict, match="is being deleted"):
            verb("d1")  # a RUNNING task being deleted: a resume is refused, not answered "resumed"
    assert admin.delete_task("d1").already_pending  # asked again: allowed, recorded once
    assert _actions(admin, "d1") == ["delete"]

    admin.delete_task("d2")  # a reset that checked before the deletion: its own multi refuses it
    with pytest.raises(Conflict, match="is being deleted; nothing was reset"):
        admin.history_admin.begin_reset("d2", zk.exists(layout.task("d2")).version)
    assert admin.history("d2").resetting is None


def test_a_resume_that_races_a_deletion_is_refused_not_answered_resumed(zk, layout, tmp_path):
    """The deletion is filed between the resume's check and its write (injected through the lock's callable):
    the history write committed with the spec's fails, the resume looks again and is refused."""
    admin = AdminClient(zk, layout)
    admin.create_tasks([spark_spec("x1", tmp_path, state="PAUSED")])
    calls: list[str] = []

    def lock_then_delete(task_id: str, verb: str, detail: str) -> LifecycleLock:
        lock = admin.history_admin.check_lifecycle(task_id, verb, detail)
        if not calls:
            admin.delete_task(task_id)  # another operator, at the worst moment
        calls.append(verb)
        return lock

    tasks = TaskAdmin(zk, layout, admin.reads, lifecycle=lock_then_delete)
    with pytest.raises(Conflict, match="is being deleted"):
        tasks.resume("x1")
    assert admin.reads.spec("x1")[0].state == "PAUSED"
    assert _actions(admin, "x1") == ["delete"]
