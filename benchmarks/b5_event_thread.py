"""B5 — the controller's event thread under a storm of task changes.

A stable group (brokers in a farm child process, the controller here) gets, as fast as fenced multis can
write them: (a) a ``task restart`` of every task (restart nonce bumped: one TaskConfigChange each, no
rebalance), (b) a weight change of every task (the group's task descriptors change: rebalances), (c)
as many new tasks again (TaskChange; rebalances).

Every event the thread processes is recorded through its ``observe`` hook (type, time queued, time
processing), and the raw events a merged event absorbed through its ``on_merge`` hook (the event thread
merges a run of per-znode re-reads into one plural event: docs/zookeeper-io.md, "The event thread").

A storm has been processed once the controller has taken a watch event for every change written (raw
``TaskConfigChange`` events, ``count + merged``, grown by the number of specs set), or, for the create
storm, once every new task is in the controller's context; then it settles (queue empty, thread idle,
group Stable, every task running). Both waits are bounded and fail loudly. Reported per storm: changes/s
(changes written / "storm s", the seconds from the first write to the event that processed the last
change), events processed (a merged event counts once), raw watch events taken (``count + merged``),
queue time p50/p99 per processed event, when the storm's last event ran (its rebalances included) and
when it was seen settled, and the costliest event types.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.cluster import Cluster
from benchmarks.common import Bench, median, percentile, table, target, zookeeper
from controller.admin import wait_for
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

NAME = "b5_event_thread"
TITLE = "B5 event thread under a task-change storm"

PROCESSED_TIMEOUT_S = 300.0  # every change written seen and processed by the controller
SETTLE_TIMEOUT_S = 300.0  # then the group Stable and every task running


@dataclass
class Item:
    """One processed event: when it finished, its type, queue and processing time, and the raw events it
    stands for (itself, or the events merged into it)."""

    t: float
    name: str
    queued: float
    elapsed: float
    raw: Counter = field(default_factory=Counter)
    merged: bool = False


class Recorder:
    """Wraps the event thread's ``observe`` and ``on_merge`` hooks (both called on the event thread, after
    each event, ``on_merge`` after ``observe``). While recording, ``goal`` is evaluated after each event
    and the time of the first event after which it holds is kept in ``done_t``."""

    def __init__(self, ctl: Any) -> None:
        self.ctl = ctl
        self.lock = threading.Lock()
        self.items: list[Item] = []
        self.raw: Counter = Counter()  # raw events taken while recording, per type
        self.recording = False
        self.goal: Callable[[Recorder], bool] | None = None
        self.done_t: float | None = None
        self.done = threading.Event()
        self._orig_observe = ctl.thread._observe
        self._orig_on_merge = ctl.thread._on_merge

        def observe(name: str, queued: float, elapsed: float) -> None:
            if self.recording:
                with self.lock:
                    self.items.append(Item(time.monotonic(), name, queued, elapsed, Counter({name: 1})))
                    self.raw[name] += 1  # until on_merge says the event stood for merged ones
                self._check()
            if self._orig_observe is not None:
                self._orig_observe(name, queued, elapsed)

        def on_merge(name: str, n: int) -> None:
            if self.recording:
                with self.lock:
                    if self.items:
                        last = self.items[-1]
                        if not last.merged:  # the merged event itself is not a raw event
                            self.raw -= last.raw
                            last.raw = Counter()
                            last.merged = True
                        last.raw[name] += n
                        self.raw[name] += n
                self._check()
            if self._orig_on_merge is not None:
                self._orig_on_merge(name, n)

        ctl.thread._observe = observe
        ctl.thread._on_merge = on_merge

    def _check(self) -> None:
        if self.done_t is None and self.goal is not None and self.goal(self):
            with self.lock:
                self.done_t = self.items[-1].t if self.items else time.monotonic()
            self.done.set()

    def start(self, goal: Callable[[Recorder], bool]) -> None:
        with self.lock:
            self.items, self.raw, self.done_t = [], Counter(), None
            self.goal = goal
        self.done.clear()
        self.recording = True

    def raw_count(self, name: str) -> int:
        with self.lock:
            return self.raw[name]

    def stop(self) -> list[Item]:
        self.recording = False
        with self.lock:
            self.goal = None
            return list(self.items)


def _write_specs(cluster: Cluster, specs: list[TaskSpec], create: bool) -> None:
    pending = []
    for lo in range(0, len(specs), 500):
        tx = cluster.admin.transaction()
        for s in specs[lo : lo + 500]:
            if create:
                tx.create(cluster.layout.task(s.id), s.encode())
            else:
                tx.set_data(cluster.layout.task(s.id), s.encode())
        pending.append(tx.commit_async())
    for p in pending:
        p.get(timeout=120)


def _raw_taken(snap: dict[str, Any], name: str) -> int:
    s = snap.get(name)
    return 0 if s is None else s.count + s.merged


def _storm(
    bench: Bench, cluster: Cluster, rec: Recorder, name: str, specs: list[TaskSpec], create: bool, expect_tasks: int
) -> dict[str, Any]:
    ctl = cluster.controllers[0]
    n = len(specs)
    if create:
        new_ids = [s.id for s in specs]
        tasks = ctl.ctx.tasks  # read on the event thread, in the hook, right after an event

        def goal(_r: Recorder) -> bool:
            return all(t in tasks for t in new_ids)
    else:

        def goal(r: Recorder) -> bool:
            return r.raw["TaskConfigChange"] >= n  # called with the recorder's counts up to date

    snap0 = ctl.thread.snapshot()
    rec.start(goal)
    t0 = time.monotonic()
    _write_specs(cluster, specs, create)
    t_written = time.monotonic()
    cluster.tasks = expect_tasks

    # 1. the controller has seen (and processed) every change
    if not rec.done.wait(PROCESSED_TIMEOUT_S):
        rec.stop()
        seen = (
            f"{sum(t in ctl.ctx.tasks for t in new_ids)}/{n} new tasks in the controller's context"
            if create
            else f"{rec.raw_count('TaskConfigChange')}/{n} TaskConfigChange watch events taken"
        )
        raise RuntimeError(
            f"B5 storm {name!r}: not processed after {PROCESSED_TIMEOUT_S:.0f}s: {seen}, "
            f"queue {ctl.thread.queue_size()}, thread busy with {ctl.thread.current}"
        )

    # 2. then it settles: nothing queued or running, the group Stable, every task running
    def settled() -> bool:
        return (
            ctl.thread.queue_size() == 0
            and ctl.thread.current is None
            and cluster.stable()
            and cluster.farm_converged()
        )

    if not wait_for(settled, SETTLE_TIMEOUT_S, 0.05):
        rec.stop()
        raise RuntimeError(
            f"B5 storm {name!r}: processed but not settled after {SETTLE_TIMEOUT_S:.0f}s "
            f"(queue {ctl.thread.queue_size()}, stable {cluster.stable()}, farm {cluster.farm.call('status')})"
        )
    t_settled = time.monotonic()
    items = rec.stop()
    snap1 = ctl.thread.snapshot()
    assert rec.done_t is not None
    storm_s = rec.done_t - t0
    t_last = max((it.t for it in items), default=t0)
    queued = [it.queued for it in items]
    busy = sum(it.elapsed for it in items)
    raw = Counter()
    for it in items:
        raw.update(it.raw)
    by_type: dict[str, list[float]] = defaultdict(list)
    for it in items:
        by_type[it.name].append(it.elapsed)
    events_to_done = sum(1 for it in items if it.t <= rec.done_t)
    res = {
        "storm": name,
        "changes": n,
        "settled": True,
        "events": len(items),  # processed, a merged event once
        "raw_events": sum(raw.values()),  # watch events taken: count + merged
        "raw_by_type": dict(raw.most_common()),
        "events_until_processed": events_to_done,
        # the thread's own stats over the storm, raw TaskConfigChange taken (count + merged): a cross-check
        "thread_raw_task_config_change": _raw_taken(snap1, "TaskConfigChange") - _raw_taken(snap0, "TaskConfigChange"),
        "write_s": round(t_written - t0, 3),
        "storm_s": round(storm_s, 3),  # first write -> the event that processed the last change
        "changes_per_s": round(n / max(1e-9, storm_s), 1),
        "last_event_s": round(t_last - t0, 3),  # first write -> the storm's last event (incl. its rebalances)
        "settled_s": round(t_settled - t0, 3),  # first write -> seen settled (polled every 50 ms)
        "busy_s": round(busy, 3),
        "queue_p50_ms": round((percentile(queued, 50) or 0) * 1000, 2),
        "queue_p99_ms": round((percentile(queued, 99) or 0) * 1000, 2),
        "queue_max_ms": round(max(queued, default=0) * 1000, 2),
        "by_type": {
            k: {
                "count": len(v),
                "process_p50_ms": round((median(v) or 0) * 1000, 3),
                "process_total_s": round(sum(v), 3),
            }
            for k, v in sorted(by_type.items(), key=lambda kv: -sum(kv[1]))
        },
        "rebalances_in_storm": None,
    }
    bench.log(
        f"{name:<28} {n:>6} changes processed in {res['storm_s']:.2f}s: {res['changes_per_s']:,.0f} changes/s; "
        f"{len(items)} events ({res['raw_events']} raw), queue p50 {res['queue_p50_ms']} ms p99 {res['queue_p99_ms']} ms; "
        f"last event at {res['last_event_s']:.2f}s, settled at {res['settled_s']:.2f}s"
    )
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
            # a spec changed before its watch is armed comes back as the armer's TaskConfigChanges, not as a
            # TaskConfigChange: start once every task's watch is armed
            if not wait_for(
                lambda: ctl.loader.watch_armer is None or ctl.loader.watch_armer.took_s is not None, 60, 0.1
            ):
                raise RuntimeError("the controller did not arm every task's watch within 60s")
            rec = Recorder(ctl)
            ids = list(cluster.task_ids)
            coord = ctl.ctx.groups["default"]
            r0 = coord.rebalances
            res = _storm(
                bench,
                cluster,
                rec,
                "restart every task (nonce)",
                [TaskSpec(id=t, restart_nonce=1, pipeline=NoopPipeline(kind="noop")) for t in ids],
                False,
                tasks,
            )
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
            r0 = coord.rebalances
            res = _storm(
                bench,
                cluster,
                rec,
                "re-weight every task",
                [TaskSpec(id=t, restart_nonce=1, weight=2, pipeline=NoopPipeline(kind="noop")) for t in ids],
                False,
                tasks,
            )
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
            r0 = coord.rebalances
            new = [TaskSpec(id=f"new-{i:05d}", pipeline=NoopPipeline(kind="noop")) for i in range(tasks)]
            res = _storm(bench, cluster, rec, "create as many new tasks", new, True, 2 * tasks)
            res["rebalances_in_storm"] = coord.rebalances - r0
            storms.append(res)
        finally:
            cluster.close()
    rows = [
        [
            s["storm"],
            s["changes"],
            s["storm_s"],
            s["changes_per_s"],
            s["events"],
            s["raw_events"],
            s["queue_p50_ms"],
            s["queue_p99_ms"],
            s["last_event_s"],
            s["settled_s"],
            s["rebalances_in_storm"],
            ", ".join(f"{k} {v['process_p50_ms']} ms ({v['count']})" for k, v in list(s["by_type"].items())[:2]),
        ]
        for s in storms
    ]
    headers = [
        "storm",
        "changes",
        "storm s",
        "changes/s",
        "events",
        "raw events",
        "queue p50 ms",
        "queue p99 ms",
        "last event s",
        "settled s",
        "rebalances",
        "costliest types (p50 processing, count)",
    ]
    print(table(headers, rows))
    first = storms[0]
    targets = [
        target(
            "B5 changes/s (restart storm)",
            f"{first['changes_per_s']:,.0f}/s",
            "(measure)",
            None,
            f"{first['changes']:,} changes in {first['storm_s']:.2f} s: {first['events']} events "
            f"({first['raw_events']:,} raw), queue p50 {first['queue_p50_ms']} ms, p99 {first['queue_p99_ms']} ms",
        ),
    ]
    doc = {
        "setup": {"tasks": tasks, "brokers": brokers},
        "storms": storms,
        "table": {"headers": headers, "rows": rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
