"""The controller daemon: election with epoch fencing, one event thread, and the kazoo layer that feeds
the sans-IO group coordinators and carries out their decisions.

Threads: the kazoo threads only enqueue events (watch callbacks, connection listener); the event thread
(``controller-<id>-events``) is the only one that reads or changes controller state; the timer thread
(``controller-<id>-timer``) only enqueues ``Tick`` at protocol deadlines.

Watches carry the *activation token* current when they were armed; after a resign the token moves on,
so callbacks armed by an earlier activation are dropped instead of double-arming watches.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    KazooException,
    NoNodeError,
    NodeExistsError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import EventType, KazooState

from controller import codecs, events as ev, zkio
from controller.admin import ensure_layout
from controller.clock import Clock, SystemClock
from controller.codecs import (
    Assignment,
    BrokerInfo,
    ControllerInfo,
    GroupStateInfo,
    JoinRequest,
    PayloadError,
    TaskDescriptor,
)
from controller.event_thread import ControllerEventThread
from controller.group import (
    DeleteGenerationsBelow,
    GroupConfig,
    GroupCoordinator,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.layout import InvalidName, ZkLayout
from controller.metrics import ControllerMetrics, MetricsServer
from controller.taskspec import TaskSpec, decode_task
from controller.zkclient import ZkSettings, make_client
from controller.zkio import (Fenced, FencedWriter, InterruptibleClient, WriteFailed, children_many, exists_many, get_many,
                            multi_children, multi_read)

log = logging.getLogger(__name__)

_TRANSIENT = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)

# Tasks whose owner has let go are deleted in batches: once this many are ready, once none is still owned,
# or once the first ready one has waited this long (the timer enforces it), whichever comes first.
DELETE_BATCH_TASKS = 500
DELETE_LINGER_S = 0.5

# How the failover load reads the cluster (see Controller._load): "multiread" reads the bulk without watches
# in multiRead requests and arms the tasks' watches in the background; "pipelined" and "sequential" read
# every task with its watch, one kazoo request per znode (the contenders of benchmark B3).
LoadMethod = Literal["multiread", "pipelined", "sequential"]
LOAD_METHODS: tuple[str, ...] = ("multiread", "pipelined", "sequential")
# Tasks whose data watch the background armer sets per round (pipelined ``exists``, then one comparison).
ARM_WATCH_CHUNK = 100


@dataclass(frozen=True)
class ControllerConfig:
    controller_id: str
    settings: ZkSettings
    group: GroupConfig = field(default_factory=GroupConfig)
    metrics_port: int | None = None
    host: str = field(default_factory=socket.gethostname)
    load: LoadMethod = "multiread"

    def __post_init__(self) -> None:
        if self.load not in LOAD_METHODS:
            raise ValueError(f"unknown load method {self.load!r} (one of {', '.join(LOAD_METHODS)})")


@dataclass
class BrokerRecord:
    epoch: int  # the broker znode's czxid: a bounced broker is a new one
    info: BrokerInfo | None
    error: str | None = None


@dataclass(frozen=True)
class BrokerDelta:
    """What one look at ``/brokers/ids`` found: new ids, ids gone, and ids re-registered by a new session
    (same id, new czxid: the old incarnation is gone, whatever it held with it)."""

    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    bounced: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.bounced)


@dataclass
class ControllerContext:
    """What the active controller knows, loaded from ZooKeeper on failover and kept current by events."""

    brokers: dict[str, BrokerRecord] = field(default_factory=dict)
    tasks: dict[str, TaskSpec] = field(default_factory=dict)
    invalid_tasks: dict[str, str] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    deletable: dict[str, float] = field(default_factory=dict)  # requested, owner gone -> since (clock time)
    groups: dict[str, GroupCoordinator] = field(default_factory=dict)
    members: dict[str, dict[str, JoinRequest]] = field(default_factory=dict)
    invalid_members: dict[tuple[str, str], str] = field(default_factory=dict)
    member_sessions: dict[tuple[str, str], int] = field(default_factory=dict)  # session owning each join request
    shutdown_requests: set[str] = field(default_factory=set)
    known_paths: set[str] = field(default_factory=set)
    # per group, the join results this activation wrote and the proposals it watched (path -> generation),
    # deleted once a later generation is Stable; groups whose older generations were listed once (leftovers)
    generation_paths: dict[str, dict[str, int]] = field(default_factory=dict)
    swept_generations: set[str] = field(default_factory=set)
    broker_changes: collections.deque[BrokerDelta] = field(default_factory=lambda: collections.deque(maxlen=1000))

    def group_tasks(self, group: str) -> dict[str, TaskDescriptor]:
        return {
            t: spec.descriptor()
            for t, spec in self.tasks.items()
            if spec.group == group and spec.state == "RUNNING" and t not in self.deleting
        }


class _Timer(threading.Thread):
    """Enqueues a Tick when the earliest protocol deadline passes (bounded waits, named thread)."""

    def __init__(self, name: str, fire: Callable[[], None], clock: Clock) -> None:
        super().__init__(name=name, daemon=True)
        self._fire = fire
        self._clock = clock
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._stopped = False

    def schedule(self, deadline: float | None) -> None:
        with self._cond:
            self._deadline = deadline
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self.join(5)

    def run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._clock.now()
                if self._deadline is not None and now >= self._deadline:
                    self._deadline = None
                    fire = True
                else:
                    wait = 1.0 if self._deadline is None else min(1.0, self._deadline - now)
                    self._cond.wait(max(wait, 0.001))
                    fire = False
            if fire:
                self._fire()


class Controller:
    """A controller candidate; the one that wins ``/controller`` is active."""

    def __init__(self, config: ControllerConfig, client: KazooClient | None = None, clock: Clock | None = None) -> None:
        self.config = config
        self.id = config.controller_id
        self.layout = ZkLayout(config.settings.root)
        self.client = client or make_client(config.settings, connect=False)
        self.zk = InterruptibleClient(self.client)  # every ZooKeeper call of the event thread goes through this
        self.clock = clock or SystemClock()
        self.metrics = ControllerMetrics()
        self.thread = ControllerEventThread(self._process, name=f"controller-{self.id}-events", observe=self.metrics.observe,
                                             on_merge=self.metrics.observe_merged)
        self.timer = _Timer(f"controller-{self.id}-timer", lambda: self.put(ev.Tick()), self.clock)
        self.token = 0
        self.active = False
        self.epoch: int | None = None
        self.writer: FencedWriter | None = None
        self.ctx: ControllerContext | None = None
        self.connected = True
        self.needs_reload = False
        self.held: list[Any] = []
        self.metrics_server: MetricsServer | None = None
        self.before_write: Callable[[], None] | None = None  # test hook: an injected stall
        # test hook, called on the watch armer's thread before each chunk of tasks whose watches it arms
        self.before_arming: Callable[[Sequence[str]], None] | None = None
        self.fenced_writes = 0
        self.became_active_at: float | None = None
        self.last_load_s: float | None = None
        self._stopping = False
        self._retry_timer: threading.Timer | None = None
        self._deletion_watch: _DeletionWatch | None = None  # owner watches of tasks being deleted, coalesced
        self._task_watcher: _TaskWatch | None = None  # the one data watcher of every task znode, per activation
        self.watch_armer: _TaskWatchArmer | None = None  # arms the tasks' watches after a multiRead load

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "Controller":
        if not self.client.connected:
            self.client.start(timeout=30)
        self.client.add_listener(self._listener)
        ensure_layout(self.client, self.layout)
        if self.config.metrics_port is not None:
            self.metrics_server = MetricsServer(self.metrics.registry, self.config.metrics_port, name=f"controller-{self.id}-metrics")
        self.thread.start()
        self.timer.start()
        self.put(ev.Startup())
        return self

    def stop(self) -> None:
        self._stopping = True
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        if self.thread.ident is not None:
            self.thread.shutdown()
        if self.watch_armer is not None:
            self.watch_armer.stop(join_s=5)
        if self.timer.ident is not None:
            self.timer.stop()
        if self.metrics_server:
            self.metrics_server.close()
        self.client.remove_listener(self._listener)
        self.client.stop()
        self.client.close()

    def put(self, event: Any) -> None:
        self.thread.put(event)
        self.metrics.queue_size.set(self.thread.queue_size())

    def _listener(self, state: KazooState) -> None:
        # kazoo's thread: only enqueue
        if state == KazooState.SUSPENDED:
            self.put(ev.Suspended())
        elif state == KazooState.CONNECTED:
            self.put(ev.Reconnected())
        elif state == KazooState.LOST:
            self.put(ev.Expire())

    def _watch(self, make: Callable[[int], Any]) -> Callable[[Any], None]:
        token = self.token
        return lambda _event: self.put(make(token))

    def _current(self, token: int) -> bool:
        return self.active and token == self.token

    # ---- event processing -------------------------------------------------------------------------
    def _process(self, event: Any) -> None:
        if isinstance(event, (ev.Suspended, ev.Reconnected, ev.Expire, ev.Shutdown)):
            event.process(self)
            return
        if not self.connected:
            self.held.append(event)  # SUSPENDED: hold until reconnected (or dropped if the session is lost)
            return
        try:
            if self.active and self.needs_reload and self.client.connected:
                self._reload()  # an earlier event was cut short by ZooKeeper: start again from what it holds
            event.process(self)
        except Fenced as exc:
            self.fenced_writes += 1
            self.metrics.fenced.inc()
            log.warning("controller %s (epoch %s) fenced: %s", self.id, self.epoch, exc)
            self.resign("fenced by a newer controller")
            self.elect()
        except _TRANSIENT as exc:
            log.info("controller %s: ZooKeeper unavailable while processing %s (%s)", self.id, type(event).__name__, type(exc).__name__)
            if self.active:
                self.needs_reload = True
            else:
                if not self._stopping:
                    self._retry_later()
        except WriteFailed as exc:
            log.warning("controller %s: write failed (%s); reloading context", self.id, exc)
            self.needs_reload = True
            if self.connected and self.active:
                self._reload()
        finally:
            self._reschedule()

    def _reschedule(self) -> None:
        if not self.active or self.ctx is None or not self.connected:
            self.timer.schedule(None)  # no deadlines fire while suspended: the Tick would only be held
            return
        deadlines = [d for d in (c.next_deadline() for c in self.ctx.groups.values()) if d is not None]
        if self.ctx.deletable:
            deadlines.append(self._deletion_deadline())
        self.timer.schedule(min(deadlines) if deadlines else None)
        self.metrics.queue_size.set(self.thread.queue_size())

    # ---- election ---------------------------------------------------------------------------------
    def elect(self) -> None:
        """Race for ``/controller``; on winning, bump the epoch conditionally and load the context."""
        if self.active or self._stopping:
            return
        try:
            try:
                self.zk.create(self.layout.controller_epoch, codecs.encode_epoch(0), makepath=True)
            except NodeExistsError:
                pass
            data, stat = self.zk.get(self.layout.controller_epoch)
            # Every election bumps the epoch and the znode's version together, so the version is never
            # below the last epoch: if the text was overwritten (garbage, or a lower number), continue
            # above the version instead of refusing to run (no controller at all) or going backwards.
            try:
                epoch = max(codecs.decode_epoch(data, self.layout.controller_epoch), stat.version)
            except PayloadError as exc:
                log.error("%s; continuing from its version %d", exc, stat.version)
                epoch = stat.version
            info = ControllerInfo(controller_id=self.id, epoch=epoch + 1, host=self.config.host, since=time.time())
            try:
                self.zk.create(self.layout.controller, codecs.encode(info), ephemeral=True)
            except NodeExistsError:
                held = self.zk.exists(self.layout.controller, watch=self._candidate_watch)
                if held is not None and held.ephemeralOwner == self.zk.client_id[0]:
                    # ours, from an election ZooKeeper cut short (the epoch bump's answer was lost): nobody
                    # else can win while it exists, so remove it and run again
                    log.warning("controller %s: removing /controller left by its own interrupted election", self.id)
                    try:
                        self.zk.delete(self.layout.controller, version=held.version)
                    except (NoNodeError, BadVersionError):
                        pass
                    self.put(ev.Reelect())
                elif held is None:
                    self.put(ev.Reelect())
                return
            try:
                new_stat = self.zk.set(self.layout.controller_epoch, codecs.encode_epoch(epoch + 1), version=stat.version)
            except BadVersionError:
                log.warning("controller %s: epoch moved while electing; retrying", self.id)
                self.zk.delete(self.layout.controller)
                self.put(ev.Reelect())
                return
            self._activate(epoch + 1, new_stat.version)
        except _TRANSIENT:
            if not self._stopping:
                self._retry_later()

    def _retry_later(self, event: Any = None) -> None:
        # re-elect (or re-check, ``event``) once ZooKeeper is back: Reconnected does it; also retry on a timer
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        event = event if event is not None else ev.Reelect()
        t = threading.Timer(0.5, lambda: self.put(event))
        t.name = f"controller-{self.id}-retry"
        t.daemon = True
        self._retry_timer = t
        t.start()

    def _candidate_watch(self, _event: Any) -> None:
        self.put(ev.ControllerChange(-1))

    def on_controller_change(self, token: int) -> None:
        if not self.active:
            self.elect()
            return
        if not self._still_controller():
            self.resign("lost /controller")
            self.elect()

    def _still_controller(self) -> bool:
        try:
            data, stat = self.zk.get(self.layout.controller, watch=self._watch(ev.ControllerChange))
            info = codecs.decode(ControllerInfo, data, self.layout.controller)
        except NoNodeError:
            return False
        except PayloadError as exc:
            log.error("%s", exc)
            return False
        return (info.controller_id == self.id and info.epoch == self.epoch
                and stat.ephemeralOwner == self.zk.client_id[0])

    def _activate(self, epoch: int, epoch_zk_version: int) -> None:
        self.token += 1
        self.active = True
        self.epoch = epoch
        self.writer = FencedWriter(self.zk, self.layout.controller_epoch, epoch_zk_version)
        self.metrics.epoch.set(epoch)
        self.metrics.active.set(1)
        self.became_active_at = time.monotonic()
        log.info("controller %s is active at epoch %d", self.id, epoch)
        self.zk.exists(self.layout.controller, watch=self._watch(ev.ControllerChange))
        self._load()

    def resign(self, reason: str) -> None:
        if not self.active:
            return
        log.info("controller %s resigns (epoch %s): %s", self.id, self.epoch, reason)
        if self.ctx is not None:
            for coord in self.ctx.groups.values():
                coord.shutdown()
        self.active = False
        self.token += 1
        self._stop_watch_armer()
        self.ctx = None
        self.writer = None
        self.held.clear()
        self.metrics.active.set(0)
        self.metrics.brokers.set(0)
        self.metrics.tasks.set(0)
        self.metrics.invalid_tasks.set(0)
        try:
            if self.zk.connected:
                stat = self.zk.exists(self.layout.controller)
                if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.delete(self.layout.controller, version=stat.version)
        except (KazooException, *_TRANSIENT):
            pass

    # ---- connection states ------------------------------------------------------------------------
    def on_suspended(self) -> None:
        self.connected = False

    def on_reconnected(self) -> None:
        if not self.active:
            self.connected = True
            self.held.clear()
            self.elect()
            return
        reloading = False
        try:
            still = self._still_controller()
            if still and self.needs_reload:
                reloading = True
                self._reload()
        except _TRANSIENT:
            # ZooKeeper went away again before we could check: keep holding events and check again on
            # the next CONNECTED, or on this retry if the connection is back without one
            self.needs_reload = self.needs_reload or reloading
            self._retry_later(ev.Reconnected())
            return
        except Exception:
            if not reloading:
                raise
            # a reload that failed for another reason must not leave the held events held for good:
            # resume, and _process reloads again before the next event
            log.exception("controller %s: reload after reconnecting failed; retrying before the next event", self.id)
            self.needs_reload = True
        self.connected = True
        if not still:
            self.resign("reconnected without /controller at our epoch")
            self.elect()
            return
        held, self.held = self.held, []
        self.thread.put_front(ev.coalesce(held))

    def on_expire(self) -> None:
        self.connected = False
        self.resign("ZooKeeper session expired")

    # ---- loading ----------------------------------------------------------------------------------
    def _reload(self) -> None:
        for coord in (self.ctx.groups.values() if self.ctx else ()):
            coord.shutdown()
        self.token += 1
        self.needs_reload = False
        self._load()

    def _load(self) -> None:
        """Read the whole cluster state and arm watches.

        ``load="multiread"`` (the default): task specs, group states and assignments are read without
        watches in multiRead requests (a dozen requests for 10,000 tasks instead of one kazoo request each,
        whose fixed cost bounded the failover; see ``zkio.multi_read``), so the context is in place and the
        groups are loaded at once; then ``_TaskWatchArmer`` arms each task's data watch in the background and
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
        fetch = _get_sequential if method == "sequential" else get_many  # reads that arm a watch
        bulk = multi_read if method == "multiread" else fetch  # reads that arm none
        bulk_children = multi_children if method == "multiread" else children_many
        # brokers
        ids = c.get_children(lay.broker_ids, watch=w(ev.BrokerChange))
        for b, res in zip(ids, fetch(c, [lay.broker(b) for b in ids],
                                     watch=lambda p: self._watch(lambda t, b=p.rsplit('/', 1)[1]: ev.BrokerModification(t, b)))):
            if res is not None:
                ctx.brokers[b] = self._broker_record(lay.broker(b), res)
        # tasks
        tids = [t for t in c.get_children(lay.tasks, watch=w(ev.TaskChange))]
        task_paths = [lay.task(t) for t in tids]
        unwatched: dict[str, int] = {}  # task -> mzxid read, for the tasks whose watch is still to arm
        if method == "multiread":
            task_data = multi_read(c, task_paths)
        else:
            task_data = fetch(c, task_paths, watch=self._task_watch)
        for t, res in zip(tids, task_data):
            if res is not None:
                self._set_task(ctx, t, res[0])
                if method == "multiread":
                    unwatched[t] = res[1].mzxid
        ctx.deleting = set(c.get_children(lay.admin_delete_tasks, watch=self._deletion_watcher()))
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
            self._apply(g, coord.load(info, ctx.members[g], ctx.group_tasks(g), assignments[g]))
        self._write_invalid_statuses(ctx.invalid_tasks)
        log.info("controller %s loaded %d brokers, %d tasks, %d groups in %.3fs", self.id, len(ctx.brokers),
                 len(ctx.tasks), len(names), load_s)
        self.last_load_s = load_s
        # pending admin requests, and statuses left behind by tasks deleted before
        for make in (ev.Rebalance, ev.ControlledShutdown, ev.Reassign, ev.TaskDeletion, ev.StatusesChange):
            self.put(make(self.token))
        if unwatched:  # off the critical path: the context is loaded, the groups are running
            self.watch_armer = _TaskWatchArmer(
                f"controller-{self.id}-watch-armer", self.zk, self.token, unwatched, lay.task, self._task_watch(lay.tasks),
                self.put, hook=self.before_arming)
            self.watch_armer.start()

    def _stop_watch_armer(self) -> None:
        """The activation the armer works for is over (resign, reload): it stops between two chunks; its
        watches and events carry the old token and are dropped."""
        if self.watch_armer is not None:
            self.watch_armer.stop()

    def _ensure_group_paths(self, g: str) -> None:
        lay = self.layout
        for p in (lay.group_members(g), lay.group_joins(g), lay.group_syncs(g), lay.group_assignments(g)):
            self.zk.ensure_path(p)

    def _new_coordinator(self, g: str) -> GroupCoordinator:
        assert self.ctx is not None and self.epoch is not None
        coord = GroupCoordinator(group=g, controller_epoch=self.epoch, clock=self.clock, config=self.config.group)
        self.ctx.groups[g] = coord
        self.ctx.members.setdefault(g, {})
        return coord

    def _coordinator(self, g: str) -> GroupCoordinator:
        assert self.ctx is not None
        coord = self.ctx.groups.get(g)
        if coord is None:
            self._ensure_group_paths(g)
            coord = self._new_coordinator(g)
            coord.on_tasks(self.ctx.group_tasks(g))
            self.zk.get_children(self.layout.group_members(g), watch=self._watch(lambda t: ev.MembersChange(t, g)))
            self.put(ev.MembersChange(self.token, g))
        return coord

    def _broker_record(self, path: str, res: tuple[bytes, Any]) -> BrokerRecord:
        data, stat = res
        try:
            return BrokerRecord(stat.czxid, codecs.decode(BrokerInfo, data, path))
        except PayloadError as exc:
            log.warning("broker %s", exc)
            return BrokerRecord(stat.czxid, None, str(exc))

    def _task_watch(self, path: str) -> Callable[[Any], None]:
        """The activation's one watcher of task znodes (whatever the path). kazoo keeps a set of watchers per
        path, so a task armed twice (by the background armer and by a re-read) still fires once."""
        if self._task_watcher is None or self._task_watcher.token != self.token:
            self._task_watcher = _TaskWatch(self.token, self.put)
        return self._task_watcher

    def _member_watch(self, path: str) -> Callable[[Any], None]:
        parts = path.split("/")
        g, m = parts[-3], parts[-1]
        return self._watch(lambda t: ev.MemberChange(t, g, m))

    def _set_task(self, ctx: ControllerContext, t: str, data: bytes) -> None:
        path = self.layout.task(t)
        try:
            ctx.tasks[t] = decode_task(data, path)
            ctx.invalid_tasks.pop(t, None)
        except PayloadError as exc:
            log.warning("task %s is invalid and will not run: %s", t, exc.reason)
            ctx.tasks.pop(t, None)
            ctx.invalid_tasks[t] = str(exc)

    def _set_member(self, ctx: ControllerContext, g: str, m: str, data: bytes, stat: Any = None) -> bool:
        """Record a member's join request; True if it comes from a new session (the member restarted,
        even if its request is byte-identical to the old one: the coordinator must see it leave and join)."""
        path = self.layout.group_member(g, m)
        bounced = False
        if stat is not None:
            previous = ctx.member_sessions.get((g, m))
            bounced = previous is not None and previous != stat.ephemeralOwner
            ctx.member_sessions[(g, m)] = stat.ephemeralOwner
        try:
            req = codecs.decode(JoinRequest, data, path)
            if req.member_id != m:
                raise PayloadError(path, f"member_id {req.member_id!r} does not match the znode name")
            ctx.members.setdefault(g, {})[m] = req
            ctx.invalid_members.pop((g, m), None)
        except PayloadError as exc:
            log.warning("ignoring member: %s", exc)
            ctx.members.setdefault(g, {}).pop(m, None)
            ctx.invalid_members[(g, m)] = str(exc)
        return bounced

    def _write_invalid_statuses(self, invalid: dict[str, str]) -> None:
        if not invalid or self.writer is None:
            return
        now = time.time()
        items = [(self.layout.status(t), codecs.encode(codecs.TaskStatus(
            broker="controller", state="FAILED", generation=0, updated=now, error=f"invalid task spec: {reason}")))
            for t, reason in sorted(invalid.items())]
        self._write(lambda: self.writer.upsert(items, self.ctx.known_paths if self.ctx else None))

    # ---- carrying out decisions -------------------------------------------------------------------
    def _write(self, fn: Callable[[], Any]) -> Any:
        if self.before_write is not None:
            self.before_write()
        return fn()

    def _apply(self, g: str, decisions: list[Any]) -> None:
        """One event's decisions for a group become one ordered, fenced, batched write.

        What the members wait for (assignments, join result, group state) goes out at once, with no look-up
        first (see ``_write_items``). The watch on the leader's proposal is armed by a request sent just ahead
        of that write, so it costs no round trip of its own. Old generations' join results and proposals
        known to exist are deleted in the same multi as the assignments that make them obsolete; only
        housekeeping that needs a look-up runs after the write (``_cleanup_generations``).
        """
        if not decisions or self.writer is None or self.ctx is None:
            return
        lay = self.layout
        items: list[tuple[str, bytes]] = []
        watches: list[int] = []
        cleanup_below: int | None = None
        generations = self.ctx.generation_paths.setdefault(g, {})
        for d in decisions:
            if isinstance(d, WriteAssignments):
                items += [(lay.group_assignment(g, m), codecs.encode(a)) for m, a in d.assignments]
            elif isinstance(d, WriteJoinResult):
                items.append((lay.group_join(g, d.result.generation), codecs.encode(d.result)))
                generations[lay.group_join(g, d.result.generation)] = d.result.generation
            elif isinstance(d, WriteGroupState):
                items.append((lay.group_state(g), codecs.encode(d.info)))
                if d.info.state == "PreparingRebalance":
                    self.metrics.rebalances.labels(g).inc()
            elif isinstance(d, WatchSync):
                watches.append(d.generation)
                generations[lay.group_sync(g, d.generation)] = d.generation
            elif isinstance(d, DeleteGenerationsBelow):
                cleanup_below = d.generation
                # emitted with the assignments of a generation whose proposal was just read: it exists
                self.ctx.known_paths.add(lay.group_sync(g, d.generation))
        deletes: list[str] = []
        lookup: list[str] = []
        if cleanup_below is not None:
            old = sorted(p for p, gen in generations.items() if gen < cleanup_below)
            for p in old:
                del generations[p]
                (deletes if p in self.ctx.known_paths else lookup).append(p)
        armed = [(gen, self._arm_sync_watch(g, gen)) for gen in watches]
        before = self.writer.requests
        self._write(lambda: self._write_items(items, deletes))
        self.metrics.zk_writes.inc(self.writer.requests - before)
        for gen, pending in armed:
            if pending.get() is not None:
                self.put(ev.SyncProposalReady(self.token, g, gen))
        if cleanup_below is not None:
            self._cleanup_generations(g, cleanup_below, lookup)

    def _write_items(self, items: list[tuple[str, bytes]], deletes: list[str]) -> None:
        """Write ``(path, data)`` items and delete ``deletes`` in fenced multis, without looking anything up
        first: a path in ``known_paths`` is set, any other is created. The controller's unknown paths are
        new ones (each generation's join result, a new member's assignment), so ``upsert``'s pipelined
        ``exists`` before every write that creates one was a round trip on the way to the members. Should
        ZooKeeper disagree (a znode created or deleted behind the controller's back), the items are written
        again through ``upsert``, which looks them up, and the deletes go through ``delete_if_present``.
        A rewrite of an item already written is harmless: the same bytes, the watchers read them again."""
        known = self.ctx.known_paths
        last = {p: d for p, d in items}  # a path written twice in one batch: once, its last value, first place
        items = [(p, last.pop(p)) for p, _ in items if p in last]
        ops: list[Any] = [zkio.SetData(p, d) if p in known else zkio.Create(p, d) for p, d in items]
        ops += [zkio.Delete(p) for p in deletes]
        try:
            self.writer.write(ops)
        except WriteFailed as exc:
            for op, err in exc.failures:
                if isinstance(err, NoNodeError):
                    known.discard(op.path)
                elif isinstance(err, NodeExistsError):
                    known.add(op.path)
            log.info("controller %s: %s; writing again after looking the paths up", self.id, exc)
            self.writer.upsert(items, known)
            if deletes:
                self.writer.delete_if_present(deletes)
        else:
            known.update(p for p, _ in items)
        known.difference_update(deletes)

    def _arm_sync_watch(self, g: str, generation: int) -> Any:
        """Send the ``exists`` that arms the watch on this generation's proposal, without waiting for it."""
        return self.zk.exists_async(self.layout.group_sync(g, generation),
                                    watch=self._watch(lambda t: ev.SyncProposalReady(t, g, generation)))

    def _watch_sync(self, g: str, generation: int) -> None:
        """Watch for the leader's proposal of this generation (and read it now if it is already there)."""
        if self._arm_sync_watch(g, generation).get() is not None:
            self.put(ev.SyncProposalReady(self.token, g, generation))

    def _cleanup_generations(self, g: str, below: int, lookup: list[str]) -> None:
        """Delete what ``_apply`` could not delete blind: proposals of abandoned generations, which may never
        have been written, and, once per group and activation, the join results and proposals below ``below``
        that an earlier controller left behind (two listings, pipelined). One look-up, one multi; nothing
        when there is nothing unknown (the common case: every generation this controller saw completed)."""
        ctx, lay = self.ctx, self.layout
        old = list(lookup)
        listed: set[str] = set()
        if g not in ctx.swept_generations:
            ctx.swept_generations.add(g)
            parents = [(lay.group_joins(g), lay.group_join), (lay.group_syncs(g), lay.group_sync)]
            for (_parent, make), names in zip(parents, children_many(self.zk, [p for p, _ in parents])):
                listed.update(make(g, int(n)) for n in names or () if n.isdigit() and int(n) < below)
            old += sorted(listed - set(old))
        if old and self.writer is not None:
            ctx.known_paths.difference_update(old)
            self._write(lambda: self.writer.delete_if_present(old, present=listed))

    # ---- event handlers ---------------------------------------------------------------------------
    def on_broker_change(self, token: int) -> None:
        """``/brokers/ids`` changed. Like Kafka's BrokerChange, compare every live broker's epoch (czxid)
        with the context's, so that a broker that re-registered under the same id (bounced) is told apart
        from one that joined or left even when its deletion and re-creation were seen as one change."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        ids = sorted(self.zk.get_children(lay.broker_ids, watch=self._watch(ev.BrokerChange)))
        epochs = {b: st.czxid for b, st in zip(ids, exists_many(self.zk, [lay.broker(b) for b in ids])) if st is not None}
        read = sorted(b for b, epoch in epochs.items() if b not in ctx.brokers or ctx.brokers[b].epoch != epoch)
        self._refresh_brokers(read, gone=sorted(ctx.brokers.keys() - epochs.keys()))

    def on_broker_modifications(self, token: int, broker_ids: tuple[str, ...]) -> None:
        """Brokers' znodes changed or went away: a bounce (same id, new czxid) is a new broker."""
        if not self._current(token):
            return
        self._refresh_brokers(sorted(broker_ids), gone=[])

    def _refresh_brokers(self, read: list[str], gone: list[str]) -> None:
        """Re-read ``read`` (pipelined, re-arming their watches), drop ``gone``; record who joined, left
        or bounced."""
        ctx, lay = self.ctx, self.layout
        joined: list[str] = []
        left: list[str] = []
        bounced: list[str] = []
        watch = lambda p: self._watch(lambda t, b=p.rsplit('/', 1)[1]: ev.BrokerModification(t, b))
        gone = list(gone)
        for b, res in zip(read, get_many(self.zk, [lay.broker(b) for b in read], watch=watch)):
            old = ctx.brokers.get(b)
            if res is None:
                gone.append(b)
                continue
            record = self._broker_record(lay.broker(b), res)
            if old is None:
                joined.append(b)
            elif old.epoch != record.epoch:
                bounced.append(b)
            ctx.brokers[b] = record
        for b in gone:
            if ctx.brokers.pop(b, None) is not None:
                left.append(b)
        delta = BrokerDelta(tuple(sorted(joined)), tuple(sorted(left)), tuple(sorted(bounced)))
        self.metrics.brokers.set(len(ctx.brokers))
        if not delta:
            return
        ctx.broker_changes.append(delta)
        log.info("brokers joined %s, left %s, bounced %s", list(delta.joined), list(delta.left), list(delta.bounced))
        for b in delta.left + delta.bounced:
            self._finish_controlled_shutdown(b)  # that incarnation is gone; its request must not stop the next

    def _finish_controlled_shutdown(self, broker_id: str) -> None:
        if broker_id in self.ctx.shutdown_requests:
            self.ctx.shutdown_requests.discard(broker_id)
            self._write(lambda: self.writer.delete_if_present([self.layout.admin_controlled_shutdown_of(broker_id)]))

    def on_task_change(self, token: int) -> None:
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        ids = set(self.zk.get_children(lay.tasks, watch=self._watch(ev.TaskChange)))
        known = ctx.tasks.keys() | ctx.invalid_tasks.keys()
        new_ids = sorted(ids - known)
        touched: set[str] = set()
        for t, res in zip(new_ids, get_many(self.zk, [lay.task(t) for t in new_ids], watch=self._task_watch)):
            if res is not None:
                self._set_task(ctx, t, res[0])
                if t in ctx.tasks:
                    touched.add(ctx.tasks[t].group)
        touched |= self._forget_tasks(sorted(known - ids))
        self._tasks_changed(touched)
        self._write_invalid_statuses({t: ctx.invalid_tasks[t] for t in new_ids if t in ctx.invalid_tasks})

    def _forget_tasks(self, gone: list[str]) -> set[str]:
        """Tasks deleted behind the controller's back: drop them and their statuses; returns their groups."""
        if not gone:
            return set()
        ctx = self.ctx
        groups = {spec.group for t in gone if (spec := ctx.tasks.pop(t, None)) is not None}
        for t in gone:
            ctx.invalid_tasks.pop(t, None)
        self._write(lambda: self.writer.delete_if_present([self.layout.status(t) for t in gone]))
        return groups

    def on_task_config_changes(self, token: int, task_ids: tuple[str, ...]) -> None:
        """Tasks' specs changed (paused, resumed, edited) or were deleted: one pipelined re-read."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        # a task the context does not know was deleted by us (or is new, and TaskChange reads it)
        ids = sorted(t for t in task_ids if t in ctx.tasks or t in ctx.invalid_tasks)
        touched: set[str] = set()
        gone: list[str] = []
        for t, res in zip(ids, get_many(self.zk, [lay.task(t) for t in ids], watch=self._task_watch)):
            if res is None:
                gone.append(t)
                continue
            before = ctx.tasks.get(t)
            self._set_task(ctx, t, res[0])
            after = ctx.tasks.get(t)
            if before != after:
                touched |= {s.group for s in (before, after) if s is not None}
        touched |= self._forget_tasks(gone)
        self._tasks_changed(touched)
        self._write_invalid_statuses({t: ctx.invalid_tasks[t] for t in ids if t in ctx.invalid_tasks})

    def _tasks_changed(self, groups: set[str]) -> None:
        self.metrics.tasks.set(len(self.ctx.tasks))
        self.metrics.invalid_tasks.set(len(self.ctx.invalid_tasks))
        for g in sorted(groups):
            coord = self._coordinator(g)
            self._apply(g, coord.on_tasks(self.ctx.group_tasks(g)))

    def _deletion_watcher(self) -> "_DeletionWatch":
        if self._deletion_watch is None or self._deletion_watch.token != self.token:
            self._deletion_watch = _DeletionWatch(self.token, self.put)
        return self._deletion_watch

    def on_task_deletion(self, token: int) -> None:
        """Delete requested tasks once their owner has let go (revoke first, never under a runner).

        Each requested task's owner is looked up once (pipelined ``exists``, arming a watch); after that
        the watch says when it is released, and only owners that reappeared are looked up again. Tasks
        whose owner is gone are deleted in batches (see ``_flush_deletions``).
        """
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        watch = self._deletion_watcher()
        released, recheck, rescan = watch.take()
        requested = set(self.zk.get_children(lay.admin_delete_tasks, watch=watch))
        newly, withdrawn = requested - ctx.deleting, ctx.deleting - requested
        ctx.deleting = requested
        for t in withdrawn:
            ctx.deletable.pop(t, None)
        self._tasks_changed({ctx.tasks[t].group for t in newly | withdrawn if t in ctx.tasks})
        check = sorted(requested if rescan else (newly | recheck) & requested)
        owners = exists_many(self.zk, [lay.task_owner(t) for t in check], watch=lambda _p: watch)
        now = self.clock.now()
        for t, owner in zip(check, owners):
            if owner is None:
                ctx.deletable.setdefault(t, now)
            else:
                ctx.deletable.pop(t, None)
        for t in (released & requested) - set(check):
            ctx.deletable.setdefault(t, now)
        self._flush_deletions()

    def _deletion_deadline(self) -> float | None:
        return min(self.ctx.deletable.values()) + DELETE_LINGER_S if self.ctx and self.ctx.deletable else None

    def _flush_deletions(self) -> None:
        """Delete the tasks whose owner is gone, with their statuses and requests: a task, its status and
        its request go in the same fenced multi, and the statuses to delete come from one listing."""
        ctx, lay = self.ctx, self.layout
        if not ctx.deletable:
            return
        still_owned = ctx.deleting - ctx.deletable.keys()
        if still_owned and len(ctx.deletable) < DELETE_BATCH_TASKS and self.clock.now() < self._deletion_deadline():
            return  # more releases are on their way: delete them together
        done = sorted(ctx.deletable)
        statuses = set(self.zk.get_children(lay.statuses))
        groups = [[lay.task(t)] + ([lay.status(t)] if t in statuses else []) + [lay.admin_delete_task(t)] for t in done]
        present = {p for t, g in zip(done, groups) for p in g[1:]}  # the listings say so
        present |= {lay.task(t) for t in done if t in ctx.tasks or t in ctx.invalid_tasks}
        blocked = {done[i] for i in self._write(lambda: self.writer.delete_groups(groups, present))}
        for t in done:
            ctx.deletable.pop(t, None)
            if t not in blocked:
                ctx.tasks.pop(t, None)
                ctx.invalid_tasks.pop(t, None)
                ctx.deleting.discard(t)
        if blocked:  # an owner came back meanwhile: wait for it again
            self._deletion_watcher().recheck(blocked)
        self.metrics.tasks.set(len(ctx.tasks))
        self.metrics.invalid_tasks.set(len(ctx.invalid_tasks))
        log.info("deleted %d tasks %s", len(done) - len(blocked), done[:10])

    def on_statuses_change(self, token: int) -> None:
        """Delete statuses of tasks that no longer exist: a worker's status write for a task it was letting
        go of can land after the task and its status were deleted. One listing (re-arming the watch);
        the orphans go in fenced multis."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        names = self.zk.get_children(lay.statuses, watch=self._watch(ev.StatusesChange))
        orphans = []
        for t in names:
            if t in ctx.tasks or t in ctx.invalid_tasks:
                continue
            try:
                orphans.append(lay.status(t))
            except InvalidName:
                log.warning("ignoring a status znode with an invalid name: %r", t)
        if orphans:
            log.info("deleting %d statuses of tasks that no longer exist %s", len(orphans), orphans[:5])
            self._write(lambda: self.writer.delete_if_present(orphans, present=set(orphans)))

    def on_groups_change(self, token: int) -> None:
        if not self._current(token):
            return
        for g in self.zk.get_children(self.layout.groups, watch=self._watch(ev.GroupsChange)):
            if g not in self.ctx.groups:
                self._coordinator(g)

    def on_members_change(self, token: int, group: str) -> None:
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        coord = self._coordinator(group)
        try:
            children = set(self.zk.get_children(lay.group_members(group), watch=self._watch(lambda t: ev.MembersChange(t, group))))
        except NoNodeError:
            children = set()
        current = ctx.members.setdefault(group, {})
        invalid = {m for (g, m) in ctx.invalid_members if g == group}
        new = sorted(children - current.keys() - invalid)
        for m, res in zip(new, get_many(self.zk, [lay.group_member(group, m) for m in new], watch=self._member_watch)):
            if res is not None:
                self._set_member(ctx, group, m, res[0], res[1])
        for m in sorted(current.keys() - children):
            current.pop(m, None)
            ctx.member_sessions.pop((group, m), None)
        for key in [k for k in ctx.invalid_members if k[0] == group and k[1] not in children]:
            del ctx.invalid_members[key]
        self._apply(group, coord.on_members(dict(current)))

    def on_member_changes(self, token: int, group: str, members: tuple[str, ...]) -> None:
        """Members rewrote their join requests or left: one pipelined re-read, one coordinator step."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        current = ctx.members.setdefault(group, {})
        ids = sorted(members)
        bounced = []
        for m, res in zip(ids, get_many(self.zk, [lay.group_member(group, m) for m in ids], watch=self._member_watch)):
            if res is None:
                current.pop(m, None)
                ctx.invalid_members.pop((group, m), None)
                ctx.member_sessions.pop((group, m), None)
            elif self._set_member(ctx, group, m, res[0], res[1]):
                bounced.append(m)
        coord = self._coordinator(group)
        if bounced:  # a restart the watches saw as one change: first the departure, then the new member
            snapshot = {m: r for m, r in ctx.members.get(group, {}).items() if m not in bounced}
            self._apply(group, coord.on_members(snapshot))
        self._apply(group, coord.on_members(dict(ctx.members.get(group, {}))))

    def on_sync_proposal(self, token: int, group: str, generation: int) -> None:
        if not self._current(token):
            return
        coord = self._coordinator(group)
        if coord.generation != generation:
            return
        path = self.layout.group_sync(group, generation)
        try:
            data, _ = self.zk.get(path, watch=self._watch(lambda t: ev.SyncProposalReady(t, group, generation)))
        except NoNodeError:
            # not written yet (a held re-read after a connection loss): the watch must be armed again
            self._watch_sync(group, generation)
            return
        try:
            proposal = codecs.decode(codecs.SyncProposal, data, path)
        except PayloadError as exc:
            log.warning("group %s: unreadable proposal; waiting for a rewrite or the sync timeout: %s", group, exc)
            return
        self._apply(group, coord.on_proposal(proposal))

    def on_admin_rebalance(self, token: int) -> None:
        if not self._current(token):
            return
        lay = self.layout
        names = sorted(self.zk.get_children(lay.admin_rebalance, watch=self._watch(ev.Rebalance)))
        paths = [f"{lay.admin_rebalance}/{n}" for n in names]
        for path, res in zip(paths, get_many(self.zk, paths)):
            if res is None:
                continue
            try:
                req = codecs.decode(codecs.RebalanceRequest, res[0], path)
            except PayloadError as exc:
                log.warning("dropping %s", exc)
                continue
            groups = [req.group] if req.group else sorted(self.ctx.groups)
            for g in groups:
                if g in self.ctx.groups:
                    self._apply(g, self.ctx.groups[g].on_rebalance_request(f"requested: {req.reason}"))
        if paths:
            self._write(lambda: self.writer.delete_if_present(paths))

    def on_controlled_shutdown(self, token: int) -> None:
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        brokers = set(self.zk.get_children(lay.admin_controlled_shutdown, watch=self._watch(ev.ControlledShutdown)))
        for b in sorted(brokers - ctx.shutdown_requests):
            ctx.shutdown_requests.add(b)
            for g, coord in ctx.groups.items():
                if b in ctx.members.get(g, {}):
                    log.info("controlled shutdown of %s (group %s)", b, g)
                    self._apply(g, coord.on_controlled_shutdown(b))
            if b not in ctx.brokers:
                self._finish_controlled_shutdown(b)
        ctx.shutdown_requests &= brokers

    def on_reassign(self, token: int) -> None:
        if not self._current(token):
            return
        lay = self.layout
        names = sorted(self.zk.get_children(lay.admin_reassign, watch=self._watch(ev.Reassign)))
        paths = [lay.admin_reassign_of(n) for n in names]
        for path, res in zip(paths, get_many(self.zk, paths)):
            if res is None:
                continue
            try:
                req = codecs.decode(codecs.ReassignRequest, res[0], path)
            except PayloadError as exc:
                log.warning("dropping %s", exc)
                continue
            spec = self.ctx.tasks.get(req.task_id)
            if spec is not None:
                self._apply(spec.group, self._coordinator(spec.group).on_reassign(req.task_id, req.to))
        if paths:
            self._write(lambda: self.writer.delete_if_present(paths))

    def on_tick(self) -> None:
        if not self.active or self.ctx is None:
            return
        for g, coord in sorted(self.ctx.groups.items()):
            self._apply(g, coord.on_tick())
        self._flush_deletions()

    # ---- views for tests and the CLI --------------------------------------------------------------
    def wait_active(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.active and self.ctx is not None:
                return True
            time.sleep(0.02)
        return False


class _DeletionWatch:
    """The one watcher of an activation for every watch of the deletion path: the requests' children and
    the owners of tasks being deleted. kazoo keeps watchers in a set per path, so re-arming a path with
    the same function does not stack callbacks. Firings coalesce into one pending TaskDeletion and say
    what changed: an owner deleted (released), an owner created (look again, re-arming), or the
    connection dropped (kazoo forgot every watch: look at everything again)."""

    def __init__(self, token: int, put: Callable[[Any], None]) -> None:
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


class _TaskWatch:
    """The data watcher of every task znode of one activation: a firing (spec changed, task deleted) enqueues
    ``TaskConfigChange`` for the task its path names. One object per activation, not one per task and read:
    kazoo's watcher sets then never hold two callbacks for one task."""

    def __init__(self, token: int, put: Callable[[Any], None]) -> None:
        self.token = token
        self._put = put

    def __call__(self, event: Any) -> None:  # kazoo's thread: enqueue only
        path = getattr(event, "path", None)
        if path:  # None: kazoo dropped every watch with the session; that activation is over
            self._put(ev.TaskConfigChange(self.token, path.rsplit("/", 1)[1]))


class _TaskWatchArmer(threading.Thread):
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
            except _TRANSIENT:
                self._stopped.wait(0.5)
        return None


def _get_sequential(client: KazooClient, paths, watch=None):
    """One synchronous round trip per znode: the baseline the pipelined load is measured against."""
    out = []
    for p in paths:
        try:
            out.append(client.get(p, watch=watch(p) if watch else None))
        except NoNodeError:
            out.append(None)
    return out


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
