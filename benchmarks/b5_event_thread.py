"""B5 — the controller's event thread under a storm of task changes.

A stable group (brokers in a farm child process, the controller here) gets, as fast as fenced multis can
write them: (a) a ``task restart`` of every task (restart nonce bumped: one TaskConfigChange each, no
rebalance), (b) a weight change of every task (the group's task descriptors change: rebalances), (c)
as many new tasks again (TaskChange; rebalances). Every event the thread processes is recorded (type,
time queued, time processing) through the thread's ``observe`` hook; a storm ends when the queue is
empty and the group is Stable again with every task running. Reported per storm: events/s over the
storm (processed events / time from the first write to the last event), the thread's capacity (events
per busy second), queue time p50/p99 and the slowest event types.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from benchmarks.cluster import Cluster
from benchmarks.common import Bench, median, percentile, table, target, zookeeper
from controller.admin import wait_for
from controller.taskspec import TaskSpec

NAME = "b5_event_thread"
TITLE = "B5 event thread under a task-change storm"


class Recorder:
    def __init__(self, ctl: Any) -> None:
        self.ctl = ctl
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, float, float]] = []
        self.recording = False
        self._orig = ctl.thread._observe

        def observe(name: str, queued: float, elapsed: float) -> None:
            if self.recording:
                with self.lock:
                    self.items.append((time.monotonic(), name, queued, elapsed))
            if self._orig is not None:
                self._orig(name, queued, elapsed)

        ctl.thread._observe = observe

    def start(self) -> None:
        with self.lock:
            self.items = []
        self.recording = True

    def stop(self) -> list[tuple[float, str, float, float]]:
        self.recording = False
        with self.lock:
            return list(self.items)


def _write_specs(cluster: Cluster, specs: list[TaskSpec], create: bool) -> None:
    pending = []
    for lo in range(0, len(specs), 500):
        tx = cluster.admin.transaction()
        for s in specs[lo:lo + 500]:
            if create:
                tx.create(cluster.layout.task(s.id), s.encode())
            else:
                tx.set_data(cluster.layout.task(s.id), s.encode())
        pending.append(tx.commit_async())
    for p in pending:
        p.get(timeout=120)


def _storm(bench: Bench, cluster: Cluster, rec: Recorder, name: str, specs: list[TaskSpec], create: bool,
           expect_tasks: int) -> dict[str, Any]:
    ctl = cluster.controllers[0]
    rec.start()
    t0 = time.monotonic()
    _write_specs(cluster, specs, create)
    t_written = time.monotonic()
    cluster.tasks = expect_tasks

    def settled() -> bool:
        return ctl.thread.queue_size() == 0 and ctl.thread.current is None and cluster.stable() and cluster.farm_converged()

    ok = wait_for(settled, 600, 0.2)
    items = rec.stop()
    t_last = max((t for t, *_ in items), default=t0)
    queued = [q for _, _, q, _ in items]
    busy = sum(e for *_, e in items)
    by_type: dict[str, list[float]] = defaultdict(list)
    for _, n, q, e in items:
        by_type[n].append(e)
    res = {
        "storm": name, "changes": len(specs), "settled": ok, "events": len(items),
        "write_s": round(t_written - t0, 3), "storm_s": round(t_last - t0, 3),
        "events_per_s": round(len(items) / max(1e-9, t_last - t0), 1),
        "capacity_events_per_busy_s": round(len(items) / max(1e-9, busy), 1),
        "busy_s": round(busy, 3),
        "queue_p50_ms": round((percentile(queued, 50) or 0) * 1000, 2),
        "queue_p99_ms": round((percentile(queued, 99) or 0) * 1000, 2),
        "queue_max_ms": round(max(queued, default=0) * 1000, 2),
        "by_type": {n: {"count": len(v), "process_p50_ms": round((median(v) or 0) * 1000, 3),
                        "process_total_s": round(sum(v), 3)} for n, v in sorted(by_type.items(), key=lambda kv: -sum(kv[1]))},
        "rebalances_in_storm": None,
    }
    bench.log(f"{name:<28} {len(specs):>6} changes → {len(items):>6} events in {res['storm_s']:.2f}s: "
              f"{res['events_per_s']:,.0f} events/s, queue p50 {res['queue_p50_ms']} ms p99 {res['queue_p99_ms']} ms")
    return res


def run(bench: Bench) -> dict[str, Any]:
    tasks, brokers = (500, 5) if bench.quick else (2000, 10)
    storms = []
    with zookeeper(heap_mb=1024, name="b5") as zk:
        cluster = Cluster(zk.address, tasks, brokers, name="b5", session_timeout_s=20.0)
        try:
            cluster.create_tasks()
            ctl = cluster.start_controller("ctl-b5")
            ctl.wait_active(60)
            cluster.start_farm()
            if cluster.wait_converged(180) is None:
                raise RuntimeError("the cluster did not converge")
            rec = Recorder(ctl)
            ids = list(cluster.task_ids)
            coord = ctl.ctx.groups["default"]
            r0 = coord.rebalances
            res = _storm(bench, cluster, rec, "restart every task (nonce)", [TaskSpec(id=t, restart_nonce=1) for t in ids], False, tasks)
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
            r0 = coord.rebalances
            res = _storm(bench, cluster, rec, "re-weight every task", [TaskSpec(id=t, restart_nonce=1, weight=2) for t in ids], False, tasks)
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
            r0 = coord.rebalances
            new = [TaskSpec(id=f"new-{i:05d}") for i in range(tasks)]
            res = _storm(bench, cluster, rec, "create as many new tasks", new, True, 2 * tasks)
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
        finally:
            cluster.close()
    rows = [[s["storm"], s["changes"], s["events"], s["storm_s"], s["events_per_s"], s["capacity_events_per_busy_s"],
             s["queue_p50_ms"], s["queue_p99_ms"], s["rebalances_in_storm"],
             ", ".join(f"{n} {v['process_p50_ms']} ms" for n, v in list(s["by_type"].items())[:2])] for s in storms]
    headers = ["storm", "changes", "events", "storm s", "events/s", "events/busy s", "queue p50 ms", "queue p99 ms",
               "rebalances", "costliest types (p50 processing)"]
    print(table(headers, rows))
    first = storms[0]
    targets = [
        target("B5 events/s (restart storm)", f"{first['events_per_s']:,.0f}/s", "(measure)", None,
               f"queue p50 {first['queue_p50_ms']} ms, p99 {first['queue_p99_ms']} ms"),
    ]
    doc = {"setup": {"tasks": tasks, "brokers": brokers}, "storms": storms, "table": {"headers": headers, "rows": rows},
           "targets": targets}
    bench.write(NAME, doc)
    return doc
