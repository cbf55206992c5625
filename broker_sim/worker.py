"""A worker (broker): the kazoo layer around the sans-IO :class:`~broker_sim.member.Member`.

Threads (all named after the broker): ``worker-<id>-events`` is the only one that drives the Member;
kazoo callbacks only enqueue; ``worker-<id>-task_N`` pool threads start and stop tasks (blocking runner
calls); ``worker-<id>-status`` polls the runner, restarts failed tasks with backoff and writes status
in batches; a fence timer runs while the connection is suspended.

Ownership fencing: a task runs only while this worker holds the ephemeral ``/tasks/<id>/owner``; the
znode is created before the runner starts and deleted only after the runner's ``stop`` returned. A new
owner waits (watch, bounded re-checks) until it is gone.

Fence deadline (the timing argument). kazoo declares the connection SUSPENDED after
``read_timeout = 2/3 * session_timeout`` without hearing from the server; the server expires the session
``session_timeout`` after it last heard from us, which is no earlier than the last time we heard from it.
So at the moment we see SUSPENDED, the session — and with it our owner znodes, which is what lets a new
owner start — survives at least another ``session_timeout / 3``. We stop every task a *fence margin*
before the earliest expiry: ``fence_margin_s = max(fence_fraction * session_timeout, runner.stop_budget_s)``
(``fence_fraction`` defaults to 1/6), i.e. ``max(0, session_timeout / 3 - margin)`` after SUSPENDED, and
the liveness probe (``_LivenessProbe``) does the same ``session_timeout - margin`` after the last answer.
That leaves the margin for the runners' ``stop`` to finish before anyone else can take over. The margin is
capped at half the session timeout (fencing after less silence than that would stop tasks on every
hiccup); a runner whose stop budget exceeds the cap gets a warning: give it a longer session timeout.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from broker_sim.member import Exit, Member, ReadJoinResult, SetDesired, WorkerState, WriteJoin, WriteProposal
from broker_sim.runners import RunState, TaskRunner, make_runner
from controller import codecs
from controller.admin import ensure_layout
from controller.codecs import Assignment, BrokerInfo, GroupStateInfo, JoinResult, OwnerInfo, PayloadError, RunInterval, TaskStatus
from controller.layout import ZkLayout
from controller.protocol import COOPERATIVE, EAGER, run_assignor
from controller.taskspec import TaskSpec, decode_task
from controller.zkclient import ZkSettings, make_client
from controller.zkio import FencedWriter

log = logging.getLogger(__name__)
MAX_INTERVALS_IN_ZK = 5000
RELEASE_CHUNK = 200  # tasks released per multi (two ops each: the last status, a few hundred bytes, and the owner)


@dataclass(frozen=True)
class WorkerConfig:
    broker_id: str
    settings: ZkSettings
    group: str = "default"
    instance_id: str | None = None
    capacity: int = 1
    rack: str | None = None
    protocols: tuple[str, ...] = (COOPERATIVE, EAGER)
    assignors: tuple[str, ...] = ("cooperative-sticky",)
    runner: str = "noop"
    runner_options: dict[str, Any] = field(default_factory=dict)
    fence_fraction: float = 1 / 6
    status_interval_s: float = 0.5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    owner_wait_s: float = 120.0
    pool_size: int = 16
    intervals_flush_s: float = 2.0


# ---- worker events (kazoo callbacks enqueue these) -------------------------------------------------
@dataclass(frozen=True)
class _GroupState:
    pass


@dataclass(frozen=True)
class _Assignment:
    pass


@dataclass(frozen=True)
class _Owned:
    pass


@dataclass(frozen=True)
class _JoinResult:
    """The join result of a generation we joined was written (we led the last one: we may lead this)."""

    generation: int


@dataclass(frozen=True)
class _Coordinator:
    pass


@dataclass(frozen=True)
class _ShutdownRequested:
    pass


@dataclass(frozen=True)
class _Connection:
    state: str


@dataclass(frozen=True)
class _Stop:
    pass


class _StopBatch:
    """Tasks stopped together: counts the stops still running; the last one to finish releases them all."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._left = size
        self._tasks: list[str] = []
        self._stopped: list[str] = []

    def done(self, task: str, stopped: bool) -> tuple[list[str], list[str]] | None:
        """Record one finished stop; for the last, every task of the batch and those whose runner stopped."""
        with self._lock:
            self._tasks.append(task)
            if stopped:
                self._stopped.append(task)
            self._left -= 1
            return (list(self._tasks), sorted(self._stopped)) if self._left == 0 else None


@dataclass
class _TaskSlot:
    spec: TaskSpec | None = None
    held: bool = False          # our owner znode exists
    running: bool = False       # runner started (and not stopped)
    busy: bool = False          # a start/stop is in progress on a pool thread
    failures: int = 0
    restart_at: float | None = None
    state: str = "STOPPED"
    error: str | None = None
    trace: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    acquired: float | None = None
    started: float | None = None
    dirty: bool = True
    releasing: bool = False     # its last status goes with the owner znode's deletion (the status loop leaves it)
    nonce: int = 0


class Worker:
    def __init__(self, config: WorkerConfig, runner: TaskRunner | None = None, client: KazooClient | None = None) -> None:
        self.config = config
        self.id = config.broker_id
        self.layout = ZkLayout(config.settings.root)
        self.client = client or make_client(config.settings, connect=False)
        self.runner = runner or make_runner(config.runner, **config.runner_options)
        self.fence_margin_s = fence_margin(config.settings.session_timeout_s, config.fence_fraction,
                                           float(getattr(self.runner, "stop_budget_s", 0.0)), config.broker_id)
        self.member = self._new_member()
        self.events: queue.Queue[Any] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=f"worker-{self.id}-events", daemon=True)
        self.status_thread = threading.Thread(target=self._status_loop, name=f"worker-{self.id}-status", daemon=True)
        self.pulse_thread = threading.Thread(target=self._pulse_loop, name=f"worker-{self.id}-pulse", daemon=True)
        self.pool = ThreadPoolExecutor(max_workers=config.pool_size, thread_name_prefix=f"worker-{self.id}-task")
        self.lock = threading.RLock()
        self.slots: dict[str, _TaskSlot] = {}
        self.desired: frozenset[str] = frozenset()
        self.generation = -1
        self.intervals: collections.deque[RunInterval] = collections.deque(maxlen=100_000)
        self.status_writer = FencedWriter(self.client, None)
        self.known_status: set[str] = set()
        self.fenced = False
        self.fence_timer: threading.Timer | None = None
        self.session_id: int | None = None
        self.stopped = threading.Event()
        self.exited = threading.Event()  # controlled shutdown finished
        self.frozen = threading.Event()  # failure injection: the worker's threads stop making progress
        self._last_flush = 0.0
        self._closing = False

    def _new_member(self) -> Member:
        c = self.config
        return Member(member_id=self.id, assign=run_assignor, protocols=c.protocols, assignors=c.assignors,
                      capacity=c.capacity, rack=c.rack, instance_id=c.instance_id)

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "Worker":
        if not self.client.connected:
            self.client.start(timeout=30)
        self.client.add_listener(self._listener)
        ensure_layout(self.client, self.layout)
        for p in (self.layout.group_members(self.config.group), self.layout.group_assignments(self.config.group),
                  self.layout.group_syncs(self.config.group), self.layout.group_joins(self.config.group)):
            self.client.ensure_path(p)
        self.thread.start()
        self.status_thread.start()
        self.pulse_thread.start()
        self._enqueue(_Connection("STARTED"))
        return self

    def _register(self) -> None:
        """Create our ephemeral broker znode (waiting, bounded, for a previous session's to expire)."""
        info = BrokerInfo(broker_id=self.id, host=socket.gethostname(), pid=os.getpid(), group=self.config.group,
                          capacity=self.config.capacity, rack=self.config.rack, instance_id=self.config.instance_id,
                          runner=self.runner.name)
        deadline = time.monotonic() + self.config.settings.session_timeout_s * 3
        while True:
            try:
                self.client.create(self.layout.broker(self.id), codecs.encode(info), ephemeral=True)
                break
            except NodeExistsError:
                stat = self.client.exists(self.layout.broker(self.id))
                if stat is not None and stat.ephemeralOwner == self.client.client_id[0]:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"broker id {self.id} is registered by another live session")
                time.sleep(0.2)
        self.session_id = self.client.client_id[0]

    def request_shutdown(self) -> None:
        """Controlled shutdown: ask the controller to move our tasks away; we exit once we own nothing."""
        try:
            self.client.create(self.layout.admin_controlled_shutdown_of(self.id),
                               codecs.encode(codecs.ControlledShutdownRequest(broker=self.id, requested=time.time())),
                               makepath=True)
        except NodeExistsError:
            pass
        self._enqueue(_ShutdownRequested())

    def stop(self, graceful: bool = True) -> None:
        """Stop everything: tasks (releasing owner znodes), the session, then the threads.

        The session is closed before joining threads: kazoo's synchronous calls wait for as long as the
        server is unreachable, and closing the client is what fails them, so nothing here waits forever."""
        if self._closing:
            return
        self._closing = True
        self._enqueue(_Stop())
        self._stop_all_tasks(release=True)
        self.stopped.set()
        if self.client.connected:
            self._flush_intervals(force=True)
        try:
            self.client.remove_listener(self._listener)
            self.client.stop()
            self.client.close()
        except Exception:
            pass
        for t in (self.thread, self.status_thread, self.pulse_thread):
            if t.is_alive():
                t.join(10)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.runner.close()

    def kill(self) -> None:
        """Die abruptly (in-process kill): tasks end now with no graceful stop, and the session is
        closed at once, so its ephemeral znodes (membership, owners) vanish immediately."""
        self._closing = True
        now = time.time()
        with self.lock:
            for t, slot in self.slots.items():
                if slot.running:
                    self._record(t, slot, now, released=now)
                slot.running = False
        self.stopped.set()
        self._enqueue(_Stop())
        self.runner.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        try:
            self.client.remove_listener(self._listener)
            self.client.stop()
            self.client.close()
        except Exception:
            pass

    # ---- kazoo callbacks: enqueue only --------------------------------------------------------------
    def _enqueue(self, event: Any) -> None:
        self.events.put(event)

    def _listener(self, state: KazooState) -> None:
        self._enqueue(_Connection(str(state)))
        if state == KazooState.SUSPENDED:
            self._arm_fence()
        elif state == KazooState.CONNECTED:
            self._disarm_fence()

    def _watch_group_state(self, _event: Any = None) -> None:
        self._enqueue(_GroupState())

    def _watch_assignment(self, _event: Any = None) -> None:
        self._enqueue(_Assignment())

    def _watch_controller(self, _event: Any = None) -> None:
        self._enqueue(_Coordinator())

    def _watch_shutdown(self, _event: Any = None) -> None:
        self._enqueue(_ShutdownRequested())

    # ---- fence ------------------------------------------------------------------------------------
    def _arm_fence(self) -> None:
        # SUSPENDED comes 2/3 of the session after we last heard from the server: fence a margin before
        # the earliest expiry, at once if the margin is a third of the session or more
        delay = max(0.0, self.config.settings.session_timeout_s / 3 - self.fence_margin_s)
        with self.lock:
            if self.fence_timer is None:
                self.fence_timer = threading.Timer(delay, self._fence)
                self.fence_timer.name = f"worker-{self.id}-fence"
                self.fence_timer.daemon = True
                self.fence_timer.start()

    def _disarm_fence(self) -> None:
        with self.lock:
            if self.fence_timer is not None:
                self.fence_timer.cancel()
                self.fence_timer = None

    def _fence(self) -> None:
        """ZooKeeper has not come back in time: stop every task before our session can expire."""
        with self.lock:
            self.fence_timer = None
            self.fenced = True
            running = [t for t, s in self.slots.items() if s.running]
        log.warning("worker %s: fencing, stopping %d tasks (ZooKeeper unreachable)", self.id, len(running))
        # fresh threads: the task pool may be stuck in ZooKeeper calls, and stopping must not wait for it
        if running:
            with ThreadPoolExecutor(max_workers=min(32, len(running)), thread_name_prefix=f"worker-{self.id}-fence") as ex:
                list(ex.map(self._stop_runner, running))

    # ---- the event loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            event = self.events.get()
            while self.frozen.is_set() and not self._closing:
                time.sleep(0.05)
            if isinstance(event, _Stop):
                return
            try:
                self._handle(event)
            except (KazooException, KazooTimeoutError) as exc:
                log.info("worker %s: ZooKeeper error handling %s: %s", self.id, type(event).__name__, type(exc).__name__)
            except Exception:
                log.exception("worker %s: error handling %s", self.id, type(event).__name__)

    def _handle(self, event: Any) -> None:
        if isinstance(event, _Connection):
            self._on_connection(event.state)
        elif isinstance(event, _GroupState):
            info = self._read_group_state()
            if info is not None:
                self._do(self.member.on_group_state(info))
        elif isinstance(event, _Assignment):
            a = self._read_assignment()
            if a is not None:
                actions = self.member.on_assignment(a)
                if self.member.generation >= 0:
                    self.generation = self.member.generation  # owner znodes record the new generation
                self._do(actions)
        elif isinstance(event, _Owned):
            self._do(self.member.on_owned(self._held()))
        elif isinstance(event, _JoinResult):
            # still waiting for that generation's result (else the state got there first, or it is over)
            if self.member.state is WorkerState.JOINING and self.member.join_generation == event.generation:
                result = self._read_join_result(event.generation, missing_ok=True)
                if result is not None:
                    self._do(self.member.on_join_result(result))
        elif isinstance(event, _Coordinator):
            present = self.client.exists(self.layout.controller, watch=self._watch_controller) is not None
            self._do(self.member.on_coordinator(present))
        elif isinstance(event, _ShutdownRequested):
            if self.client.exists(self.layout.admin_controlled_shutdown_of(self.id), watch=self._watch_shutdown) is not None:
                self._do(self.member.request_shutdown())

    def _on_connection(self, state: str) -> None:
        if state in ("STARTED",):
            self._register()
            self.client.exists(self.layout.controller, watch=self._watch_controller)
            self.client.exists(self.layout.admin_controlled_shutdown_of(self.id), watch=self._watch_shutdown)
            self._read_assignment()  # arm the watch; a stale assignment from a previous life is ignored by generation
            info = self._read_group_state()
            self._do(self.member.start(info))
            self._enqueue(_ShutdownRequested())
        elif state == str(KazooState.LOST):
            log.warning("worker %s: session lost; everything it held is gone", self.id)
            self._stop_all_tasks(release=False)
            with self.lock:
                for slot in self.slots.values():
                    slot.held = False
                    slot.state = "STOPPED"
                self.fenced = False  # nothing runs and nothing is held: the next session starts clean
            self._do(self.member.stop())
            self.member = self._new_member()
        elif state == str(KazooState.CONNECTED):
            if self._closing:
                return
            if self.client.client_id and self.session_id is not None and self.client.client_id[0] != self.session_id:
                # a new session after LOST: register again and rejoin from scratch
                self._register()
                self.client.exists(self.layout.controller, watch=self._watch_controller)
                self._read_assignment()
                self._do(self.member.start(self._read_group_state()))
            elif self.fenced:
                with self.lock:
                    self.fenced = False
                self._reconcile()
            self._enqueue(_GroupState())
            self._enqueue(_Assignment())

    def _read_watched(self, cls: type, path: str, watch: Callable[[Any], None]) -> Any:
        """Read and decode one znode, leaving a watch on it whether or not it exists yet; garbage there
        is logged and ignored (None), never a crash of the worker."""
        try:
            data, _ = self.client.get(path, watch=watch)
        except NoNodeError:
            self.client.exists(path, watch=watch)
            return None
        try:
            return codecs.decode(cls, data, path)
        except PayloadError as exc:
            log.warning("worker %s: ignoring %s", self.id, exc)
            return None

    def _read_group_state(self) -> GroupStateInfo | None:
        return self._read_watched(GroupStateInfo, self.layout.group_state(self.config.group), self._watch_group_state)

    def _read_assignment(self) -> Assignment | None:
        return self._read_watched(Assignment, self.layout.group_assignment(self.config.group, self.id),
                                  self._watch_assignment)

    def _do(self, actions: list[Any]) -> None:
        for act in actions:
            if isinstance(act, WriteJoin):
                path = self.layout.group_member(self.config.group, self.id)
                data = codecs.encode(act.request)
                try:
                    self.client.set(path, data)
                except NoNodeError:
                    self.client.create(path, data, ephemeral=True, makepath=True)
                group = self.member.group
                if group is not None and group.leader == self.id:
                    self._watch_join_result(act.request.join_generation)
            elif isinstance(act, ReadJoinResult):
                result = self._read_join_result(act.generation)
                if result is not None:
                    self._do(self.member.on_join_result(result))
            elif isinstance(act, WriteProposal):
                path = self.layout.group_sync(self.config.group, act.proposal.generation)
                data = codecs.encode(act.proposal)
                try:
                    try:
                        self.client.create(path, data, makepath=True)
                    except NodeExistsError:
                        self.client.set(path, data)
                except Exception:
                    self.member.proposal_not_written(act.proposal.generation)
                    raise
            elif isinstance(act, SetDesired):
                with self.lock:
                    self.desired = act.tasks
                self._reconcile()
            elif isinstance(act, Exit):
                log.info("worker %s: controlled shutdown complete", self.id)
                self.exited.set()

    def _watch_join_result(self, generation: int) -> None:
        """We led the last generation, and the coordinator keeps a leader that rejoins: watch the join result
        of the generation we just joined, so that we read it as soon as it is written rather than after the
        group state announcing it (AwaitingSync, written with it) has been read first: one round trip less
        between the join and the proposal. Only this member watches it (everyone reading a join result of
        thousands of tasks would cost more than it saves); a new leader learns it from the state."""
        path = self.layout.group_join(self.config.group, generation)
        pending = self.client.exists_async(path, watch=lambda _e: self._enqueue(_JoinResult(generation)))

        def already_there(result: Any) -> None:  # kazoo's thread: enqueue only
            try:
                if result.get(block=False) is not None:
                    self._enqueue(_JoinResult(generation))
            except Exception:
                pass
        pending.rawlink(already_there)

    def _read_join_result(self, generation: int, missing_ok: bool = False) -> JoinResult | None:
        path = self.layout.group_join(self.config.group, generation)
        try:
            data, _ = self.client.get(path)
            return codecs.decode(JoinResult, data, path)
        except NoNodeError as exc:
            if not missing_ok:
                log.warning("worker %s: cannot read join result %s: %s", self.id, path, exc)
            return None
        except PayloadError as exc:
            log.warning("worker %s: cannot read join result %s: %s", self.id, path, exc)
            return None

    # ---- tasks ------------------------------------------------------------------------------------
    def _held(self) -> frozenset[str]:
        with self.lock:
            return frozenset(t for t, s in self.slots.items() if s.held)

    def _reconcile(self) -> None:
        """Bring held/running tasks in line with ``desired``: stops first, then starts."""
        with self.lock:
            if self._closing:
                return
            stop = []
            for t, slot in list(self.slots.items()):
                if slot.busy:
                    continue
                if t not in self.desired and slot.held:
                    slot.busy = True
                    stop.append(t)
                elif t in self.desired and slot.held and not slot.running and not self.fenced and slot.state not in ("FAILED", "COMPLETED"):
                    if slot.restart_at is None or slot.restart_at <= time.monotonic():
                        slot.busy = True
                        self.pool.submit(self._start_task, t, False)
            if len(stop) == 1:
                self.pool.submit(self._stop_task, stop[0])
            elif stop:
                batch = _StopBatch(len(stop))
                for t in stop:
                    self.pool.submit(self._stop_in_batch, t, batch)
            acquire = []
            for t in sorted(self.desired):
                slot = self.slots.setdefault(t, _TaskSlot())
                if not slot.held and not slot.busy and not self.fenced:
                    slot.busy = True
                    acquire.append(t)
            if len(acquire) == 1:
                self.pool.submit(self._start_task, acquire[0], True)
            elif acquire:
                self.pool.submit(self._start_tasks, acquire)

    def _acquire_owner(self, t: str) -> bool:
        """Create the ephemeral owner znode, waiting (watch, bounded re-checks) while another holds it."""
        path = self.layout.task_owner(t)
        data = codecs.encode(OwnerInfo(broker=self.id, generation=self.generation))
        deadline = time.monotonic() + self.config.owner_wait_s
        while time.monotonic() < deadline:
            with self.lock:
                if t not in self.desired or self._closing:
                    return False
            try:
                self.client.create(path, data, ephemeral=True)
                return True
            except NoNodeError:
                return False  # the task itself is gone
            except NodeExistsError:
                gone = threading.Event()
                stat = self.client.exists(path, watch=lambda _e: gone.set())
                if stat is None:
                    continue
                if stat.ephemeralOwner == self.client.client_id[0]:
                    return True  # ours already (e.g. reconciled twice)
                gone.wait(1.0)
        log.warning("worker %s: gave up waiting for %s to be released", self.id, path)
        return False

    def _start_task(self, t: str, acquire: bool) -> None:
        try:
            if acquire:
                if not self._acquire_owner(t):
                    return
                self._mark_held([t])
            with self.lock:
                if t not in self.desired or self.fenced:
                    return
            spec = self._read_spec(t)
            if spec is None:
                return
            self._run(t, spec)
        finally:
            with self.lock:
                if t in self.slots:
                    self.slots[t].busy = False
            self._reconcile()

    def _start_tasks(self, tasks: list[str]) -> None:
        """Start several newly desired tasks together: their owner znodes are created and their specs read
        in one pipelined round (the reads sent right behind the creates), then each runner starts on a pool
        thread (``_launch``). One ``_start_task`` per task took two round trips each, ``pool_size`` tasks at
        a time: a broker given ~50 tasks in a rebalance started its last one a dozen round trips after its
        first. A task whose owner znode is still there (its previous owner has not let go yet, or it is
        ours already) goes through ``_start_task``'s bounded wait instead (its spec read here is unused;
        the watch it armed only re-checks a task we hold). Every task in ``tasks`` is marked busy by the
        caller; the busy flag passes to the job that carries the task on, or is cleared here."""
        handed: set[str] = set()
        try:
            with self.lock:
                live = [t for t in tasks if t in self.desired and not self._closing and not self.fenced]
            owner = codecs.encode(OwnerInfo(broker=self.id, generation=self.generation))
            creates = [(t, self.client.create_async(self.layout.task_owner(t), owner, ephemeral=True)) for t in live]
            reads = {t: self.client.get_async(self.layout.task(t), watch=lambda _e, t=t: self._spec_changed(t))
                     for t in live}
            held: list[str] = []
            for t, pending in creates:
                try:
                    pending.get()
                    held.append(t)
                except NodeExistsError:
                    handed.add(t)
                    self.pool.submit(self._start_task, t, True)
                except NoNodeError:
                    pass  # the task itself is gone
                except Exception as exc:  # e.g. connection loss: the next reconcile tries again
                    log.info("worker %s: taking %s: %s", self.id, t, type(exc).__name__)
            if held:
                self._mark_held(held)
            with self.lock:
                runnable = [t for t in held if t in self.desired and not self.fenced]
            for t in runnable:
                try:
                    data, _ = reads[t].get()
                except NoNodeError:
                    continue
                except Exception as exc:  # held, not running: the next reconcile starts it
                    log.info("worker %s: reading %s: %s", self.id, t, type(exc).__name__)
                    continue
                spec = self._decode_spec(t, data)
                if spec is not None:
                    handed.add(t)
                    self.pool.submit(self._launch, t, spec)
        finally:
            with self.lock:
                for t in tasks:
                    if t not in handed and t in self.slots:
                        self.slots[t].busy = False
            self._reconcile()

    def _launch(self, t: str, spec: TaskSpec) -> None:
        """Start the runner of a task ``_start_tasks`` took (owner held, spec read)."""
        try:
            with self.lock:
                if t not in self.desired or self.fenced:
                    return
            self._run(t, spec)
        finally:
            with self.lock:
                if t in self.slots:
                    self.slots[t].busy = False
            self._reconcile()

    def _mark_held(self, tasks: list[str]) -> None:
        """Our owner znodes of these tasks exist now."""
        now = time.time()
        with self.lock:
            for t in tasks:
                slot = self.slots.setdefault(t, _TaskSlot())
                slot.held = True
                slot.acquired = now
                slot.dirty = True
        self._enqueue(_Owned())

    def _run(self, t: str, spec: TaskSpec) -> None:
        """Start the runner of a task whose owner znode we hold (the caller holds its busy flag)."""
        with self.lock:
            slot = self.slots[t]
            slot.spec = spec
            slot.state = "STARTING"
        try:
            self.runner.start(t, spec, self.generation)
        except Exception as exc:
            self._failed(t, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return
        with self.lock:
            slot.running = True
            slot.started = time.time()
            slot.state = "RUNNING"
            slot.error = None
            slot.dirty = True
            fenced = self.fenced or self._closing
        if fenced:  # the fence fired while the runner was starting: it stopped the others, now this one
            log.warning("worker %s: %s finished starting after the fence; stopping it", self.id, t)
            self._stop_runner(t)

    def _read_spec(self, t: str) -> TaskSpec | None:
        path = self.layout.task(t)
        try:
            data, _ = self.client.get(path, watch=lambda _e: self._spec_changed(t))
        except NoNodeError:
            return None
        return self._decode_spec(t, data)

    def _decode_spec(self, t: str, data: bytes) -> TaskSpec | None:
        try:
            return decode_task(data, self.layout.task(t))
        except PayloadError as exc:
            self._failed(t, str(exc), None, permanent=True)
            return None

    def _spec_changed(self, t: str) -> None:
        """Our task's spec changed: a `task restart` (nonce) or new pipeline settings restart it."""
        def check() -> None:
            with self.lock:
                slot = self.slots.get(t)
                if slot is None or not slot.held:
                    return
            try:
                data, _ = self.client.get(self.layout.task(t), watch=lambda _e: self._spec_changed(t))
                spec = decode_task(data, self.layout.task(t))
            except PayloadError as exc:
                # the spec became garbage: the controller marks it FAILED and revokes it; say the same
                # in our own status writes until we let go, and stop running it now
                self._stop_runner(t)
                self._failed(t, f"invalid task spec: {exc}", None, permanent=True)
                return
            except (NoNodeError, KazooException):
                return
            with self.lock:
                slot = self.slots.get(t)
                if slot is None or slot.spec is None:
                    return
                restart = spec.restart_nonce != slot.spec.restart_nonce or spec.pipeline != slot.spec.pipeline
                if not restart or slot.busy:
                    slot.spec = spec
                    return
                slot.busy = True
                slot.failures = 0
                slot.restart_at = None
            self.pool.submit(self._restart, t, spec)
        self.pool.submit(check)

    def _restart(self, t: str, spec: TaskSpec) -> None:
        try:
            self._stop_runner(t)
            with self.lock:
                slot = self.slots[t]
                slot.state = "STOPPED"
                slot.spec = spec
        finally:
            with self.lock:
                self.slots[t].busy = False
            self._reconcile()

    def _failed(self, t: str, error: str, trace: str | None, permanent: bool = False) -> None:
        with self.lock:
            slot = self.slots.setdefault(t, _TaskSlot())
            slot.failures += 1
            slot.error = error
            slot.trace = trace
            slot.dirty = True
            limit = slot.spec.max_failures if slot.spec is not None else 0
            if permanent or slot.failures > limit:
                slot.state = "FAILED"
                slot.restart_at = None
                log.warning("worker %s: task %s FAILED for good after %d failures: %s", self.id, t, slot.failures, error)
            else:
                delay = min(self.config.backoff_base_s * 2 ** (slot.failures - 1), self.config.backoff_max_s)
                slot.state = "RESTARTING"
                slot.restart_at = time.monotonic() + delay
                log.info("worker %s: task %s failed (%d), restart in %.1fs: %s", self.id, t, slot.failures, delay, error)

    def _stop_runner(self, t: str) -> None:
        with self.lock:
            slot = self.slots.get(t)
            if slot is None or not slot.running:
                return
        end = time.time()
        self.runner.stop(t)
        with self.lock:
            slot.running = False
            slot.dirty = True
            self._record(t, slot, end, released=time.time())

    def _stop_task(self, t: str) -> None:
        try:
            self._stop_runner(t)
            self._release([t])
        finally:
            with self.lock:
                if t in self.slots:
                    self.slots[t].busy = False
            self._reconcile()

    def _stop_in_batch(self, t: str, batch: "_StopBatch") -> None:
        """Stop one of several tasks let go of together (a revocation, an eager rejoin): the runners stop in
        parallel on pool threads, and whichever stop finishes last releases them all together (``_release``:
        one pipelined read of their statuses, one multi). The member rejoins only once all of them are let
        go, so waiting for the slowest stop delays nobody; a revoking broker used to send two requests per
        task and wake its event thread once per task. A runner whose stop raised stays held (and running):
        the next reconcile stops it again. The busy flags of the batch are cleared once it is released."""
        stopped = False
        try:
            self._stop_runner(t)
            stopped = True
        except Exception:
            log.exception("worker %s: stopping %s", self.id, t)
        finally:
            done = batch.done(t, stopped)
            if done is not None:
                tasks, ready = done
                try:
                    self._release(ready)
                finally:
                    with self.lock:
                        for x in tasks:
                            if x in self.slots:
                                self.slots[x].busy = False
                    self._reconcile()

    def _release(self, tasks: list[str]) -> None:
        """Write the last status of stopped tasks and delete their owner znodes, in one multi per chunk: a new
        owner can start only after the owner znode is gone, so its RUNNING can never be overwritten by our
        STOPPED. Only a status that is still ours is written, at the version read just before (the
        controller may have marked the task FAILED meanwhile); the reads are pipelined. A multi that fails
        (a version moved under us) is retried task by task; a single task's that fails deletes the owner
        znode alone."""
        if not tasks:
            return
        if len(tasks) > RELEASE_CHUNK:
            for i in range(0, len(tasks), RELEASE_CHUNK):
                self._release(tasks[i:i + RELEASE_CHUNK])
            return
        finals: dict[str, bytes] = {}
        with self.lock:
            for t in tasks:
                slot = self.slots[t]
                slot.releasing = True
                if slot.state not in ("COMPLETED", "FAILED"):
                    slot.state = "STOPPED"
                finals[t] = codecs.encode(TaskStatus(
                    broker=self.id, state=slot.state, generation=self.generation, updated=time.time(),
                    error=slot.error, trace=slot.trace, failures=slot.failures, metrics=slot.metrics))
        try:
            reads = [(t, self.client.get_async(self.layout.status(t))) for t in tasks]
            tx = self.client.transaction()
            for t, pending in reads:
                status_path = self.layout.status(t)
                try:
                    data, stat = pending.get()
                    if codecs.decode(TaskStatus, data, status_path).broker == self.id:
                        tx.set_data(status_path, finals[t], version=stat.version)
                except NoNodeError:
                    tx.create(status_path, finals[t])
                except Exception:
                    pass
                tx.delete(self.layout.task_owner(t))
            try:
                results = tx.commit_async().get(timeout=30)
            except Exception:
                results = [None]
            failed = any(isinstance(r, Exception) for r in results)
            if failed and len(tasks) > 1:
                for t in tasks:
                    self._release([t])
                return
            if failed:
                try:
                    self.client.delete(self.layout.task_owner(tasks[0]))
                except NoNodeError:
                    pass
            else:
                self.known_status.update(self.layout.status(t) for t in tasks)
            with self.lock:
                for t in tasks:
                    slot = self.slots[t]
                    slot.held = False
                    slot.dirty = True
                    slot.failures = 0
                    slot.restart_at = None
            self._enqueue(_Owned())
        finally:
            with self.lock:
                for t in tasks:
                    self.slots[t].releasing = False

    def _stop_all_tasks(self, release: bool) -> None:
        with self.lock:
            running = [t for t, s in self.slots.items() if s.running]
            held = [t for t, s in self.slots.items() if s.held]
        def stop_one(t: str) -> None:
            try:
                self._stop_runner(t)
            except Exception:
                log.exception("worker %s: stopping %s", self.id, t)

        if running:  # in parallel: a graceful stop costs one stop latency, not one per task
            with ThreadPoolExecutor(max_workers=min(32, len(running)), thread_name_prefix=f"worker-{self.id}-stop") as pool:
                list(pool.map(stop_one, running))
        if release and held and self.client.connected:
            t0 = self.client.transaction()
            for t in held:
                t0.delete(self.layout.task_owner(t))
            try:
                t0.commit_async().get(timeout=5)
            except Exception:
                pass
            with self.lock:
                for t in held:
                    self.slots[t].held = False

    def _record(self, t: str, slot: _TaskSlot, end: float, released: float | None) -> None:
        if slot.started is not None:
            self.intervals.append(RunInterval(task_id=t, broker=self.id, start=slot.started, end=end,
                                              generation=self.generation, acquired=slot.acquired, released=released))
        slot.started = None

    def open_intervals(self) -> list[RunInterval]:
        with self.lock:
            return [RunInterval(task_id=t, broker=self.id, start=s.started, end=None, generation=self.generation,
                                acquired=s.acquired) for t, s in self.slots.items() if s.running and s.started]

    # ---- status -----------------------------------------------------------------------------------
    def _pulse_loop(self) -> None:
        """Detect that this process was paused (SIGSTOP, VM or GC pause): a thread doing no I/O wakes up
        much later than it asked to. The session may be gone and our tasks someone else's: fence now,
        then un-fence only after a round trip proves the session survived (our broker znode is ours)."""
        period = 0.2
        last = time.monotonic()
        probe = _LivenessProbe(self)
        while not self.stopped.wait(period):
            now = time.monotonic()
            gap, last = now - last, now
            if gap <= self.config.settings.session_timeout_s / 3:
                probe.step(now)
                continue
            probe.reset(now)
            log.warning("worker %s: paused for %.1fs; fencing", self.id, gap)
            self._fence()
            try:
                stat = self.client.exists(self.layout.broker(self.id))
                alive = stat is not None and stat.ephemeralOwner == self.session_id
            except Exception:
                alive = False
            if alive:
                with self.lock:
                    self.fenced = False
                self._reconcile()
            last = time.monotonic()

    def _status_loop(self) -> None:
        while not self.stopped.wait(self.config.status_interval_s):
            if self.frozen.is_set():
                continue
            try:
                self._poll_runner()
                self._write_statuses()
                self._flush_intervals()
            except (KazooException, KazooTimeoutError):
                pass
            except Exception:
                log.exception("worker %s: status loop", self.id)

    def _poll_runner(self) -> None:
        with self.lock:
            running = [t for t, s in self.slots.items() if s.running and not s.busy]
        for t in running:
            st = self.runner.status(t)
            with self.lock:
                slot = self.slots[t]
                if st.metrics != slot.metrics:
                    slot.metrics = dict(st.metrics)
                    slot.dirty = True
            if st.state is RunState.FAILED:
                self._stop_runner(t)
                self._failed(t, st.error or "failed", st.trace)
            elif st.state is RunState.COMPLETED:
                with self.lock:
                    slot.state = "COMPLETED"
                    slot.dirty = True
        with self.lock:
            due = [t for t, s in self.slots.items() if s.restart_at is not None and s.restart_at <= time.monotonic()]
        if due:
            with self.lock:
                for t in due:
                    self.slots[t].restart_at = None
            self._reconcile()

    def _write_statuses(self) -> None:
        now = time.time()
        with self.lock:
            dirty = [(t, s) for t, s in self.slots.items() if s.dirty and s.held and not s.releasing]
            for _, s in dirty:
                s.dirty = False
            items = [(self.layout.status(t), codecs.encode(TaskStatus(
                broker=self.id, state=s.state, generation=self.generation, updated=now, error=s.error, trace=s.trace,
                failures=s.failures, metrics=s.metrics))) for t, s in dirty]
        if items:
            self.status_writer.upsert(items, self.known_status)

    def _flush_intervals(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_flush < self.config.intervals_flush_s:
            return
        self._last_flush = time.monotonic()
        recent = (list(self.intervals) + self.open_intervals())[-MAX_INTERVALS_IN_ZK:]
        if not recent or not self.client.connected:
            return
        data = codecs.encode(codecs.IntervalLog(broker=self.id, intervals=tuple(recent)))
        try:
            self.status_writer.upsert([(self.layout.broker_intervals(self.id), data)], self.known_status)
        except Exception:
            pass

    # ---- views ------------------------------------------------------------------------------------
    def running_tasks(self) -> set[str]:
        with self.lock:
            return {t for t, s in self.slots.items() if s.running}

    def state(self) -> str:
        return self.member.state.value


def fence_margin(session_timeout_s: float, fence_fraction: float, stop_budget_s: float, who: str = "worker") -> float:
    """How long before its session could expire a worker stops every task: a fraction of the session
    timeout, or the runner's stop budget if that is longer, capped at half the session timeout."""
    margin = max(session_timeout_s * fence_fraction, stop_budget_s)
    cap = session_timeout_s / 2
    if margin > cap:
        log.warning("worker %s: its runner's stop may take %.1fs, more than half the %.1fs session timeout; "
                    "fencing %.1fs before expiry, so a slow stop can outlive the session: use a session "
                    "timeout of at least %.1fs", who, stop_budget_s, session_timeout_s, cap, 2 * stop_budget_s)
        margin = cap
    return margin


class _LivenessProbe:
    """The fence deadline without relying on kazoo's SUSPENDED, run by the pulse thread.

    kazoo declares SUSPENDED only when a heartbeat ping goes unanswered, and every request it sends
    counts as a ping (it postpones the next one): a worker that keeps issuing requests into a silent
    network never sees SUSPENDED while the server expires its session. So the pulse thread keeps one
    cheap ``exists`` of our broker znode in flight; the server heard from us no earlier than the send
    time of the last answered one, so our session lives at least ``session_timeout`` past it. Once
    ``session_timeout - fence_margin_s`` has passed without an answer, stop every task (the same margin
    as the SUSPENDED fence timer); resume when an answer shows our session still owns our broker znode."""

    def __init__(self, worker: "Worker") -> None:
        self.w = worker
        self.limit = worker.config.settings.session_timeout_s - worker.fence_margin_s
        self.session: int | None = None
        self.last_ok = time.monotonic()
        self.pending: tuple[float, Any] | None = None
        self.fenced = False

    def reset(self, now: float) -> None:
        self.last_ok = now
        self.pending = None

    def step(self, now: float) -> None:
        w = self.w
        if w.session_id is None or w._closing:
            self.reset(now)
            return
        if w.session_id != self.session:  # a new session: its clock starts now
            self.session = w.session_id
            self.reset(now)
            self.fenced = False
        if self.pending is not None and self.pending[1].ready():
            sent, result = self.pending
            self.pending = None
            try:
                stat = result.get(block=False)
            except Exception:
                stat = False
            if stat is not False:
                self.last_ok = max(self.last_ok, sent)
                if self.fenced and stat is not None and stat.ephemeralOwner == w.session_id:
                    self.fenced = False
                    log.info("worker %s: ZooKeeper answers again and our session is alive; resuming", w.id)
                    with w.lock:
                        w.fenced = False
                    w._reconcile()
        if self.pending is None and w.client.connected:
            try:
                self.pending = (now, w.client.exists_async(w.layout.broker(w.id)))
            except Exception:
                self.pending = None
        if not self.fenced and now - self.last_ok > self.limit:
            self.fenced = True
            log.warning("worker %s: no answer from ZooKeeper for %.1fs; fencing", w.id, now - self.last_ok)
            w._fence()


def install_signal_handlers(worker: Worker, on_exit: Callable[[], None]) -> None:
    """SIGTERM = controlled shutdown; SIGINT once = controlled shutdown, twice = immediate stop."""
    presses = {"int": 0}

    def term(_sig: int, _frame: Any) -> None:
        log.info("SIGTERM: controlled shutdown of %s", worker.id)
        threading.Thread(target=worker.request_shutdown, name=f"worker-{worker.id}-sigterm", daemon=True).start()

    def intr(_sig: int, _frame: Any) -> None:
        presses["int"] += 1
        if presses["int"] >= 2:
            log.warning("second SIGINT: stopping %s now", worker.id)
            on_exit()
        else:
            term(_sig, _frame)

    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGINT, intr)
