"""A task's history of operator actions on its run state and offsets (``/admin/task_history/<id>``): what is
shown, what each verb appends, and the lock over a task's lifecycle (``check_lifecycle``): while a reset of its
offsets (the ``resetting`` mark) or its deletion is under way, no other verb may change it.

A part of ``AdminClient``: every verb (pause, resume, stop, restart, delete, and any verb that rewrites a spec)
takes the lock through ``check_lifecycle`` and commits its history event with its own write; a reset marks
itself with ``begin_reset``."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from controller.admin.common import AdminError, Conflict, ensure_layout
from controller.admin.reads import ClusterReads, decode_read
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs


class Recorder(Protocol):
    """``HistoryAdmin.record``, as the parts that record through it see it."""

    def __call__(self, task_id: str, action: str, detail: str, *, end_reset: bool = False) -> None: ...


@dataclass(frozen=True)
class LifecycleLock:
    """A verb's hold on a task's lifecycle: its event appended to the task's history at the version read. The
    verb commits it in the same multi as its own write (``add_to``), so a reset or a deletion that began since
    the check fails that write, and the verb looks again (and is refused)."""

    path: str | None  # None: no history container (a secured root laid out by an earlier release): no lock
    data: bytes = b""
    version: int | None = None  # None: the history is created by the verb's write

    def add_to(self, t: TransactionRequest) -> int:
        """Add the history write to ``t``; the number of operations added (0 or 1), before the verb's own."""
        if self.path is None:
            return 0
        if self.version is None:
            t.create(self.path, self.data)
        else:
            t.set_data(self.path, self.data, version=self.version)
        return 1


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

    def check_lifecycle(self, task_id: str, verb: str, detail: str) -> LifecycleLock:
        """The one lock over a task's lifecycle, for every verb that changes its run state, its spec or its
        existence (pause, resume, stop, restart, delete, apply): ``Conflict`` with the reason while a reset of
        its offsets or its deletion is under way (a delete may be asked again), else the history write (the
        verb and ``detail``) that the verb commits in one multi with its own write."""
        lay = self.layout
        path = lay.task_history(task_id)
        got, _ = self.reads.wave([path, lay.admin_delete_task(task_id)])
        if got[1] is not None and verb != "delete":
            raise Conflict(f"task {task_id!r} is being deleted: {verb} refused")
        hist, err = decode_read(admin_records.TaskHistory, got[0], path) if got[0] is not None else (None, None)
        if (
            hist is not None
            and hist.resetting is not None
            and time.time() - hist.resetting < admin_records.RESET_LEASE_S
        ):
            began = time.strftime("%H:%M:%S", time.localtime(hist.resetting))
            raise Conflict(
                f"task {task_id!r}: a reset of its offsets began at {began} and has not finished: {verb} refused; "
                "wait for it (or, if it died, run reset-offsets again)"
            )
        if got[0] is None:
            ensure_layout(self.client, lay)
            if self.client.exists(lay.admin_task_history) is None:
                return LifecycleLock(None)  # an old secured root: no history to hold (nor a reset to wait for)
        new = _append(verb, detail, False)(hist or admin_records.TaskHistory())
        if err:  # an unreadable history is replaced, not kept
            new = replace(new, events=new.events[-1:])
        return LifecycleLock(path, codecs.encode(new), None if got[0] is None else int(got[0][1].version))

    def lifecycle_version(self, task_id: str, verb: str) -> int | None:
        """``check_lifecycle`` for a verb that writes a history record of its own (apply, rollback): the
        history's version to write it at (None: the verb creates it); ``Conflict`` as there."""
        return self.check_lifecycle(task_id, verb, "").version

    def begin_reset(self, task_id: str, spec_version: int) -> None:
        """One multi: the spec checked at the version read (still STOPPED: a resume since then fails the reset),
        no deletion requested (its request znode created and deleted again: that fails if one exists) and the
        history marked ``resetting`` (a verb after it fails its history write, looks again and is refused).
        The spec itself is not rewritten: its zxid stays the stop's, which ``stop_state`` compares with the
        group's."""
        ensure_layout(self.client, self.layout)
        now = time.time()
        for _ in range(10):
            path, data, version = self._history_op(task_id, lambda h: replace(h, resetting=now))
            t = self.client.transaction()
            t.check(self.layout.task(task_id), spec_version)
            request = self.layout.admin_delete_task(task_id)
            t.create(request, b"")
            t.delete(request)
            if version is None:
                t.create(path, data)
            else:
                t.set_data(path, data, version=version)
            results = t.commit()
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if not failed:
                return
            if isinstance(results[1], NodeExistsError):
                raise Conflict(f"task {task_id!r} is being deleted; nothing was reset")
            if isinstance(results[3], NoNodeError):
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
