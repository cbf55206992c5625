"""One thread, one queue: the only place controller state changes (Kafka's ControllerEventManager).

Every event is wrapped with its enqueue time; the thread records, per event type, the count, the time
spent queued and the time spent processing. ``Shutdown`` stops the thread after it is processed.

Live coalescing: when the thread takes a re-read of a single znode (``TaskConfigChange``,
``MemberChange``, ``BrokerModification``, or their plural forms), it also takes the contiguous run of
events right behind it that re-read the same kind of znode under the same token (and group), up to
``max_merge`` ids, and processes them as one plural event with one pipelined read (``events.coalesce``).
A storm of spec changes is then a few reads of many znodes instead of one synchronous read per znode.
Nothing is reordered: the run stops at the first event that does not merge, and reading a znode earlier
than its turn loses nothing (its re-armed watch fires for any later change).

Metrics of a merged event: it counts once, under its own type name (``TaskConfigChanges``, ...), with the
queue time of its oldest member and the time spent processing it; that is also what ``observe`` is
called with. Each raw event folded into it counts in ``EventStats.merged`` of its own type (not in its
``count``), and is reported to ``on_merge(type name, n)``. So raw events of a type taken from the queue =
``count + merged``; a lone re-read with nothing to merge is processed, and counted, as itself.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.daemon.events import Shutdown, coalesce, merge_key

log = logging.getLogger(__name__)

# Ids per merged re-read: ~0.1 s of pipelined reads at the ~8,000 reads/s kazoo manages here (0.3 s with
# decoding in benchmark B5), so one merged event never holds the thread, nor the events behind it, long.
MAX_MERGE = 1000


@dataclass(frozen=True)
class QueuedEvent:
    event: Any
    enqueued: float


@dataclass(frozen=True)
class Taken:
    """What the thread processes next: one event, or the plural event a run of re-reads merged into
    (``raw`` holds that run, oldest first; empty when nothing was merged)."""

    event: Any
    enqueued: float
    raw: tuple[Any, ...] = ()


@dataclass
class EventStats:
    count: int = 0
    queue_time_s: float = 0.0
    process_time_s: float = 0.0
    max_queue_time_s: float = 0.0
    max_process_time_s: float = 0.0
    errors: int = 0
    merged: int = 0  # events of this type processed inside a merged event (not in ``count``)


class ControllerEventThread(threading.Thread):
    """Drains the event queue one event at a time, in arrival order; a run of mergeable re-reads at the
    head of the queue is one event (see the module docstring)."""

    def __init__(
        self,
        process: Callable[[Any], None],
        name: str = "controller-event-thread",
        observe: Callable[[str, float, float], None] | None = None,
        on_merge: Callable[[str, int], None] | None = None,
        max_merge: int = MAX_MERGE,
    ) -> None:
        super().__init__(name=name, daemon=True)
        if max_merge < 1:
            raise ValueError(f"max_merge must be at least 1, got {max_merge}")
        self._process = process
        self._observe = observe
        self._on_merge = on_merge
        self.max_merge = max_merge
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

    def _take(self) -> Taken:
        """The next event, merged with the run of re-reads of the same key right behind it (bounded)."""
        first = self._queue.get()
        self.current = type(first.event).__name__  # busy from here on: the queue may already look empty
        mk = merge_key(first.event)
        if mk is None:
            return Taken(first.event, first.enqueued)
        key, ids = mk
        n = len(ids)
        run = [first]
        with self._queue.mutex:  # the producers' lock: the head cannot change while we look at it
            pending = self._queue.queue
            while pending:
                nxt = merge_key(pending[0].event)
                if nxt is None or nxt[0] != key or n + len(nxt[1]) > self.max_merge:
                    break
                n += len(nxt[1])
                run.append(pending.popleft())
        if len(run) == 1:
            return Taken(first.event, first.enqueued)
        (merged,) = coalesce([q.event for q in run])  # one key, so exactly one plural event
        return Taken(merged, min(q.enqueued for q in run), tuple(q.event for q in run))

    def run(self) -> None:
        while True:
            taken = self._take()
            name = type(taken.event).__name__
            started = time.monotonic()
            queued = started - taken.enqueued
            self.current = name
            error = False
            try:
                self._process(taken.event)
            except Exception:  # an event must never kill the thread
                error = True
                log.exception("error processing %s", name)
            finally:
                self.current = None
            elapsed = time.monotonic() - started
            raw = Counter(type(e).__name__ for e in taken.raw)
            with self._stats_lock:
                s = self.stats[name]
                s.count += 1
                s.queue_time_s += queued
                s.process_time_s += elapsed
                s.max_queue_time_s = max(s.max_queue_time_s, queued)
                s.max_process_time_s = max(s.max_process_time_s, elapsed)
                s.errors += int(error)
                for raw_name, n in raw.items():
                    self.stats[raw_name].merged += n
            if self._observe is not None:
                self._observe(name, queued, elapsed)
            if self._on_merge is not None:
                for raw_name, n in raw.items():
                    self._on_merge(raw_name, n)
            if isinstance(taken.event, Shutdown):
                return

    def snapshot(self) -> dict[str, EventStats]:
        with self._stats_lock:
            return {k: EventStats(**vars(v)) for k, v in self.stats.items()}
