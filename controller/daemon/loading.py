"""The failover load: read the cluster into a fresh context (multiRead, pipelined or sequential), then
arm the tasks' data watches in the background without losing a change made in between."""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Callable, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import (
    NoNodeError,
)

from controller.protocol import codecs
from controller.daemon import events as ev
from controller.protocol.codecs import (
    Assignment,
    GroupStateInfo,
    PayloadError,
)
from controller.daemon.context import TRANSIENT, ControllerContext
from controller.protocol.layout import ZkLayout
from controller.zk.layout_io import list_task_paths
from controller.zk.watches import PersistentWatches
from controller.zk.io import (
    InterruptibleClient,
    children_many,
    exists_many,
    get_many,
    multi_children,
    multi_read,
)

log = logging.getLogger(__name__)


# Tasks whose data watch the background armer sets per round (pipelined ``exists``, then one comparison).
ARM_WATCH_CHUNK = 100


class _Resync:
    """One pending ``TasksResync`` per activation, however many watches fire NONE at once (kazoo fires each
    one-shot watcher once per path it was armed on)."""

    def __init__(self, token: int, put: Callable[[Any], None]) -> None:
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


class TaskWatch(_Resync):
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

    def __init__(self, token: int, put: Callable[[Any], None], layout: ZkLayout) -> None:
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


class TaskWatchArmer(threading.Thread):
    """Arms the data watch of each task a multiRead load read without one, off the event thread, and hands
    back the tasks whose spec changed or vanished before their watch was armed.

    Per chunk of ``ARM_WATCH_CHUNK`` tasks: pipelined ``exists`` with the activation's task watcher (the
    server sets each watch atomically with the read), then each stat's ``mzxid`` is compared with the one
    the load read: a task whose znode changed since (or is gone) is enqueued, one ``TaskConfigChanges`` per
    chunk, and the event thread re-reads it as it would after a watch firing. A change after the armer's
    read fires the watch. Together no spec change between the load and the watch is lost.

    It only reads ZooKeeper and enqueues events: it holds the ids and mzxids it was given, the watcher and
    ``put``, never the controller's state. It stops between chunks once ``stop`` is called (resign, reload,
    controller stop); everything it armed or enqueued carries its activation's token, which the controller
    then ignores. A lost connection makes it wait and retry the chunk (armed watches survive in the session;
    an expired session resigns and stops it); an unexpected error hands the tasks not yet armed to the event
    thread, whose re-read arms them.
    """

    def __init__(self, name: str, client: InterruptibleClient, token: int, loaded: dict[str, int],
                 path_of: Callable[[str], str], watcher: Callable[[Any], None], put: Callable[[Any], None],
                 hook: Callable[[Sequence[str]], None] | None = None, chunk: int | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self._client = client
        self.token = token
        self._loaded = loaded
        self._path_of = path_of
        self._watcher = watcher
        self._put = put
        self._hook = hook
        self._chunk = chunk or ARM_WATCH_CHUNK
        self._stopped = threading.Event()
        self.started_at = time.monotonic()
        self.armed = 0  # tasks whose watch is armed (read by tests and benchmarks)
        self.changed = 0  # tasks handed back because they changed before their watch was armed
        self.took_s: float | None = None  # set when every watch is armed

    def stop(self, join_s: float = 0.0) -> None:
        self._stopped.set()
        if join_s and self.ident is not None and threading.current_thread() is not self:
            self.join(join_s)

    def run(self) -> None:
        ids = list(self._loaded)
        for i in range(0, len(ids), self._chunk):
            chunk = ids[i:i + self._chunk]
            try:
                stats = self._arm(chunk)
            except Exception:
                if not self._stopped.is_set():
                    log.exception("arming the tasks' watches failed; the event thread re-reads the rest with theirs")
                    self._put(ev.TaskConfigChanges(self.token, tuple(ids[i:])))
                return
            if stats is None:
                return
            changed = tuple(t for t, stat in zip(chunk, stats) if stat is None or stat.mzxid != self._loaded[t])
            if changed:
                self.changed += len(changed)
                self._put(ev.TaskConfigChanges(self.token, changed))
            self.armed += len(chunk)
        self.took_s = time.monotonic() - self.started_at
        log.info("armed the watches of %d tasks in %.3fs (%d changed meanwhile)", self.armed, self.took_s, self.changed)

    def _arm(self, chunk: list[str]) -> list[Any] | None:
        """The chunk's stats, read with their watches armed; None once stopped."""
        if self._hook is not None:
            self._hook(chunk)
        while not self._stopped.is_set():
            try:
                return exists_many(self._client, [self._path_of(t) for t in chunk], watch=lambda _p: self._watcher)
            except TRANSIENT:
                self._stopped.wait(0.5)
        return None


def get_sequential(client: KazooClient, paths, watch=None):
    """One synchronous round trip per znode: the baseline the pipelined load is measured against."""
    out = []
    for p in paths:
        try:
            out.append(client.get(p, watch=watch(p) if watch else None))
        except NoNodeError:
            out.append(None)
    return out


class StateLoad:
    """Loading the context on activation or reload."""

    def _load(self) -> None:
        """Read the whole cluster state and arm watches (``_load_state``), with Python's cyclic garbage
        collector paused: the load allocates a dozen objects per task and frees almost none, so every
        collection it triggered walked the growing context again, for nothing (100,000 tasks: 3.09 s with
        them, 1.26 s without, benchmark B10)."""
        paused = gc.isenabled()
        gc.disable()
        try:
            self._load_state()
        finally:
            if paused:
                gc.enable()

    def _load_state(self) -> None:
        """Read the whole cluster state and arm watches.

        ``load="multiread"`` (the default): task specs, group states and assignments are read without
        watches in multiRead requests (a dozen requests for 10,000 tasks instead of one kazoo request each,
        whose fixed cost bounded the failover; see ``zkio.multi_read``), so the context is in place and the
        groups are loaded at once; then ``TaskWatchArmer`` arms each task's data watch in the background and
        hands back every task whose spec changed or vanished between the load's read and its watch. Brokers
        and members (one per broker) are read with their watches, pipelined, in every mode.
        ``"pipelined"`` / ``"sequential"``: every task is read with its watch, one kazoo request per znode,
        pipelined or one round trip each (the contenders of benchmark B3).
        """
        self._stop_watch_armer()
        started = time.monotonic()
        c, lay, w = self.zk, self.layout, self._watch
        ctx = ControllerContext()
        method = self.config.load
        fetch = get_sequential if method == "sequential" else get_many  # reads that arm a watch
        bulk = multi_read if method == "multiread" else fetch  # reads that arm none
        bulk_children = multi_children if method == "multiread" else children_many
        # brokers
        ids = c.get_children(lay.broker_ids, watch=w(ev.BrokerChange))
        for b, res in zip(ids, fetch(c, [lay.broker(b) for b in ids],
                                     watch=lambda p: self._watch(lambda t, b=p.rsplit('/', 1)[1]: ev.BrokerModification(t, b)))):
            if res is not None:
                ctx.brokers[b] = self._broker_record(lay.broker(b), res)
        # tasks: the recursive watch first (armed before the read, it misses nothing after it), else a
        # children watch and one data watch per task
        tree = self._watch_task_tree()
        listed = list_task_paths(c, lay, watch=None if tree else self._bucket_watch(ev.TaskChange))
        tids = [t for t, _ in listed]
        task_paths = [p for _, p in listed]
        unwatched: dict[str, int] = {}  # task -> mzxid read, for the tasks whose watch is still to arm
        if method == "multiread":
            task_data = multi_read(c, task_paths)
        else:
            task_data = fetch(c, task_paths, watch=None if tree else self._task_watch)
        for t, path, res in zip(tids, task_paths, task_data):
            if res is not None:
                self._set_task(ctx, t, res[0], path)
                if method == "multiread" and not tree:
                    unwatched[t] = res[1].mzxid
        ctx.deleting = set(c.get_children(lay.admin_delete_tasks, watch=self._deletion_watcher()))
        self._load_operations(ctx)
        self.metrics.maintenance.set(1 if ctx.maintenance.on else 0)
        # groups
        names = set(c.get_children(lay.groups, watch=w(ev.GroupsChange)))
        names |= {s.group for s in ctx.tasks.values()}
        names = sorted(names)
        for g in names:
            self._ensure_group_paths(g)
        states = bulk(c, [lay.group_state(g) for g in names])
        member_lists = children_many(c, [lay.group_members(g) for g in names],
                                     watch=lambda p: self._watch(lambda t, g=p.split('/')[-2]: ev.MembersChange(t, g)))
        assignment_lists = bulk_children(c, [lay.group_assignments(g) for g in names])
        member_paths = [(g, m) for g, ms in zip(names, member_lists) for m in (ms or [])]
        member_data = fetch(c, [lay.group_member(g, m) for g, m in member_paths], watch=self._member_watch)
        assignment_paths = [(g, m) for g, ms in zip(names, assignment_lists) for m in (ms or [])]
        assignment_data = bulk(c, [lay.group_assignment(g, m) for g, m in assignment_paths])
        for g in names:
            ctx.members[g] = {}
        for (g, m), res in zip(member_paths, member_data):
            if res is not None:
                self._set_member(ctx, g, m, res[0], res[1])
        assignments: dict[str, dict[str, Assignment]] = {g: {} for g in names}
        for (g, m), res in zip(assignment_paths, assignment_data):
            if res is None:
                continue
            path = lay.group_assignment(g, m)
            ctx.known_paths.add(path)
            try:
                assignments[g][m] = codecs.decode(Assignment, res[0], path)
            except PayloadError as exc:
                log.warning("ignoring %s", exc)
        self.ctx = ctx
        self.metrics.brokers.set(len(ctx.brokers))
        self.metrics.tasks.set(len(ctx.tasks))
        self.metrics.invalid_tasks.set(len(ctx.invalid_tasks))
        load_s = time.monotonic() - started
        for g, state_res in zip(names, states):
            info = None
            if state_res is not None:
                ctx.known_paths.add(lay.group_state(g))
                try:
                    info = codecs.decode(GroupStateInfo, state_res[0], lay.group_state(g))
                except PayloadError as exc:
                    log.warning("group %s: %s; rebuilding it", g, exc)
            coord = self._new_coordinator(g)
            try:
                self._apply(g, coord.load(info, ctx.members[g], ctx.group_tasks(g), assignments[g]))
            except PayloadError as exc:  # one group that cannot be written must not stop the activation
                log.error("group %s cannot be scheduled: %s", g, exc)
        self._write_invalid_statuses(ctx.invalid_tasks)
        log.info("controller %s loaded %d brokers, %d tasks, %d groups in %.3fs", self.id, len(ctx.brokers),
                 len(ctx.tasks), len(names), load_s)
        self.last_load_s = load_s
        # pending admin requests, and statuses left behind by tasks deleted before
        for make in (ev.Rebalance, ev.ControlledShutdown, ev.Reassign, ev.TaskDeletion, ev.StatusesChange):
            self.put(make(self.token))
        if unwatched:  # off the critical path: the context is loaded, the groups are running
            self.watch_armer = TaskWatchArmer(
                f"controller-{self.id}-watch-armer", self.zk, self.token, unwatched, lay.task, self._task_watch(lay.tasks),
                self.put, hook=self.before_arming)
            self.watch_armer.start()

    def _watch_task_tree(self) -> bool:
        """Arm this activation's persistent recursive watch of ``/tasks``; False where the configuration or
        the server says one-shot watches (the caller arms those)."""
        self.task_tree_watched = False
        if self.config.task_watch != "persistent":
            return False
        self._task_tree_watcher = TaskTreeWatch(self.token, self.put, self.layout)
        self.task_tree_watched = PersistentWatches.for_client(self.client).add(self.layout.tasks, self._task_tree_watcher)
        return self.task_tree_watched

    def _unwatch_task_tree(self) -> None:
        """The activation is over: its watch goes (a candidate has no use for every task's events)."""
        if self.task_tree_watched:
            self.task_tree_watched = False
            PersistentWatches.for_client(self.client).remove(self.layout.tasks)

    def _stop_watch_armer(self) -> None:
        """The activation the armer works for is over (resign, reload): it stops between two chunks; its
        watches and events carry the old token and are dropped."""
        if self.watch_armer is not None:
            self.watch_armer.stop()

    def _ensure_group_paths(self, g: str) -> None:
        lay = self.layout
        for p in (lay.group_members(g), lay.group_joins(g), lay.group_syncs(g), lay.group_assignments(g)):
            self.zk.ensure_path(p)
