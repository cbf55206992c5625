"""A worker (broker): the kazoo layer around the sans-IO :class:`~controller.protocol.group.member.Member`.

Threads (all named after the broker): ``worker-<id>-events`` is the only one that drives the Member;
kazoo callbacks only enqueue; ``worker-<id>-task_N`` pool threads start and stop tasks (blocking runner
calls); ``worker-<id>-status`` polls the runner, restarts failed tasks with backoff and writes status
in batches; a fence timer runs while the connection is suspended.

Ownership fencing: a task runs only while this worker holds the ephemeral ``/tasks/<bucket>/<id>/owner``; the
znode is created before the runner starts and deleted only after the runner's ``stop`` returned. A new
owner waits (watch, bounded re-checks) until it is gone.

The worker builds its parts once, one module each, and gives each the values it needs, never itself nor a
callable that looks one of its attributes up later: what they share is one frozen value (``deps.WorkerDeps``:
client, layout, ``BrokerSession``, the task table, pool, event queue, its ``MemberRef``). The task table
(``slots``) is the one writer of each task's phase (``phases``). Ownership announces what it let go of
(``LetGo``) and the task supervisor, subscribed once, reconciles: no part calls back into one that holds it.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from broker_sim.runners import TaskRunner, make_runner
from broker_sim.worker.actions import ActionExecutor
from broker_sim.worker.config import WorkerConfig
from broker_sim.worker.connection import ConnectionHandler
from broker_sim.worker.deadline import EXIT_HALTED, DeadlineWatchdog
from broker_sim.worker.deps import MemberRef, WorkerDeps
from broker_sim.worker.events import (
    AssignmentEvent,
    ConnectionEvent,
    CoordinatorEvent,
    GroupStateEvent,
    JoinResultEvent,
    Owned,
    Released,
    ShutdownRequested,
    StopEvent,
    Stopped,
)
from broker_sim.worker.fence import Fence, fence_margin
from broker_sim.worker.group_io import GroupIO
from broker_sim.worker.load import LoadReport
from broker_sim.worker.ownership import RELEASE_CHUNK, Ownership
from broker_sim.worker.registration import BrokerSession, IdentityMismatch, Registration, RegistrationConflict
from broker_sim.worker.reporting import Reporter
from broker_sim.worker.slots import TaskTable
from broker_sim.worker.storage_service import StoragePart
from broker_sim.worker.supervisor import TaskSupervisor
from broker_sim.worker.warmup import WarmUp, announced
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.member import Member, WorkerState
from controller.protocol.group.rules import run_assignor
from controller.protocol.records.registration_records import BrokerInfo
from controller.protocol.records.task_records import RunInterval
from controller.zk.client import make_client
from controller.zk.layout_io import ensure_layout

__all__ = ["Worker"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Worker:
    """A broker: registers, joins its group through the Member state machine and runs what it is assigned."""

    def __init__(
        self,
        config: WorkerConfig,
        runner: TaskRunner | None = None,
        client: KazooClient | None = None,
        pause: threading.Event | None = None,
    ) -> None:
        """``pause``: while set, the worker's event loop and status thread make no progress (a stalled process,
        as a failure-injection harness makes one); None in production."""
        self.config = config
        self.id = config.broker_id
        self.layout = ZkLayout(config.settings.root)
        self.client = client or make_client(config.settings, connect=False)
        self.runner = runner or make_runner(config.runner, **config.runner_options)
        session_timeout_s = config.settings.session_timeout_s
        stop_budget_s = float(getattr(self.runner, "stop_budget_s", 0.0))
        self.fence_margin_s = fence_margin(session_timeout_s, config.fence_fraction, stop_budget_s, config.broker_id)
        self.events: queue.Queue[Any] = queue.Queue()
        self._owned_lock = threading.Lock()
        self._owned_queued = False  # an Owned event is queued and not handled yet
        self.stopped = threading.Event()
        self.exited = threading.Event()  # controlled shutdown finished
        self.leave_asked = False  # our own controlled shutdown (SIGTERM) was asked for: every session says so
        self.failed = threading.Event()  # cannot run at all (``failure`` says why): the process must exit
        self.failure: str | None = None
        self._pause = pause or threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=config.pool_size, thread_name_prefix=f"worker-{self.id}-task")
        # ---- the parts, and what they share (built once: no part is given the worker) ----
        self.session = BrokerSession(self.id)
        self.table = TaskTable()
        self.members = MemberRef(self._new_member)
        self.deps = deps = WorkerDeps(
            client=self.client,
            layout=self.layout,
            session=self.session,
            table=self.table,
            pool=self.pool,
            enqueue=self.events.put,
            stopped=self.stopped,
            members=self.members,
        )
        info = BrokerInfo(
            broker_id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            group=config.group,
            capacity=config.capacity,
            rack=config.rack,
            instance_id=config.instance_id,
            runner=self.runner.name,
            session=self.runner.session_info(),
            checkpoint_root=config.checkpoint_root,
        )
        self.registration = Registration(
            self.client, self.layout.broker(self.id), info, self.session, session_timeout_s
        )
        self.reporting = Reporter(
            self.client, self.layout, self.session, self.table, config.metrics_interval_s, config.intervals_flush_s
        )
        self.storage = StoragePart(self.client, self.layout, self.id, config.checkpoint_root, config.task_logs_dir)
        self.reporting.on_status = self.storage.on_status
        self.load = LoadReport(self.table, config.load_interval_s, self.registration.report_load)
        self.fence = Fence(
            self.id,
            session_timeout_s,
            self.fence_margin_s,
            self.table.lock,
            self.registration,
            running=self.table.running,
            stop_runners=self._fence_stop,
            resume=self._fence_lifted,
            closing=self.session.is_closing,
            stopped=self.stopped,
        )
        self.watchdog = DeadlineWatchdog(
            self.id,
            session_timeout_s,
            self.fence_margin_s,
            stop_budget_s,
            config.stop_timeout_s,
            earliest_expiry=self.fence.probe.earliest_expiry,
            running_or_starting=self.table.running_or_starting,
            kill_runners=self.runner.kill,
            runner_processes=self.runner.processes,
            halt=self.halt,
            stopped=self.stopped,
            guard_lost=self.runner.fault,
            engine_lost=self.runner.engine_lost,
        )
        self.ownership = Ownership(
            deps,
            self.reporting,
            config.owner_wait_s,
            self.layout.group_member(config.group, self.id),
            halting=self.watchdog.halted,
        )
        self.tasks = TaskSupervisor(
            deps, self.runner, self.ownership, self.watchdog, self.fence, record=self.reporting.record
        )
        self.ownership.subscribe(self.tasks.on_let_go)
        self.group_io = GroupIO(self.client, self.layout, self.id, config.group, self.events.put)
        self.warmup = WarmUp(
            self.id,
            self.client,
            self.layout,
            self.runner,
            desired=self.table.desired_tasks,
            running=self.table.running,
            fenced=self.fence.blocks_starts,
        )
        self.actions = ActionExecutor(
            self.id,
            self.group_io,
            self.table,
            members=self.members,
            reconcile=self.tasks.reconcile,
            enqueue=self.events.put,
            exited=self.exited,
        )
        self.connection = ConnectionHandler(
            self.id,
            self.client,
            self.runner,
            self.registration,
            self.session,
            self.table,
            self.fence,
            self.tasks,
            self.group_io,
            members=self.members,
            new_member=self._renew_member,
            do=self.actions.do,
            enqueue=self.events.put,
            fail=self._fail,
        )
        # ---- the threads ----
        self.thread = threading.Thread(target=self._loop, name=f"worker-{self.id}-events", daemon=True)
        self.status_thread = threading.Thread(target=self._status_loop, name=f"worker-{self.id}-status", daemon=True)
        self.pulse_thread = threading.Thread(target=self.fence.pulse_loop, name=f"worker-{self.id}-pulse", daemon=True)
        self.deadline_thread = threading.Thread(
            target=self.watchdog.loop, name=f"worker-{self.id}-deadline", daemon=True
        )

    @property
    def member(self) -> Member:
        """The current Member (a lost session starts over with a new one)."""
        return self.members.current

    def _new_member(self) -> Member:
        c = self.config
        return Member(
            member_id=self.id,
            assign=run_assignor,
            protocols=c.protocols,
            assignors=c.assignors,
            capacity=c.capacity,
            rack=c.rack,
            instance_id=c.instance_id,
        )

    def _renew_member(self) -> None:
        """A lost session: the next one starts over with a fresh Member (and nothing prepared)."""
        self.warmup.drop_all("session lost")
        self.members.renew()

    def _fence_stop(self, tasks: list[str], why: str) -> None:
        """The fence: every runner stops, then what is prepared is dropped (never waiting for a prepare under
        way: it sees the fence and discards its own result)."""
        try:
            self.tasks.stop_runners(tasks, why)
        finally:
            self.warmup.drop_all(why)

    def _fence_lifted(self) -> None:
        """The fence lifted: what it stopped starts again, and the member hears of it (it reports those tasks
        starting, so the group is not Stable until they run again)."""
        self.tasks.reconcile()
        self._enqueue(Owned())

    def _fail(self, reason: str) -> None:
        """The broker cannot run at all: ``failure`` says why, and the process must exit."""
        self.failure = reason
        self.failed.set()

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Worker:
        """Connect, refuse at once if another live broker of this host runs under our id, then start the
        threads (registration itself is the event thread's first step)."""
        if not self.client.connected:
            self.client.start(timeout=30)
        owner = getattr(self.client, "own_broker", None)  # a secured client: whose identity the policy says
        if owner is not None and owner != self.id:
            raise IdentityMismatch(
                f"these credentials are broker {owner}'s own (ACL policy), not broker {self.id}'s: "
                "give each broker its own credentials"
            )
        self.registration.check_not_running_here()
        self.client.add_listener(self._listener)
        ensure_layout(self.client, self.layout)
        for p in (
            self.layout.group_members(self.config.group),
            self.layout.group_assignments(self.config.group),
            self.layout.group_syncs(self.config.group),
            self.layout.group_joins(self.config.group),
        ):
            self.client.ensure_path(p)
        if self.config.on_halt == "exit" and self.runner.runs_processes:
            self.watchdog.start_guard()
            if self.watchdog.lease_path is not None:
                self.runner.attach_lease(self.watchdog.lease_path)
        self.storage.start()
        self.thread.start()
        self.status_thread.start()
        self.pulse_thread.start()
        self.deadline_thread.start()
        self._enqueue(ConnectionEvent("STARTED"))
        return self

    @property
    def halted(self) -> threading.Event:
        """Set once the broker halted at its fence deadline (``watchdog.reason`` says why)."""
        return self.watchdog.halted

    def halt(self, reason: str) -> None:
        """The deadline watchdog's last step, after the runner's processes were killed: end this broker now,
        without a graceful anything (a graceful step could hang as the stop did). A process exits with
        ``EXIT_HALTED`` and its supervisor restarts it; an embedded worker is killed in-process."""
        self.failure = f"halted: {reason}"
        if self.config.on_halt == "exit":
            logging.shutdown()
            os._exit(EXIT_HALTED)
        self.kill()

    def request_shutdown(self) -> None:
        """Controlled shutdown: our join request says we are leaving (a znode only we may write), the
        controller moves our tasks away, we exit once we own nothing. A worker that never registered has
        nothing to move: it just exits. (``/admin/controlled_shutdown/<id>`` is the operator's and the
        planned roll's: no broker may create one, not even for itself.)"""
        if self.session.session_id is None:
            self.exited.set()
            return
        self.leave_asked = True
        self._enqueue(ShutdownRequested())

    def stop(self, graceful: bool = True) -> None:
        """Stop everything: tasks (releasing owner znodes), the session, then the threads.

        The session is closed before joining threads: kazoo's synchronous calls wait for as long as the
        server is unreachable, and closing the client is what fails them, so nothing here waits forever."""
        if self.session.closing:
            return
        self.session.closing = True
        self._enqueue(StopEvent())
        self.warmup.close()
        self.tasks.stop_all(release=True)
        self.stopped.set()
        if self.client.connected:
            self.reporting.flush_intervals(force=True)
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
        self.storage.stop()
        self.runner.close()
        self.watchdog.close_guard()

    def kill(self) -> None:
        """Die abruptly (in-process kill): tasks end now with no graceful stop, and the session is
        closed at once, so its ephemeral znodes (membership, owners) vanish immediately."""
        self.session.closing = True
        now = time.time()
        with self.table.lock:
            for t, slot in self.table.slots.items():
                if slot.running:
                    self.reporting.record(t, slot, now, released=now)
                self.table.killed(t, slot)
        self.stopped.set()
        self._enqueue(StopEvent())
        self.warmup.close()
        self.storage.stop()
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
        if state == KazooState.SUSPENDED:
            self.fence.arm()
        elif state == KazooState.CONNECTED:
            self.fence.disarm()  # before the event: its handler must see any fence the timer raised
        self._enqueue(ConnectionEvent(str(state)))

    # ---- the event loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            event = self.events.get()
            while self._pause.is_set() and not self.session.closing:
                time.sleep(0.05)
            if isinstance(event, StopEvent):
                return
            try:
                self._handle(event)
            except RegistrationConflict as exc:
                log.error("worker %s: %s", self.id, exc)
                self.failure = str(exc)
                self.failed.set()
            except (KazooException, KazooTimeoutError) as exc:
                log.info(
                    "worker %s: ZooKeeper error handling %s: %s", self.id, type(event).__name__, type(exc).__name__
                )
                if isinstance(event, ConnectionEvent) and event.state == "STARTED" and not self.session.closing:
                    # not registered yet (a connection loss mid-way): start again shortly, until it works
                    retry = threading.Timer(0.5, self._enqueue, args=(event,))
                    retry.name = f"worker-{self.id}-register-retry"
                    retry.daemon = True
                    retry.start()
            except Exception:
                log.exception("worker %s: error handling %s", self.id, type(event).__name__)

    def _handle(self, event: Any) -> None:
        if isinstance(event, ConnectionEvent):
            self.connection.on_state(event.state)
        elif isinstance(event, GroupStateEvent):
            if self.member.follows_assignment_alone:
                self.group_io.group_state_watched = False  # its watch fired; not armed again while we follow it
                return
            info = self.group_io.read_group_state()
            if info is not None:
                self.actions.do(self.member.on_group_state(info))
        elif isinstance(event, AssignmentEvent):
            a = self.group_io.read_assignment()
            if a is not None:
                actions = self.member.on_assignment(a)
                if self.member.generation >= 0:
                    self.session.generation = self.member.generation  # owner znodes record the new generation
                self.actions.do(actions)
                incoming = announced(a, self.member.generation, self.member.incarnation)
                if incoming is not None:
                    self.warmup.announce(incoming)
        elif isinstance(event, Owned):
            self.actions.do(self.member.on_owned(self.table.held(), self.table.holding(), self.table.starting()))
        elif isinstance(event, Stopped):
            self._on_stopped(event)
        elif isinstance(event, Released):
            self._on_released(event)
        elif isinstance(event, JoinResultEvent):
            # still waiting for that generation's result (else the state got there first, or it is over)
            if self.member.state is WorkerState.JOINING and self.member.join_generation == event.generation:
                result = self.group_io.read_join_result(event.generation, missing_ok=True)
                if result is not None:
                    self.actions.do(self.member.on_join_result(result))
        elif isinstance(event, CoordinatorEvent):
            self.actions.do(self.member.on_coordinator(self.group_io.controller_present()))
        elif isinstance(event, ShutdownRequested):
            self._on_shutdown_request()
        if (
            not self.group_io.group_state_watched
            and not self.member.follows_assignment_alone
            and self.member.state is not WorkerState.DOWN
            and not self.session.closing
        ):
            # we left reconcile (a notice in our assignment): read the group state again, arming its watch
            info = self.group_io.read_group_state()
            if info is not None:
                self.actions.do(self.member.on_group_state(info))

    def _on_shutdown_request(self) -> None:
        """Our own shutdown (asked in this or an earlier session), or the operator's request: its znode is the
        request, but only a well-formed one naming us (garbage is refused by the controller too, and
        deleted); one ``in_place`` (a planned roll's batch whose tasks wait for it) is carried out by exiting
        now."""
        if self.leave_asked:
            self.actions.do(self.member.request_shutdown())
            return
        present, request = self.group_io.read_shutdown_request()
        if not present:
            return
        if request is None or request.broker != self.id:
            log.warning("worker %s: ignoring a malformed controlled-shutdown request", self.id)
            return
        if request is not None and request.in_place and self.member.state is not WorkerState.DOWN:
            log.info("worker %s: asked to restart in place (its tasks wait for it); exiting", self.id)
            self.exited.set()
            return
        self.actions.do(self.member.request_shutdown())

    # ---- the release of a reconciling member (event thread) -------------------------------------------
    def _on_stopped(self, event: Stopped) -> None:
        """Release ``event.ready`` with our report, or the usual way on a pool thread when that cannot be
        (not reconciling any more, not connected, fenced, a status version not known)."""
        tasks, ready = list(event.tasks), list(event.ready)
        request = None
        if self.client.connected and not self.fence.up and len(ready) <= RELEASE_CHUNK:
            request = self.member.release_report(frozenset(ready), self.table.held())
        if request is None or not self.ownership.send_release(tasks, ready, request):
            self.pool.submit(self.ownership.release_and_finish, tasks, ready)

    def _on_released(self, event: Released) -> None:
        """The answer to the release multi: once the tasks are let go, the member knows its report is written."""
        if self.ownership.on_released(event):
            self.actions.do(
                self.member.on_released(self.table.held(), event.request, self.table.holding(), self.table.starting())
            )
            self.tasks.reconcile()

    # ---- the status thread --------------------------------------------------------------------------
    def _status_loop(self) -> None:
        """Poll the runner (restart failed tasks with backoff), write changed statuses in batches, flush the
        run intervals."""
        while not self.stopped.wait(self.config.status_interval_s):
            if self._pause.is_set():
                continue
            try:
                self.tasks.poll()
                self.warmup.review()
                self.reporting.write_statuses()
                self.reporting.flush_intervals()
                self.load.tick()
            except (KazooException, KazooTimeoutError):
                pass
            except Exception:
                log.exception("worker %s: status loop", self.id)

    # ---- views ------------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """The group generation our owner znodes and statuses record (of the last assignment)."""
        return self.session.generation

    @property
    def session_id(self) -> int | None:
        """The session that registered our broker znode (None before the first registration)."""
        return self.session.session_id

    @property
    def closing(self) -> bool:
        """Whether ``stop`` or ``kill`` began."""
        return self.session.closing

    @property
    def intervals(self) -> collections.deque[RunInterval]:
        """The runs that ended (what the independent checker reads, with ``open_intervals``)."""
        return self.reporting.intervals

    def open_intervals(self) -> list[RunInterval]:
        return self.reporting.open_intervals()

    def running_tasks(self) -> set[str]:
        return set(self.table.running())

    def held_tasks(self) -> frozenset[str]:
        """Tasks whose owner znode we hold, or may hold any moment."""
        return self.table.held()

    def last_start(self) -> float | None:
        """Wall time the latest of the tasks running now started (None: nothing runs)."""
        with self.table.lock:
            return max(
                (s.started for s in self.table.slots.values() if s.running and s.started is not None), default=None
            )

    def state(self) -> str:
        return self.member.state.value
