"""One thread, one queue: the only place controller state changes (Kafka's ControllerEventManager).

Every event is wrapped with its enqueue time; the thread records, per event type, the count, the time
spent queued and the time spent processing. ``Shutdown`` stops the thread after it is processed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from controller.events import Shutdown

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueuedEvent:
    event: Any
    enqueued: float


@dataclass
class EventStats:
    count: int = 0
    queue_time_s: float = 0.0
    process_time_s: float = 0.0
    max_queue_time_s: float = 0.0
    max_process_time_s: float = 0.0
    errors: int = 0


class ControllerEventThread(threading.Thread):
    """Drains the event queue strictly one event at a time, in arrival order."""

    def __init__(self, process: Callable[[Any], None], name: str = "controller-event-thread",
                 observe: Callable[[str, float, float], None] | None = None) -> None:
        super().__init__(name=name, daemon=True)
        self._process = process
        self._observe = observe
        self._queue: queue.Queue[QueuedEvent] = queue.Queue()
        self.stats: dict[str, EventStats] = defaultdict(EventStats)
        self._stats_lock = threading.Lock()
        self.current: str | None = None

    def put(self, event: Any) -> None:
        self._queue.put(QueuedEvent(event, time.monotonic()))

    def put_front(self, events: list[Any]) -> None:
        """Re-queue held events ahead of newer ones (used after a suspended connection comes back)."""
        with self._queue.mutex:
            now = time.monotonic()
            for e in reversed(events):
                self._queue.queue.appendleft(QueuedEvent(e, now))
            self._queue.not_empty.notify()

    def queue_size(self) -> int:
        return self._queue.qsize()

    def shutdown(self, timeout: float = 30.0) -> None:
        self.put(Shutdown())
        if threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        while True:
            qe = self._queue.get()
            name = type(qe.event).__name__
            started = time.monotonic()
            queued = started - qe.enqueued
            self.current = name
            error = False
            try:
                self._process(qe.event)
            except Exception:  # an event must never kill the thread
                error = True
                log.exception("error processing %s", name)
            finally:
                self.current = None
            elapsed = time.monotonic() - started
            with self._stats_lock:
                s = self.stats[name]
                s.count += 1
                s.queue_time_s += queued
                s.process_time_s += elapsed
                s.max_queue_time_s = max(s.max_queue_time_s, queued)
                s.max_process_time_s = max(s.max_process_time_s, elapsed)
                s.errors += int(error)
            if self._observe is not None:
                self._observe(name, queued, elapsed)
            if isinstance(qe.event, Shutdown):
                return

    def snapshot(self) -> dict[str, EventStats]:
        with self._stats_lock:
            return {k: EventStats(**vars(v)) for k, v in self.stats.items()}
