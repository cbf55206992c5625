"""The watchers of one activation's tasks: callbacks that run on kazoo's thread and only enqueue events
(a task's spec changed, the tree of tasks changed, an owner of a task being deleted let go). One object per
activation and kind, not one per znode and read: kazoo keeps a set of watchers per path, so re-arming a
path with the same object never stacks callbacks."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kazoo.protocol.states import EventType

from controller.daemon import events as ev
from controller.protocol.cluster.layout import ZkLayout

Put = Callable[[Any], None]


class _Resync:
    """One pending ``TasksResync`` per activation, however many watches fire NONE at once (kazoo fires each
    one-shot watcher once per path it was armed on)."""

    def __init__(self, token: int, put: Put) -> None:
        self.token = token
        self._put = put
        self._lock = threading.Lock()
        self._queued = False

    def lost(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        self._put(ev.TasksResync(self.token))

    def taken(self) -> None:
        """The event thread starts the re-read: a later loss needs another."""
        with self._lock:
            self._queued = False


class TaskDataWatch(_Resync):
    """The data watcher of every task znode of one activation: a firing (spec changed, task deleted) enqueues
    ``TaskConfigChange`` for the task its path names. One object per activation, not one per task and read:
    kazoo's watcher sets then never hold two callbacks for one task. A NONE firing (path None) means the
    connection dropped and kazoo forgot every watch: ``TasksResync`` re-reads every task, re-arming them (on
    a lost session it carries a stale token and is dropped)."""

    def __call__(self, event: Any) -> None:  # kazoo's thread: enqueue only
        path = getattr(event, "path", None)
        if path:
            self._put(ev.TaskConfigChange(self.token, path.rsplit("/", 1)[1]))
        else:
            self.lost()


class TaskTreeWatch(_Resync):
    """The persistent recursive watcher of ``/tasks`` of one activation (``controller/zk/watches.py``): a task
    znode created, changed or deleted enqueues ``TaskConfigChange`` for it; events below a task (its owner)
    are not specs and are dropped here, on kazoo's thread. NONE (the connection dropped): ``TasksResync``."""

    def __init__(self, token: int, put: Put, layout: ZkLayout) -> None:
        super().__init__(token, put)
        self._layout = layout

    def __call__(self, event: Any) -> None:  # kazoo's thread: enqueue only
        path = getattr(event, "path", None)
        if path is None:
            self.lost()
            return
        task = self._layout.task_of(path)  # None for a bucket, an owner, a stray
        if task is not None:
            self._put(ev.TaskConfigChange(self.token, task))


class DeletionWatch:
    """The one watcher of an activation for every watch of the deletion path: the requests' children and
    the owners of tasks being deleted. kazoo keeps watchers in a set per path, so re-arming a path with
    the same function does not stack callbacks. Firings coalesce into one pending TaskDeletion and say
    what changed: an owner deleted (released), an owner created (look again, re-arming), or the
    connection dropped (kazoo forgot every watch: look at everything again)."""

    def __init__(self, token: int, put: Put) -> None:
        self.token = token
        self._put = put
        self._lock = threading.Lock()
        self._queued = False
        self._released: set[str] = set()
        self._recheck: set[str] = set()
        self._rescan = True  # the first look after an activation checks every requested task

    def __call__(self, event: Any) -> None:  # kazoo's thread: note and enqueue only
        path = getattr(event, "path", None) or ""
        kind = getattr(event, "type", EventType.NONE)
        with self._lock:
            if kind == EventType.NONE:
                self._rescan = True
            elif path.endswith("/owner"):
                task = path.rsplit("/", 2)[-2]
                if kind == EventType.DELETED:
                    self._released.add(task)
                    self._recheck.discard(task)
                else:
                    self._recheck.add(task)
                    self._released.discard(task)
        self._enqueue()

    def recheck(self, tasks: set[str]) -> None:
        with self._lock:
            self._recheck |= tasks
            self._released -= tasks
        self._enqueue()

    def _enqueue(self) -> None:
        with self._lock:
            if self._queued:
                return
            self._queued = True
        self._put(ev.TaskDeletion(self.token))

    def take(self) -> tuple[set[str], set[str], bool]:
        """What changed since the last look (the event thread calls this as it looks again)."""
        with self._lock:
            self._queued = False
            released, self._released = self._released, set()
            recheck, self._recheck = self._recheck, set()
            rescan, self._rescan = self._rescan, False
        return released, recheck, rescan
