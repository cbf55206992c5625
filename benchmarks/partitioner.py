"""The peer: kazoo's ``SetPartitioner`` recipe driving the same no-op tasks as our workers.

Each simulated broker has its own ``KazooClient`` (own session) and a ``SetPartitioner`` over the whole
task set. A driver thread follows the recipe's documented loop: when ``acquired`` it starts the tasks of
its partition (on a pool of the same size as our workers'), when ``release`` it stops them all and calls
``release_set``; leaving stops every task (in parallel, as our worker's graceful stop does), then
``finish``. Run intervals are recorded like our workers record them: ``start``/``end`` bound the useful
run (end = the moment the stop begins), ``acquired``/``released`` the time the partition's locks were
known to be held (observed ACQUIRED .. just before ``release_set``), so the double-ownership check is
the same one.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.partitioner import SetPartitioner

from broker_sim.runners.noop import NoopRunner
from broker_sim.sim.checker import close_open
from controller.protocol.records.task_records import RunInterval
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

DEFAULT_TIME_BOUNDARY_S = 30  # kazoo's own default for SetPartitioner(time_boundary=...)


class PartitionerBroker:
    def __init__(
        self,
        bid: str,
        hosts: str,
        path: str,
        tasks: list[str],
        time_boundary: float,
        start_latency_s: float,
        stop_latency_s: float,
        pool_size: int = 8,
        session_timeout_s: float = 6.0,
    ) -> None:
        self.id = bid
        self.tasks = tasks
        self.runner = NoopRunner(start_latency_s=start_latency_s, stop_latency_s=stop_latency_s)
        self.pool = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix=f"sp-{bid}-task")
        self.intervals: list[RunInterval] = []
        self.running: dict[str, float] = {}  # task -> start time
        self.lock = threading.Lock()
        self.acquired_at: float | None = None
        self.partition: frozenset[str] = frozenset()
        self.state_event = threading.Event()
        self._stop = threading.Event()
        self._pending: list[tuple[str, float, float]] = []
        self.client = KazooClient(hosts=hosts, timeout=session_timeout_s)
        self.client.start(timeout=30)
        self.part = SetPartitioner(
            self.client,
            path,
            set=tuple(tasks),
            identifier=bid,
            time_boundary=time_boundary,
            state_change_event=self.state_event,
        )
        self.thread = threading.Thread(target=self._loop, name=f"sp-{bid}-driver", daemon=True)
        self.thread.start()

    # ---- the recipe's loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        spec_cache: dict[str, TaskSpec] = {}
        while not self._stop.is_set():
            self.state_event.clear()
            p = self.part
            if p.failed:
                return
            if p.release:
                self._stop_tasks(list(self.running), self.pool)
                released = time.time()
                self._close_intervals(released)
                self.acquired_at = None
                self.partition = frozenset()
                p.release_set()
                continue
            if p.acquired:
                if self.acquired_at is None:
                    self.acquired_at = time.time()
                    self.partition = frozenset(p)
                want = [t for t in sorted(self.partition) if t not in self.running]
                if want:
                    futures = [
                        self.pool.submit(
                            self._start, t, spec_cache.setdefault(t, TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")))
                        )
                        for t in want
                    ]
                    wait(futures, timeout=120)
                    continue
            self.state_event.wait(0.05)

    def _start(self, t: str, spec: TaskSpec) -> None:
        self.runner.start(t, spec, 0)
        with self.lock:
            self.running[t] = time.time()

    def _stop_one(self, t: str) -> None:
        with self.lock:
            started = self.running.get(t)
        if started is None:
            return
        end = time.time()
        self.runner.stop(t)
        with self.lock:
            self.running.pop(t, None)
            self._pending.append((t, started, end))

    def _stop_tasks(self, tasks: list[str], pool: ThreadPoolExecutor) -> None:
        self._pending = []
        futures = [pool.submit(self._stop_one, t) for t in tasks]
        wait(futures, timeout=120)

    def _close_intervals(self, released: float) -> None:
        with self.lock:
            for t, start, end in self._pending:
                self.intervals.append(
                    RunInterval(
                        task_id=t,
                        broker=self.id,
                        start=start,
                        end=end,
                        generation=0,
                        acquired=self.acquired_at,
                        released=released,
                    )
                )
            self._pending = []

    # ---- lifecycle -------------------------------------------------------------------------------------
    def leave(self) -> None:
        """A clean stop: tasks stopped (in parallel), locks released, party left, session closed."""
        self._stop.set()
        self.state_event.set()
        self.thread.join(60)
        with self.lock:
            running = list(self.running)
        if running:
            with ThreadPoolExecutor(max_workers=min(32, len(running)), thread_name_prefix=f"sp-{self.id}-stop") as ex:
                self._stop_tasks(running, ex)
        self._close_intervals(time.time())
        try:
            self.part.finish()
        finally:
            self.client.stop()
            self.client.close()
            self.pool.shutdown(wait=True, cancel_futures=True)

    def open_intervals(self) -> list[RunInterval]:
        with self.lock:
            return [
                RunInterval(task_id=t, broker=self.id, start=s, end=None, generation=0, acquired=self.acquired_at)
                for t, s in self.running.items()
            ]

    def running_tasks(self) -> set[str]:
        with self.lock:
            return set(self.running)


class PartitionerCluster:
    """Brokers over one partition path; the same observation API as ``broker_sim.sim.simulator.Simulation``."""

    def __init__(
        self,
        hosts: str,
        path: str,
        task_ids: list[str],
        time_boundary: float,
        start_latency_s: float,
        stop_latency_s: float,
        pool_size: int = 8,
        session_timeout_s: float = 6.0,
    ) -> None:
        self.hosts = hosts
        self.path = path
        self.task_ids = task_ids
        self.kw: dict[str, Any] = dict(
            time_boundary=time_boundary,
            start_latency_s=start_latency_s,
            stop_latency_s=stop_latency_s,
            pool_size=pool_size,
            session_timeout_s=session_timeout_s,
        )
        self.workers: dict[str, PartitionerBroker] = {}
        self.intervals_done: list[RunInterval] = []

    def start_worker(self, bid: str) -> PartitionerBroker:
        w = PartitionerBroker(bid, self.hosts, self.path, self.task_ids, **self.kw)
        self.workers[bid] = w
        return w

    def leave(self, bid: str) -> None:
        w = self.workers.pop(bid)
        w.leave()
        self.intervals_done += w.intervals

    def converged(self) -> bool:
        ws = list(self.workers.values())
        if not ws or not all(w.part.acquired for w in ws):
            return False
        seen: dict[str, int] = {}
        for w in ws:
            running = w.running_tasks()
            if running != set(w.partition):
                return False
            for t in running:
                seen[t] = seen.get(t, 0) + 1
        return len(seen) == len(self.task_ids) and all(v == 1 for v in seen.values())

    def all_intervals(self) -> list[RunInterval]:
        now = time.time()
        out = list(self.intervals_done)
        for w in self.workers.values():
            out += list(w.intervals) + w.open_intervals()
        return close_open(out, now)

    def close(self) -> None:
        for bid in list(self.workers):
            try:
                self.leave(bid)
            except Exception:
                pass
