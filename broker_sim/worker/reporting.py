"""Reporting: the statuses of the tasks a worker holds, written in batches, and the recorded run intervals
(what the independent checker reads), flushed to ZooKeeper. The status thread (the worker's) drives it;
a release takes its ``status_lock`` to write a task's last status itself."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable

from kazoo.client import KazooClient

from broker_sim.worker.registration import BrokerSession
from broker_sim.worker.slots import TaskSlot, TaskTable
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, task_records
from controller.protocol.records.task_records import RunInterval, TaskStatus
from controller.zk.io import FencedWriter

MAX_INTERVALS_IN_ZK = 5000


class Reporter:
    """Task statuses and run intervals: what was written (paths, versions), what ran and when."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        session: BrokerSession,
        table: TaskTable,
        metrics_interval_s: float,
        intervals_flush_s: float,
    ) -> None:
        self.client = client
        self.layout = layout
        self.session = session
        self.table = table
        self.metrics_interval_s = metrics_interval_s
        self.intervals_flush_s = intervals_flush_s
        self.intervals: collections.deque[RunInterval] = collections.deque(maxlen=100_000)
        self.status_writer = FencedWriter(client, None)
        self.known_status: set[str] = set()
        #: data version of each status we wrote last (what a release's conditional write expects to find)
        self.status_versions: dict[str, int] = {}
        #: told of each status written (the task's own log notes its state changes)
        self.on_status: Callable[[str, str, str | None], None] | None = None
        #: a status write of the status loop and a release's marking of its tasks, one at a time
        self.status_lock = threading.Lock()
        self._last_flush = 0.0
        self._flushed: list[RunInterval] = []  # the interval log as last written (an unchanged one is not rewritten)

    # ---- run intervals ----------------------------------------------------------------------------
    def record(self, t: str, slot: TaskSlot, end: float, released: float | None) -> None:
        """A run of ``t`` ended at ``end`` (its owner znode let go at ``released``, if it was). Called holding
        the table's lock."""
        if slot.started is not None:
            self.intervals.append(
                RunInterval(
                    task_id=t,
                    broker=self.session.broker_id,
                    start=slot.started,
                    end=end,
                    generation=self.session.generation,
                    acquired=slot.acquired,
                    released=released,
                )
            )
        slot.started = None

    def open_intervals(self) -> list[RunInterval]:
        with self.table.lock:
            return [
                RunInterval(
                    task_id=t,
                    broker=self.session.broker_id,
                    start=s.started,
                    end=None,
                    generation=self.session.generation,
                    acquired=s.acquired,
                )
                for t, s in self.table.slots.items()
                if s.running and s.started
            ]

    def flush_intervals(self, force: bool = False) -> None:
        """Write this broker's interval log when it changed (a run started or ended): an open interval stays
        the same while its task runs, and rewriting a hundred tasks' log every flush was most of the bytes a
        quiet cluster sent ZooKeeper."""
        if not force and time.monotonic() - self._last_flush < self.intervals_flush_s:
            return
        self._last_flush = time.monotonic()
        recent = (list(self.intervals) + self.open_intervals())[-MAX_INTERVALS_IN_ZK:]
        if not recent or recent == self._flushed or not self.client.connected:
            return
        who = self.session.broker_id
        data = codecs.encode(task_records.IntervalLog(broker=who, intervals=tuple(recent)))
        try:
            self.status_writer.upsert([(self.layout.broker_intervals(who), data)], self.known_status)
        except Exception:
            return
        self._flushed = recent

    # ---- statuses -----------------------------------------------------------------------------------
    def write_statuses(self) -> None:
        """Write the statuses whose state changed, and those whose metrics alone changed once their last write
        is ``metrics_interval_s`` old: a metric such as an uptime changes at every poll, and rewriting every
        task's status for it is most of what a broker (and ZooKeeper) would spend on statuses. Under
        ``status_lock``: a release marks its tasks either before (they are left out) or after this write."""
        with self.status_lock:
            self._write_dirty_statuses()

    def _write_dirty_statuses(self) -> None:
        now = time.time()
        tick = time.monotonic()
        metrics_due = tick - self.metrics_interval_s
        session = self.session
        with self.table.lock:
            dirty = [
                (t, s)
                for t, s in self.table.slots.items()
                if (s.dirty or (s.metrics_dirty and s.written_at <= metrics_due)) and s.held and not s.releasing
            ]
            for _, s in dirty:
                s.dirty = s.metrics_dirty = False
                s.written_at = tick
            items = [
                (
                    self.layout.status(t),
                    codecs.encode(
                        TaskStatus(
                            broker=session.broker_id,
                            state=s.state,
                            generation=session.generation,
                            updated=now,
                            error=s.error,
                            trace=s.trace,
                            failures=s.failures,
                            metrics=s.metrics,
                            session=task_records.session_hex(session.session_id),
                            revision=s.spec.revision if s.spec is not None else None,
                            last_failure=s.last_failure,
                        )
                    ),
                )
                for t, s in dirty
            ]
        if self.on_status is not None:
            for t, s in dirty:
                self.on_status(t, s.state, s.error)
        if items:
            try:
                self.status_writer.upsert(items, self.known_status, self.status_versions)
            except Exception:
                with self.table.lock:  # not written: the next poll writes them again, nothing is lost
                    for t, s in dirty:
                        if self.table.slots.get(t) is s:
                            s.dirty = True
                raise

    def final_statuses(self, tasks: list[str]) -> dict[str, bytes]:
        """The last status of each task let go, encoded; its slot is marked releasing (the status loop leaves
        it alone until the release is over). Called holding ``status_lock``: a status write the status loop
        has in flight ends first, or it would still write (create, even) a status the release writes too."""
        finals: dict[str, bytes] = {}
        session = self.session
        with self.table.lock:
            for t in tasks:
                slot = self.table.releasing(t)
                finals[t] = codecs.encode(
                    TaskStatus(
                        broker=session.broker_id,
                        state=slot.state,
                        generation=session.generation,
                        updated=time.time(),
                        error=slot.error,
                        trace=slot.trace,
                        failures=slot.failures,
                        metrics=slot.metrics,
                        session=task_records.session_hex(session.session_id),
                        revision=slot.spec.revision if slot.spec is not None else None,
                        last_failure=slot.last_failure,
                    )
                )
        return finals

    def released(self, status_paths: list[str]) -> None:
        """A release multi wrote these last statuses: they are there, their versions the next owner's to know."""
        self.known_status.update(status_paths)
        self.forget_versions(status_paths)

    def forget_versions(self, status_paths: Iterable[str]) -> None:
        """Versions of ours that are stale (someone wrote since) or no longer ours to know."""
        for p in status_paths:
            self.status_versions.pop(p, None)
