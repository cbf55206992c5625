"""A task's history of operator actions on its run state and offsets (``/admin/task_history/<id>``): what is
shown, what each stop and reset appends, and the ``resetting`` mark by which a resume waits for a reset.

A part of ``AdminClient``: the stop and the reset record through it, a resume checks it first."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from controller.admin.common import AdminError, Conflict, ensure_layout
from controller.admin.reads import ClusterReads, decode_read
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs


class Recorder(Protocol):
    """``HistoryAdmin.record``, as the parts that record through it see it."""

    def __call__(self, task_id: str, action: str, detail: str, *, end_reset: bool = False) -> None: ...


class HistoryAdmin:
    """Reads and appends a task's history; marks a reset under way."""

    def __init__(self, client: KazooClient, layout: ZkLayout, reads: ClusterReads) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads

    def history(self, task_id: str) -> admin_records.TaskHistory:
        """The task's recorded stops and resets (empty when none)."""
        path = self.layout.task_history(task_id)
        got, _ = self.reads.wave([path])
        hist, err = decode_read(admin_records.TaskHistory, got[0], path)
        if err:
            raise AdminError(f"task {task_id!r}: its history is unreadable: {err}")
        return hist or admin_records.TaskHistory()

    def _history_op(
        self, task_id: str, change: Callable[[admin_records.TaskHistory], admin_records.TaskHistory]
    ) -> tuple[str, bytes, int | None]:
        """The history znode's path, its new bytes, and the version to set (None: to create)."""
        path = self.layout.task_history(task_id)
        try:
            data, stat = self.client.get(path)
            hist, err = decode_read(admin_records.TaskHistory, (data, stat), path)
            version: int | None = stat.version
        except NoNodeError:
            hist, err, version = None, None, None
        new = change(hist or admin_records.TaskHistory())  # an unreadable history is replaced, not kept
        if err:
            new = replace(new, events=new.events[-1:])
        return path, codecs.encode(new), version

    def record(self, task_id: str, action: str, detail: str, *, end_reset: bool = False) -> None:
        """Append one event (bounded to the newest ``HISTORY_EVENTS``; ``end_reset``: a reset is over); retried
        on a concurrent write."""
        ensure_layout(self.client, self.layout)
        for _ in range(10):
            path, data, version = self._history_op(task_id, _append(action, detail, end_reset))
            try:
                if version is None:
                    self.client.create(path, data)
                else:
                    self.client.set(path, data, version=version)
                return
            except (BadVersionError, NodeExistsError):
                continue
            except NoNodeError:
                raise AdminError(
                    f"task {task_id!r}: the {action} is done but not recorded: {self.layout.admin_task_history} is "
                    "missing (a secured root laid out by an earlier release: run `zkctl security init`)"
                ) from None
        raise AdminError(f"task {task_id!r}: its history kept changing; the {action} is done but not recorded")

    def check_resume(self, task_id: str) -> int | None:
        """Before a resume: refuse while a reset of the checkpoint is under way; returns the history znode's
        version for the resume's write to check (a reset that begins meanwhile changes it). A STOPPED task
        without a history gets an empty one first, so that there is a version to check."""
        path = self.layout.task_history(task_id)
        for _ in range(3):
            got, _ = self.reads.wave([path])
            if got[0] is None:
                try:
                    ensure_layout(self.client, self.layout)
                    self.client.create(path, codecs.encode(admin_records.TaskHistory()))
                except NodeExistsError:
                    pass
                except NoNodeError:
                    return None  # no history container (an old secured root): no reset can have begun either
                continue
            hist, _err = decode_read(admin_records.TaskHistory, got[0], path)
            if (
                hist is not None
                and hist.resetting is not None
                and time.time() - hist.resetting < admin_records.RESET_LEASE_S
            ):
                began = time.strftime("%H:%M:%S", time.localtime(hist.resetting))
                raise Conflict(
                    f"task {task_id!r}: a reset of its offsets began at {began} and has not finished; wait for it "
                    "(or, if it died, run reset-offsets again)"
                )
            return int(got[0][1].version)
        raise AdminError(f"task {task_id!r}: its history could not be read")

    def begin_reset(self, task_id: str, spec_version: int) -> None:
        """One multi: the spec checked at the version read (still STOPPED: a resume since then fails the reset)
        and the history marked ``resetting`` (a resume after it fails its check of the history's version, looks
        again and waits). The spec itself is not rewritten: its zxid stays the stop's, which ``stop_state``
        compares with the group's."""
        ensure_layout(self.client, self.layout)
        now = time.time()
        for _ in range(10):
            path, data, version = self._history_op(task_id, lambda h: replace(h, resetting=now))
            t = self.client.transaction()
            t.check(self.layout.task(task_id), spec_version)
            if version is None:
                t.create(path, data)
            else:
                t.set_data(path, data, version=version)
            results = t.commit()
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if not failed:
                return
            if isinstance(results[1], NoNodeError):
                raise AdminError(
                    f"task {task_id!r}: nothing was reset: {self.layout.admin_task_history} is missing (a secured "
                    "root laid out by an earlier release: run `zkctl security init`)"
                )
            if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
                raise Conflict(f"task {task_id!r} changed during the reset (resumed?); nothing was reset")
        raise AdminError(f"task {task_id!r}: its history kept changing; nothing was reset")


def _append(
    action: str, detail: str, end_reset: bool
) -> Callable[[admin_records.TaskHistory], admin_records.TaskHistory]:
    def change(h: admin_records.TaskHistory) -> admin_records.TaskHistory:
        events = (*h.events, admin_records.HistoryEvent(time.time(), action, detail[:500]))[
            -admin_records.HISTORY_EVENTS :
        ]
        return replace(h, events=events, resetting=None if end_reset else h.resetting)

    return change
