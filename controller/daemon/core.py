"""The ``Controller``: one candidate, the event thread it owns, the activation its parts share, and the
dispatch of events to those parts.

Threads: the kazoo threads only enqueue events (watch callbacks, connection listener); the event thread
(``controller-<id>-events``) is the only one that reads or changes controller state; the timer thread
(``controller-<id>-timer``) only enqueues ``Tick`` at protocol deadlines.

Watches carry the *activation token* current when they were armed; after a resign the token moves on,
so callbacks armed by an earlier activation are dropped instead of double-arming watches. Each event
names its handler (``events.py``) on one of the parts the controller owns: ``election``, ``loader``,
``brokers``, ``tasks``, ``groups``, ``grants``, ``operations`` (and ``summary``, on the timer). A part receives what it needs (the
ZooKeeper client, the layout, a sibling part) and sees the controller only through ``host.Host`` (the
current activation and the few operations it calls back; the election through ``election.Seat``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from controller.daemon import events as ev
from controller.daemon.brokers import BrokerTracker
from controller.daemon.context import TRANSIENT, ControllerConfig, ControllerContext
from controller.daemon.election import Election
from controller.daemon.event_thread import ControllerEventThread
from controller.daemon.events import ControllerEvent
from controller.daemon.grants import TaskGrants
from controller.daemon.groups import GroupDriver
from controller.daemon.host import Watcher
from controller.daemon.loading import FailoverLoad
from controller.daemon.metrics import ControllerMetrics, MetricsServer
from controller.daemon.operations import OperatorSettings
from controller.daemon.roll_driver import RollDriver
from controller.daemon.summary import SummaryWriter
from controller.daemon.task_watch import TaskTracker
from controller.protocol.clock import Clock, SystemClock
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.candidates import Candidacy
from controller.zk.client import make_client
from controller.zk.io import Fenced, FencedWriter, InterruptibleClient, WriteFailed
from controller.zk.layout_io import ensure_layout

log = logging.getLogger(__name__)

T = TypeVar("T")


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

    def __init__(
        self,
        config: ControllerConfig,
        client: KazooClient | None = None,
        clock: Clock | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        """``before_write`` runs on the event thread before each fenced write (where a failure-injection
        harness freezes a controller mid-event); None in production."""
        self.config = config
        self.id = config.controller_id
        self.layout = ZkLayout(config.settings.root)
        self.client = client or make_client(config.settings, connect=False)
        self.zk = InterruptibleClient(self.client)  # every ZooKeeper call of the event thread goes through this
        self.clock: Clock = clock or SystemClock()
        self.metrics = ControllerMetrics()
        self.thread = ControllerEventThread(
            self._process,
            name=f"controller-{self.id}-events",
            observe=self.metrics.observe,
            on_merge=self.metrics.observe_merged,
        )
        self.timer = _Timer(f"controller-{self.id}-timer", lambda: self.put(ev.Tick()), self.clock)
        # the activation (``host.Host``): moved on by activate, reload and resign, all on the event thread
        self.token = 0
        self.active = False
        self.epoch: int | None = None
        self.writer: FencedWriter | None = None
        self.ctx: ControllerContext | None = None
        # the connection as the event thread sees it (``election.Seat``): SUSPENDED holds events
        self.connected = True
        self.needs_reload = False
        self.held: list[Any] = []
        self.stopping = False
        self.metrics_server: MetricsServer | None = None
        self._before_write = before_write
        self.fenced_writes = 0
        self.became_active_at: float | None = None
        # the parts, each given what it needs and this controller as its ``Host``
        zk, lay = self.zk, self.layout
        self.grants = TaskGrants(self, zk, lay, self.id)
        self.operations = OperatorSettings(self, zk, lay, self.clock, self.metrics, self.id)
        self.groups = GroupDriver(
            self, zk, lay, self.clock, self.metrics, self.id, config.group, self.grants, self.operations
        )
        self.brokers = BrokerTracker(self, zk, lay, self.metrics, self.operations, self.groups.on_readiness)
        self.tasks = TaskTracker(
            self, zk, self.client, lay, self.clock, self.metrics, self.id, config.task_watch, self.groups
        )
        self.loader = FailoverLoad(
            self, zk, lay, self.metrics, self.id, config.load, self.brokers, self.tasks, self.groups, self.operations
        )
        self.election = Election(self, zk, lay, self.id, config.host)
        self.candidacy = Candidacy(self.client, lay, self.id, config.host)
        self.roll = RollDriver(self, zk, lay, self.id)
        self.summary = SummaryWriter(self, lay, self.clock, self.id)

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Controller:
        if not self.client.connected:
            self.client.start(timeout=30)
        ensure_layout(self.client, self.layout)
        # one live candidate per id (a duplicate `controller run --id` is refused before it stands)
        self.candidacy.register(wait_s=self.config.settings.session_timeout_s * 3)
        self.client.add_listener(self._listener)
        if self.config.metrics_port is not None:
            self.metrics_server = MetricsServer(
                self.metrics.registry, self.config.metrics_port, name=f"controller-{self.id}-metrics"
            )
        self.thread.start()
        self.timer.start()
        self.put(ev.Startup())
        return self

    def stop(self) -> None:
        self.stopping = True
        self.election.cancel_retry()
        if self.thread.ident is not None:
            self.thread.shutdown()
        if self.loader.watch_armer is not None:
            self.loader.watch_armer.stop(join_s=5)
        if self.timer.ident is not None:
            self.timer.stop()
        if self.metrics_server:
            self.metrics_server.close()
        self.client.remove_listener(self._listener)
        self.client.stop()
        self.client.close()

    def wait_active(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.active and self.ctx is not None:
                return True
            time.sleep(0.02)
        return False

    # ---- what the parts call back (``host.Host``, ``election.Seat``) ---------------------------------
    def put(self, event: ControllerEvent) -> None:
        self.thread.put(event)
        self.metrics.queue_size.set(self.thread.queue_size())

    def put_front(self, events: list[Any]) -> None:
        self.thread.put_front(events)

    def watch(self, make: Callable[[int], ControllerEvent]) -> Watcher:
        token = self.token
        return lambda _event: self.put(make(token))

    def bucket_watch(self, make: Callable[[int, str | None], ControllerEvent]) -> Watcher:
        token = self.token
        return lambda event: self.put(make(token, getattr(event, "path", None)))

    def current(self, token: int) -> bool:
        return self.active and token == self.token

    def write(self, fn: Callable[[], T]) -> T:
        if self._before_write is not None:
            self._before_write()
        return fn()

    def apply(self, group: str, decisions: list[Any]) -> None:
        self.groups.apply(group, decisions)

    def install(self, ctx: ControllerContext) -> None:
        self.ctx = ctx

    # ---- activations ------------------------------------------------------------------------------
    def activate(self, epoch: int, epoch_zk_version: int) -> None:
        """Won at ``epoch``: every write from now on is fenced by the epoch znode's version."""
        self.token += 1
        self.active = True
        self.epoch = epoch
        self.writer = FencedWriter(self.zk, self.layout.controller_epoch, epoch_zk_version)
        self.metrics.epoch.set(epoch)
        self.metrics.active.set(1)
        self.became_active_at = time.monotonic()
        log.info("controller %s is active at epoch %d", self.id, epoch)
        self.election.watch_seat()
        self.summary.reset()
        self._load()

    def reload(self) -> None:
        """Start again from what ZooKeeper holds: a new token, a new context."""
        for coord in self.ctx.groups.values() if self.ctx else ():
            coord.machine.end()
        self.token += 1
        self.needs_reload = False
        self.summary.reset()
        self._load()

    def _load(self) -> None:
        """Load the context. ZooKeeper going away and a newer epoch are handled by the caller as for any
        event; any other failure gives the seat up (never held without a context) and backs off."""
        try:
            self.loader.load()
        except (Fenced, *TRANSIENT):
            raise
        except Exception as exc:
            self.election.activation_failed(exc)
            return
        self.election.activated()

    def resign(self, reason: str) -> None:
        if not self.active:
            return
        log.info("controller %s resigns (epoch %s): %s", self.id, self.epoch, reason)
        if self.ctx is not None:
            for coord in self.ctx.groups.values():
                coord.machine.end()
        self.active = False
        self.token += 1
        self.loader.stop_watch_armer()
        try:
            self.tasks.unwatch_tree()
        except Exception:  # best effort: its events carry a stale token from now on
            log.exception("controller %s: removing the watch of the tasks", self.id)
        self.ctx = None
        self.writer = None
        self.held.clear()
        self.metrics.active.set(0)
        self.metrics.brokers.set(0)
        self.metrics.tasks.set(0)
        self.metrics.invalid_tasks.set(0)
        self.election.give_up_seat()

    def on_tick(self) -> None:
        """A protocol deadline passed: the coordinators' timers, deletions whose linger is over, and the
        cluster summary's refresh."""
        if not self.active or self.ctx is None:
            return
        self.groups.on_tick()
        self.tasks.flush_deletions()
        self.summary.refresh()

    # ---- event processing -------------------------------------------------------------------------
    def _listener(self, state: KazooState) -> None:
        # kazoo's thread: only enqueue
        if state == KazooState.SUSPENDED:
            self.put(ev.Suspended())
        elif state == KazooState.CONNECTED:
            self.put(ev.Reconnected())
        elif state == KazooState.LOST:
            self.put(ev.Expire())

    def _process(self, event: Any) -> None:
        if isinstance(event, ev.Reconnected):
            try:
                self.candidacy.ensure()  # a new session after LOST: our candidate znode went with the old one
            except TRANSIENT:
                pass  # the next CONNECTED tries again
        if isinstance(event, (ev.Suspended, ev.Reconnected, ev.Expire, ev.Shutdown)):
            event.process(self)
            return
        if not self.connected:
            self.held.append(event)  # SUSPENDED: hold until reconnected (or dropped if the session is lost)
            return
        try:
            if self.active and self.needs_reload and self.client.connected:
                self.reload()  # an earlier event was cut short by ZooKeeper: start again from what it holds
            event.process(self)
            if self.active and self.ctx is not None:
                self.roll.advance()
        except Fenced as exc:
            self.fenced_writes += 1
            self.metrics.fenced.inc()
            log.warning("controller %s (epoch %s) fenced: %s", self.id, self.epoch, exc)
            self.resign("fenced by a newer controller")
            self.election.elect()
        except TRANSIENT as exc:
            log.info(
                "controller %s: ZooKeeper unavailable while processing %s (%s)",
                self.id,
                type(event).__name__,
                type(exc).__name__,
            )
            if self.active:
                self.needs_reload = True
            else:
                if not self.stopping:
                    self.election.retry_later()
        except WriteFailed as exc:
            log.warning("controller %s: write failed (%s); reloading context", self.id, exc)
            self.needs_reload = True
            if self.connected and self.active:
                self.reload()
        finally:
            self._reschedule()

    def _reschedule(self) -> None:
        if not self.active or self.ctx is None or not self.connected:
            self.timer.schedule(None)  # no deadlines fire while suspended: the Tick would only be held
            return
        deadlines = [d for d in (c.next_deadline() for c in self.ctx.groups.values()) if d is not None]
        deletion = self.tasks.deletion_deadline()
        if deletion is not None:
            deadlines.append(deletion)
        deadlines.append(self.summary.deadline())
        roll_due = self.roll.deadline_wall()
        if roll_due is not None:  # (a wall-clock bound, so that it survives a failover) on this clock
            deadlines.append(self.clock.now() + max(0.0, roll_due - time.time()) + 0.01)
        self.timer.schedule(min(deadlines) if deadlines else None)
        self.metrics.queue_size.set(self.thread.queue_size())


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
