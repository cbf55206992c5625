"""Warm-up of incoming tasks: a planned roll announces in a member's assignment the tasks it moves to that
member next (``Assignment.incoming``); for each one it does not run, the broker asks its runner to ``prepare``
the part of the start that needs no ownership, so that the start, once the task is assigned and its owner
znode taken, is shorter. What was prepared and did not arrive within ``PREPARED_TTL_S``, or stopped being
announced, is discarded.

A prepared task is not running: nothing is written for it, no owner znode is taken, and its start still
waits for the owner znode like any other. The warm-up never holds the task table's lock while a runner
prepares, and the fence drops everything prepared (``drop_all``) without waiting for a prepare under way:
one that finishes after is discarded at once.

A part of the worker: ``decide`` is the pure rule (what to prepare, what to discard); ``WarmUp`` carries it
out on its own named threads (never the task pool, whose threads start and stop what runs)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kazoo.client import KazooClient

from broker_sim.runners import TaskRunner
from controller.protocol.cluster.layout import InvalidName, ZkLayout, check_name
from controller.protocol.group.rules import RECONCILE
from controller.protocol.records.group_messages import Assignment
from controller.protocol.tasks.spec import decode_task

log = logging.getLogger(__name__)

#: a prepared task that has not arrived this long after it was prepared is discarded (a roll paused, a plan
#: replaced): what a prepare holds (a Spark session and plan) is not kept for a task that may never come
PREPARED_TTL_S = 120.0
#: the most tasks prepared (or being prepared) at once: a broker receives a few waves of a roll step at a time
MAX_PREPARED = 64
#: threads that prepare (a runner's prepare blocks: a Spark plan's analysis, a simulated latency)
WARMUP_THREADS = 4


@dataclass(frozen=True)
class Decision:
    """What the warm-up does now: tasks to prepare, prepared tasks to discard, prepared tasks that arrived
    (their start took what was prepared: forgotten, not discarded)."""

    prepare: tuple[str, ...] = ()
    discard: tuple[str, ...] = ()
    arrived: tuple[str, ...] = ()


def decide(
    incoming: Collection[str],
    prepared: Mapping[str, float],
    preparing: Collection[str],
    desired: Collection[str],
    running: Collection[str],
    expired: Collection[str],
    now: float,
    ttl_s: float = PREPARED_TTL_S,
    limit: int = MAX_PREPARED,
    fenced: bool = False,
) -> Decision:
    """The warm-up's rule. ``prepared``: task -> when its prepare finished; ``preparing``: prepares under
    way; ``expired``: tasks discarded for age while still announced (not prepared again until announced
    anew). Fenced: everything prepared is discarded and nothing is prepared."""
    if fenced:
        return Decision(discard=tuple(sorted(prepared)))
    arrived = tuple(sorted(t for t in prepared if t in running))
    discard = tuple(
        sorted(
            t
            for t, since in prepared.items()
            if t not in running and t not in desired and (t not in incoming or now - since > ttl_s)
        )
    )
    room = limit - (len(prepared) - len(arrived) - len(discard)) - len(preparing)
    prepare: list[str] = []
    for t in incoming:
        if room <= 0:
            break
        if t in prepared or t in preparing or t in desired or t in running or t in expired:
            continue
        prepare.append(t)
        room -= 1
    return Decision(tuple(prepare), discard, arrived)


def announced(a: Assignment, generation: int, incarnation: str) -> tuple[str, ...] | None:
    """The tasks an assignment announces, if the member took it as its own (its generation, this life of the
    member under reconcile, no error); None: an assignment it ignored (stale, an error, another life's)."""
    if a.error is not None or a.generation != generation:
        return None
    if a.protocol == RECONCILE and a.incarnation != incarnation:
        return None
    out = []
    for t in a.incoming:
        try:
            out.append(check_name("task id", t))
        except InvalidName:
            continue  # (bounded and unique already: the codec checked)
    return tuple(out)


class WarmUp:
    """Prepares the tasks announced to this broker, discards what does not come. Thread-safe: ``announce`` on
    the event thread, ``review`` also on the status thread, ``drop_all`` from the fence's thread."""

    def __init__(
        self,
        broker_id: str,
        client: KazooClient,
        layout: ZkLayout,
        runner: TaskRunner,
        *,
        desired: Callable[[], Collection[str]],
        running: Callable[[], Collection[str]],
        fenced: Callable[[], bool],
        ttl_s: float = PREPARED_TTL_S,
        limit: int = MAX_PREPARED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = broker_id
        self.client = client
        self.layout = layout
        self.runner = runner
        self.desired = desired
        self.running = running
        self.fenced = fenced
        self.ttl_s = ttl_s
        self.limit = limit
        self.clock = clock
        self._lock = threading.Lock()
        self._incoming: tuple[str, ...] = ()
        self._prepared: dict[str, float] = {}
        self._preparing: set[str] = set()
        self._expired: set[str] = set()
        #: bumped by ``drop_all``: a prepare begun before it is discarded when it ends
        self._era = 0
        self._closed = False
        self.pool = ThreadPoolExecutor(max_workers=WARMUP_THREADS, thread_name_prefix=f"worker-{broker_id}-warmup")
        #: counters (what a test or a benchmark reads): prepares done, starts that found their task prepared,
        #: discards
        self.prepares = 0
        self.arrivals = 0
        self.discards = 0

    def prepared(self) -> set[str]:
        with self._lock:
            return set(self._prepared)

    def announce(self, incoming: tuple[str, ...]) -> None:
        """The member took an assignment announcing ``incoming`` (the whole announcement: what it no longer
        names is discarded unless assigned)."""
        with self._lock:
            self._incoming = incoming
            self._expired &= set(incoming)
        self.review()

    def review(self) -> None:
        """Apply ``decide`` now (after an announcement, and on the status thread's every pass: the age bound)."""
        desired, running, fenced = set(self.desired()), set(self.running()), self.fenced()
        with self._lock:
            if self._closed:
                return
            d = decide(
                self._incoming,
                self._prepared,
                self._preparing,
                desired,
                running,
                self._expired,
                self.clock(),
                self.ttl_s,
                self.limit,
                fenced,
            )
            for t in d.arrived:
                del self._prepared[t]
            for t in d.discard:
                del self._prepared[t]
                if t in self._incoming:
                    self._expired.add(t)
            self._preparing.update(d.prepare)
            era = self._era
            self.arrivals += len(d.arrived)
            self.discards += len(d.discard)
        for t in d.discard:
            log.info("worker %s: %s was prepared and did not arrive; discarded", self.id, t)
            self._discard(t)
        for t in d.prepare:
            self.pool.submit(self._prepare, t, era)

    def drop_all(self, why: str) -> None:
        """The fence, a lost session, the end: nothing stays prepared, nothing announced is prepared any more
        (a prepare under way is discarded when it ends). Never waits for a prepare."""
        with self._lock:
            self._era += 1
            self._incoming = ()
            dropped, self._prepared = list(self._prepared), {}
            self._expired.clear()
            self.discards += len(dropped)
        if dropped:
            log.info("worker %s: %s: %d prepared tasks discarded", self.id, why, len(dropped))
        for t in dropped:
            self._discard(t)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.drop_all("stopping")
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ---- the warm-up threads ------------------------------------------------------------------------
    def _prepare(self, t: str, era: int) -> None:
        done = False
        try:
            with self._lock:
                wanted = era == self._era and not self._closed and t in self._incoming
            if not wanted or self.fenced():
                return
            try:
                data, _ = self.client.get(self.layout.task(t))
                spec = decode_task(data, self.layout.task(t))
            except Exception as exc:  # (a connection loss or timeout, a spec gone bad: the start reads it again)
                log.info("worker %s: cannot prepare %s: %s", self.id, t, type(exc).__name__)
                return
            try:
                done = self.runner.prepare(t, spec)
            except Exception as exc:  # a prepare is an optimisation: the start does it all as before
                log.info("worker %s: preparing %s failed (%s: %s)", self.id, t, type(exc).__name__, exc)
        finally:
            keep = False
            with self._lock:
                self._preparing.discard(t)
                if done and era == self._era and not self._closed:
                    self._prepared[t] = self.clock()
                    self.prepares += 1
                    keep = True
            if done and (not keep or self.fenced()):
                self._discard(t)  # the fence or the end came while it prepared
                with self._lock:
                    self._prepared.pop(t, None)
        if keep:
            self.review()  # (it may have arrived, or left the announcement, while it prepared)

    def _discard(self, t: str) -> None:
        try:
            self.runner.discard(t)
        except Exception as exc:
            log.warning("worker %s: discarding the prepared %s: %s", self.id, t, exc)
