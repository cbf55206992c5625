"""The failover load: read the cluster into a fresh context (multiRead, pipelined or sequential), then
arm the tasks' data watches in the background without losing a change made in between.

One load runs in four steps: read the cluster (brokers, tasks, deletions, settings: each read arming its
watch, or none where the background armer arms it), decode it into a fresh context (a znode that does not
decode is set apart, never fatal), read and decode the groups the context names, build (the context put in
place, a coordinator per group started from what it read), and arm (pending admin requests enqueued, the
armer started)."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import (
    NoAuthError,
    NoNodeError,
)

from controller.daemon import events as ev
from controller.daemon.brokers import BrokerTracker, broker_record
from controller.daemon.context import TRANSIENT, ControllerContext, LoadMethod
from controller.daemon.groups import GroupDriver, record_member
from controller.daemon.host import Host
from controller.daemon.metrics import ControllerMetrics
from controller.daemon.names import legal_children
from controller.daemon.operations import OperatorSettings, SettingsRead
from controller.daemon.task_watch import TaskTracker, record_task
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.readiness import placeable
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import Assignment, GroupStateInfo
from controller.protocol.records.payload_validation import PayloadError
from controller.zk.io import InterruptibleClient, children_many, exists_many, get_many
from controller.zk.layout_io import list_task_paths
from controller.zk.multi_read import multi_children, multi_read

log = logging.getLogger(__name__)


# Tasks whose data watch the background armer sets per round (pipelined ``exists``, then one comparison).
ARM_WATCH_CHUNK = 100


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

    def __init__(
        self,
        name: str,
        client: InterruptibleClient,
        token: int,
        loaded: dict[str, int],
        path_of: Callable[[str], str],
        watcher: Callable[[Any], None],
        put: Callable[[Any], None],
        hook: Callable[[Sequence[str]], None] | None = None,
        chunk: int | None = None,
    ) -> None:
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
            chunk = ids[i : i + self._chunk]
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


def get_sequential(
    client: KazooClient | InterruptibleClient, paths: Sequence[str], watch: Callable[[str], Any] | None = None
) -> list[Any]:
    """One synchronous round trip per znode: the baseline the pipelined load is measured against."""
    out: list[Any] = []
    for p in paths:
        try:
            out.append(client.get(p, watch=watch(p) if watch else None))
        except NoNodeError:
            out.append(None)
    return out


@dataclass(frozen=True)
class _Reads:
    """The reads of one load method: ``fetch`` arms a watch on each znode it reads, ``bulk`` and
    ``bulk_children`` arm none (multiRead requests; under the other methods, ``fetch`` without a watch)."""

    fetch: Callable[..., list[Any]]
    bulk: Callable[..., list[Any]]
    bulk_children: Callable[..., list[Any]]
    multiread: bool

    @classmethod
    def of(cls, method: LoadMethod) -> _Reads:
        fetch = get_sequential if method == "sequential" else get_many
        if method == "multiread":
            return cls(fetch, multi_read, multi_children, True)
        return cls(fetch, fetch, children_many, False)


@dataclass(frozen=True)
class ClusterRead:
    """What the load read of the cluster, raw: each znode's ``(data, stat)``, None where it was gone."""

    brokers: list[tuple[str, Any]]  # broker id, its registration
    tasks: list[tuple[str, str, Any]]  # task id, its path, its spec
    arm_later: bool  # the specs were read without their watch: the background armer arms them
    deleting: list[str]
    settings: SettingsRead


@dataclass(frozen=True)
class GroupsRead:
    """What the load read of the groups the context names, raw."""

    names: list[str]
    states: list[Any]  # per name
    members: list[tuple[str, str, Any]]  # group, member, its join request
    assignments: list[tuple[str, str, Any]]  # group, member, its assignment


@dataclass(frozen=True)
class GroupsDecoded:
    """Each group's state (None: absent or garbage, rebuilt) and its members' assignments as decoded."""

    states: dict[str, GroupStateInfo | None]
    assignments: dict[str, dict[str, Assignment]]


class LoadHost(Host, Protocol):
    """The controller as the failover load sees it: a ``Host`` that takes the loaded context."""

    def install(self, ctx: ControllerContext) -> None:
        """The load's context becomes the controller's (before the groups start: they write through it)."""
        ...


class FailoverLoad:
    """Loading the context on activation or reload, and the background armer of the tasks' watches."""

    def __init__(
        self,
        host: LoadHost,
        zk: InterruptibleClient,
        layout: ZkLayout,
        metrics: ControllerMetrics,
        controller_id: str,
        method: LoadMethod,
        brokers: BrokerTracker,
        tasks: TaskTracker,
        groups: GroupDriver,
        operations: OperatorSettings,
    ) -> None:
        self._host = host
        self._zk = zk
        self._layout = layout
        self._metrics = metrics
        self._id = controller_id
        self._method = method
        self._brokers = brokers
        self._tasks = tasks
        self._groups = groups
        self._operations = operations
        self.watch_armer: TaskWatchArmer | None = None  # arms the tasks' watches after a multiRead load
        # test hook, called on the watch armer's thread before each chunk of tasks whose watches it arms
        self.before_arming: Callable[[Sequence[str]], None] | None = None
        self.last_load_s: float | None = None

    def load(self) -> None:
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
        self.stop_watch_armer()
        started = time.monotonic()
        reads = _Reads.of(self._method)
        ctx = ControllerContext()
        cluster = self._read_cluster(reads)
        unwatched = self._decode_cluster(ctx, cluster)
        groups = self._read_groups(reads, ctx)
        decoded = self._decode_groups(ctx, groups)
        self._install(ctx)
        to_answer = self._groups.check_loaded_reports(decoded.states, decoded.assignments)
        for g, members in self._groups.stand_in_refused(decoded.states, decoded.assignments).items():
            to_answer.setdefault(g, []).extend(members)
        load_s = time.monotonic() - started
        self._start_groups(ctx, groups.names, decoded)
        for g, members in sorted(to_answer.items()):
            self._groups.answer_refused(g, members)
        self._tasks.write_invalid_statuses(ctx.invalid_tasks)
        log.info(
            "controller %s loaded %d brokers, %d tasks, %d groups in %.3fs",
            self._id,
            len(ctx.brokers),
            len(ctx.tasks),
            len(groups.names),
            load_s,
        )
        self.last_load_s = load_s
        self._arm(unwatched)

    # ---- read -------------------------------------------------------------------------------------
    def _read_cluster(self, reads: _Reads) -> ClusterRead:
        """Brokers (with their watches), tasks (the recursive watch of ``/tasks`` first: armed before the
        read, it misses nothing after it; else a children watch per bucket and a data watch per task, now or
        by the armer), the deletions requested and the operators' settings."""
        zk, lay = self._zk, self._layout
        ids = self._legal(lay.broker_ids, zk.get_children(lay.broker_ids, watch=self._host.watch(ev.BrokerChange)))
        self._sweep_intervals()
        brokers = list(zip(ids, reads.fetch(zk, [lay.broker(b) for b in ids], watch=self._brokers.broker_watch)))
        tree = self._tasks.watch_tree()
        listed = list_task_paths(zk, lay, watch=None if tree else self._host.bucket_watch(ev.TaskChange))
        task_paths = [p for _, p in listed]
        if reads.multiread:
            task_data = multi_read(zk, task_paths)
        else:
            task_data = reads.fetch(zk, task_paths, watch=None if tree else self._tasks.task_watch)
        tasks = [(t, path, res) for (t, path), res in zip(listed, task_data)]
        deleting = self._legal(
            lay.admin_delete_tasks, zk.get_children(lay.admin_delete_tasks, watch=self._tasks.deletion_watcher())
        )
        return ClusterRead(brokers, tasks, reads.multiread and not tree, deleting, self._operations.read())

    def _read_groups(self, reads: _Reads, ctx: ControllerContext) -> GroupsRead:
        """Every group listed under ``/groups`` or named by a task: its state, its members (with their
        watches) and its assignments."""
        zk, lay = self._zk, self._layout
        names = set(self._legal(lay.groups, zk.get_children(lay.groups, watch=self._host.watch(ev.GroupsChange))))
        names |= {s.group for s in ctx.tasks.values()}
        ordered = sorted(names)
        for g in ordered:
            self._groups.ensure_paths(g)
        states = reads.bulk(zk, [lay.group_state(g) for g in ordered])
        member_parents = [lay.group_members(g) for g in ordered]
        assignment_parents = [lay.group_assignments(g) for g in ordered]
        member_lists = [
            self._legal(p, ms)
            for p, ms in zip(member_parents, children_many(zk, member_parents, watch=self._groups.members_watch))
        ]
        assignment_lists = [
            self._legal(p, ms) for p, ms in zip(assignment_parents, reads.bulk_children(zk, assignment_parents))
        ]
        member_paths = [(g, m) for g, ms in zip(ordered, member_lists) for m in (ms or [])]
        member_data = reads.fetch(
            zk, [lay.group_member(g, m) for g, m in member_paths], watch=self._groups.member_watch
        )
        assignment_paths = [(g, m) for g, ms in zip(ordered, assignment_lists) for m in (ms or [])]
        assignment_data = reads.bulk(zk, [lay.group_assignment(g, m) for g, m in assignment_paths])
        return GroupsRead(
            ordered,
            states,
            [(g, m, res) for (g, m), res in zip(member_paths, member_data)],
            [(g, m, res) for (g, m), res in zip(assignment_paths, assignment_data)],
        )

    def _sweep_intervals(self) -> None:
        """The controller reads nothing under ``/intervals`` but sweeps a name there that is not ours."""
        try:
            self._legal(self._layout.intervals, self._zk.get_children(self._layout.intervals))
        except (NoNodeError, NoAuthError):
            pass  # nothing to sweep, or a root secured by an earlier release: not this load's business

    def _legal(self, parent: str, names: Sequence[str] | None) -> list[str]:
        """The legal children of ``parent``: an illegal name is logged, swept, and never stops the load."""
        return legal_children(self._host, self._layout, parent, names)

    # ---- decode -----------------------------------------------------------------------------------
    def _decode_cluster(self, ctx: ControllerContext, read: ClusterRead) -> dict[str, int]:
        """Fill the context's brokers, tasks, deletions and settings; returns the tasks whose watch is still
        to arm, with the mzxid the load read."""
        lay = self._layout
        for b, res in read.brokers:
            if res is not None:
                ctx.brokers[b] = broker_record(lay.broker(b), res)
        unwatched: dict[str, int] = {}
        for t, path, res in read.tasks:
            if res is not None:
                record_task(ctx, t, res[0], path)
                if read.arm_later:
                    unwatched[t] = res[1].mzxid
        ctx.deleting = set(read.deleting)
        self._operations.decode(ctx, read.settings)
        return unwatched

    def _decode_groups(self, ctx: ControllerContext, read: GroupsRead) -> GroupsDecoded:
        """Members into the context; states and assignments for the coordinators. Each znode that does not
        decode is logged and left out: one group's garbage never stops the activation."""
        lay = self._layout
        for g in read.names:
            ctx.members[g] = {}
        for g, m, res in read.members:
            if res is not None:
                record_member(ctx, g, m, res[0], res[1], lay.group_member(g, m))
        assignments: dict[str, dict[str, Assignment]] = {g: {} for g in read.names}
        for g, m, res in read.assignments:
            if res is None:
                continue
            path = lay.group_assignment(g, m)
            ctx.known_paths.add(path)
            try:
                assignments[g][m] = codecs.decode(Assignment, res[0], path)
            except PayloadError as exc:
                log.warning("ignoring %s", exc)
        states: dict[str, GroupStateInfo | None] = {}
        for g, state_res in zip(read.names, read.states):
            states[g] = None
            if state_res is not None:
                ctx.known_paths.add(lay.group_state(g))
                try:
                    states[g] = codecs.decode(GroupStateInfo, state_res[0], lay.group_state(g))
                except PayloadError as exc:
                    log.warning("group %s: %s; rebuilding it", g, exc)
        return GroupsDecoded(states, assignments)

    # ---- build ------------------------------------------------------------------------------------
    def _install(self, ctx: ControllerContext) -> None:
        self._host.install(ctx)
        self._metrics.maintenance.set(1 if ctx.maintenance.on else 0)
        self._metrics.brokers.set(len(ctx.brokers))
        self._metrics.tasks.set(len(ctx.tasks))
        self._metrics.invalid_tasks.set(len(ctx.invalid_tasks))

    def _start_groups(self, ctx: ControllerContext, names: list[str], decoded: GroupsDecoded) -> None:
        """A coordinator per group, resumed from what was read (or rebuilt), its first decisions written."""
        for g in names:
            coord = self._groups.new_coordinator(g)
            try:
                self._host.apply(
                    g,
                    coord.load(
                        decoded.states[g],
                        placeable(ctx.members[g], ctx.unready_brokers()),
                        ctx.group_tasks(g),
                        decoded.assignments[g],
                    ),
                )
            except PayloadError as exc:  # one group that cannot be written must not stop the activation
                log.error("group %s cannot be scheduled: %s", g, exc)

    # ---- arm --------------------------------------------------------------------------------------
    def _arm(self, unwatched: dict[str, int]) -> None:
        """Pending admin requests, and statuses left behind by tasks deleted before, are looked at; the
        tasks read without their watch get it in the background, off the critical path (the context is
        loaded, the groups are running)."""
        token = self._host.token
        for make in (ev.Rebalance, ev.ControlledShutdown, ev.Reassign, ev.TaskDeletion, ev.StatusesChange):
            self._host.put(make(token))
        if unwatched:
            lay = self._layout
            self.watch_armer = TaskWatchArmer(
                f"controller-{self._id}-watch-armer",
                self._zk,
                token,
                unwatched,
                lay.task,
                self._tasks.task_watch(lay.tasks),
                self._host.put,
                hook=self.before_arming,
            )
            self.watch_armer.start()

    def stop_watch_armer(self) -> None:
        """The activation the armer works for is over (resign, reload): it stops between two chunks; its
        watches and events carry the old token and are dropped."""
        if self.watch_armer is not None:
            self.watch_armer.stop()
