"""The ``Controller``: one candidate, the event thread it owns, and the dispatch of events to its parts.

Threads: the kazoo threads only enqueue events (watch callbacks, connection listener); the event thread
(``controller-<id>-events``) is the only one that reads or changes controller state; the timer thread
(``controller-<id>-timer``) only enqueues ``Tick`` at protocol deadlines.

Watches carry the *activation token* current when they were armed; after a resign the token moves on,
so callbacks armed by an earlier activation are dropped instead of double-arming watches. Each event
names its handler (``events.py``); the handlers live in the parts this class is composed of
(``election``, ``loading``, ``brokers``, ``tasks``, ``groups``), which share the context of ``context``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any, Callable, Sequence

from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from controller.daemon import events as ev
from controller.zk.layout_io import ensure_layout
from controller.protocol.clock import Clock, SystemClock
from controller.daemon.brokers import Brokers
from controller.daemon.context import TRANSIENT, ControllerConfig, ControllerContext
from controller.daemon.election import Election
from controller.daemon.grants import Grants
from controller.daemon.groups import Groups
from controller.daemon.loading import StateLoad, TaskTreeWatch, TaskWatch, TaskWatchArmer
from controller.daemon.operations import Operations
from controller.daemon.tasks import Tasks, DeletionWatch
from controller.daemon.event_thread import ControllerEventThread
from controller.protocol.layout import ZkLayout
from controller.daemon.metrics import ControllerMetrics, MetricsServer
from controller.zk.client import make_client
from controller.zk.io import Fenced, FencedWriter, InterruptibleClient, WriteFailed

log = logging.getLogger(__name__)


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


class Controller(Election, StateLoad, Brokers, Tasks, Groups, Grants, Operations):
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
        self._deletion_watch: DeletionWatch | None = None  # owner watches of tasks being deleted, coalesced
        self._task_watcher: TaskWatch | None = None  # the one data watcher of every task znode, per activation
        self.watch_armer: TaskWatchArmer | None = None  # arms the tasks' watches after a multiRead load
        self._task_tree_watcher: TaskTreeWatch | None = None  # the persistent watch of /tasks, per activation
        self.task_tree_watched = False  # this activation watches /tasks with one persistent recursive watch

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

    def _bucket_watch(self, make: Callable[[int, str | None], Any]) -> Callable[[Any], None]:
        """A children watch of buckets: the event names the bucket that fired (None: the connection dropped)."""
        token = self.token
        return lambda event: self.put(make(token, getattr(event, "path", None)))

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
        except TRANSIENT as exc:
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


def default_controller_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
