"""Reporting: the status thread polls the runner, writes changed statuses in batches, and flushes the
recorded run intervals (what the independent checker reads)."""

from __future__ import annotations

import logging
import time

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from broker_sim.runners import RunState
from broker_sim.worker.slots import TaskSlot
from controller.protocol import codecs
from controller.protocol.codecs import RunInterval, TaskStatus

log = logging.getLogger(__name__)


MAX_INTERVALS_IN_ZK = 5000


class Reporting:
    """Task statuses and run intervals."""

    def _record(self, t: str, slot: TaskSlot, end: float, released: float | None) -> None:
        if slot.started is not None:
            self.intervals.append(RunInterval(task_id=t, broker=self.id, start=slot.started, end=end,
                                              generation=self.generation, acquired=slot.acquired, released=released))
        slot.started = None

    def open_intervals(self) -> list[RunInterval]:
        with self.lock:
            return [RunInterval(task_id=t, broker=self.id, start=s.started, end=None, generation=self.generation,
                                acquired=s.acquired) for t, s in self.slots.items() if s.running and s.started]

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
                    slot.metrics_dirty = True
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
        """Write the statuses whose state changed, and those whose metrics alone changed once their last write
        is ``metrics_interval_s`` old: a metric such as an uptime changes at every poll, and rewriting every
        task's status for it is most of what a broker (and ZooKeeper) would spend on statuses. Under
        ``status_lock``: a release marks its tasks either before (they are left out) or after this write."""
        with self.status_lock:
            self._write_dirty_statuses()

    def _write_dirty_statuses(self) -> None:
        now = time.time()
        tick = time.monotonic()
        metrics_due = tick - self.config.metrics_interval_s
        with self.lock:
            dirty = [(t, s) for t, s in self.slots.items()
                     if (s.dirty or (s.metrics_dirty and s.written_at <= metrics_due)) and s.held and not s.releasing]
            for _, s in dirty:
                s.dirty = s.metrics_dirty = False
                s.written_at = tick
            items = [(self.layout.status(t), codecs.encode(TaskStatus(
                broker=self.id, state=s.state, generation=self.generation, updated=now, error=s.error, trace=s.trace,
                failures=s.failures, metrics=s.metrics, session=codecs.session_hex(self.session_id))))
                for t, s in dirty]
        if items:
            try:
                self.status_writer.upsert(items, self.known_status, self.status_versions)
            except Exception:
                with self.lock:  # not written: the next poll writes them again, nothing is lost
                    for t, s in dirty:
                        if self.slots.get(t) is s:
                            s.dirty = True
                raise

    def _flush_intervals(self, force: bool = False) -> None:
        """Write this broker's interval log when it changed (a run started or ended): an open interval stays
        the same while its task runs, and rewriting a hundred tasks' log every flush was most of the bytes a
        quiet cluster sent ZooKeeper."""
        if not force and time.monotonic() - self._last_flush < self.config.intervals_flush_s:
            return
        self._last_flush = time.monotonic()
        recent = (list(self.intervals) + self.open_intervals())[-MAX_INTERVALS_IN_ZK:]
        if not recent or recent == self._flushed or not self.client.connected:
            return
        data = codecs.encode(codecs.IntervalLog(broker=self.id, intervals=tuple(recent)))
        try:
            self.status_writer.upsert([(self.layout.broker_intervals(self.id), data)], self.known_status)
        except Exception:
            return
        self._flushed = recent
