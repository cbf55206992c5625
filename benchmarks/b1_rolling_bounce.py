"""B1 — rolling bounce: every broker in turn stops cleanly, stays down for ``gap`` seconds and comes back
(same id); the next one goes once the cluster has converged. No-op tasks with 200 ms stop and 500 ms
start latency. Contenders: our eager, cooperative and reconcile protocols, cooperative with controlled shutdown,
cooperative with static membership (scheduled rebalance delay > gap), the controller's planned roll
(``zkctl broker roll``: each broker's tasks moved to brokers already rolled before it goes down), and the peer, kazoo's
``SetPartitioner`` recipe, driven through the same bounce with the same runner latencies.

Figures come from recorded run intervals through the independent checker (``broker_sim.sim.checker``):
task downtime (task-seconds with no running owner inside the bounce window), tasks moved, double
ownership; per-step convergence is the time from the broker's stop until every task runs exactly once,
balanced, group Stable. Each downtime gap is decomposed into stopping (old owner's runner stop),
hand-off (old owner released → new owner holds it: the protocol) and starting (owner held → runner
started: spec read, pool queueing, start latency), which shows what bounds each contender.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benchmarks.common import Bench, StackSampler, median, ratio, table, target, zookeeper
from benchmarks.partitioner import DEFAULT_TIME_BOUNDARY_S, PartitionerCluster
from broker_sim.sim.checker import double_ownership, downtime, moved_tasks
from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from broker_sim.sim.timeline import plot_timeline
from controller.admin import wait_for
from controller.protocol.group.rules import COOPERATIVE, EAGER, RECONCILE
from controller.protocol.records.task_records import RunInterval

NAME = "b1_rolling_bounce"
TITLE = "B1 rolling bounce"

START_LATENCY_S = 0.5
STOP_LATENCY_S = 0.2
POOL_SIZE = 8  # broker_sim.sim.simulator.Simulation.start_worker's pool; the peer's brokers get the same


def _contenders(delay_s: float) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("eager", dict(protocol=EAGER, assignor="sticky")),
        ("cooperative", dict(protocol=COOPERATIVE)),
        ("reconcile", dict(protocol=RECONCILE)),
        ("cooperative + controlled shutdown", dict(protocol=COOPERATIVE, controlled_shutdown=True)),
        (
            "cooperative + static membership",
            dict(protocol=COOPERATIVE, static_membership=True, scheduled_delay_s=delay_s),
        ),
        ("planned roll", dict(protocol=RECONCILE, scenario="roll", roll_wave=POOL_SIZE, roll_in_place=True)),
    ]


# ---- analysis of intervals ---------------------------------------------------------------------------
def decompose(intervals: Sequence[RunInterval], window: tuple[float, float]) -> dict[str, float]:
    """Sum, over every gap between consecutive runs of a task that restarted inside the window, of its
    stopping / hand-off / starting parts (task-seconds)."""
    t0, t1 = window
    by_task: dict[str, list[RunInterval]] = defaultdict(list)
    for i in intervals:
        by_task[i.task_id].append(i)
    out = {"stopping": 0.0, "handoff": 0.0, "starting": 0.0, "gaps": 0}
    for runs in by_task.values():
        runs.sort(key=lambda i: i.start)
        for prev, nxt in zip(runs, runs[1:]):
            if prev.end is None or not (t0 <= nxt.start <= t1):
                continue
            released = prev.released if prev.released is not None else prev.end
            acquired = nxt.acquired if nxt.acquired is not None else nxt.start
            released = min(max(released, prev.end), nxt.start)
            acquired = min(max(acquired, released), nxt.start)
            out["stopping"] += released - prev.end
            out["handoff"] += acquired - released
            out["starting"] += nxt.start - acquired
            out["gaps"] += 1
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def max_moves_per_task(intervals: Sequence[RunInterval], window: tuple[float, float]) -> int:
    """The most times one task started on another owner inside the window."""
    by_task: dict[str, list[RunInterval]] = defaultdict(list)
    for i in intervals:
        by_task[i.task_id].append(i)
    most = 0
    for runs in by_task.values():
        runs.sort(key=lambda i: i.start)
        most = max(
            most, sum(1 for a, b in zip(runs, runs[1:]) if window[0] <= b.start <= window[1] and a.broker != b.broker)
        )
    return most


def _summarise(
    name: str,
    intervals: list[RunInterval],
    tasks: list[str],
    window: tuple[float, float],
    steps: list[float | None],
    extra: dict[str, Any],
) -> dict[str, Any]:
    overlaps = double_ownership(intervals)
    down = downtime(intervals, tasks, window)
    return {
        "contender": name,
        "task_downtime_s": round(sum(down.values()), 3),
        "double_ownership": len(overlaps),
        "moved_tasks": moved_tasks(intervals, window),
        "step_convergence_s": steps,
        "step_convergence_median_s": median([s for s in steps if s is not None]),
        "window_s": round(window[1] - window[0], 3),
        "decomposition": decompose(intervals, window),
        "max_moves_per_task": max_moves_per_task(intervals, window),
        "overlaps": [str(o) for o in overlaps[:5]],
        **extra,
    }


def _plot(bench: Bench, key: str, title: str, intervals: list[RunInterval], every: int) -> str:
    tasks = sorted({i.task_id for i in intervals})
    keep = set(tasks[::every])
    shown = [i for i in intervals if i.task_id in keep]
    out = bench.png(f"b1_timeline_{key}")
    plot_timeline(shown, out, title=f"{title} ({len(keep)} of {len(tasks)} tasks shown)")
    return out.name


def _key(name: str) -> str:
    return (
        name.replace(" + ", "_").replace(" ", "_").replace("(", "").replace(")", "").replace("=", "").replace(",", "")
    )


# ---- our protocol --------------------------------------------------------------------------------------
def run_ours(
    bench: Bench, hosts: str, name: str, base: SimOptions, kw: dict[str, Any], profile: bool
) -> tuple[dict[str, Any], list[RunInterval]]:
    opts = replace(base, zk_hosts=hosts, **kw)
    sampler = StackSampler(interval=0.01, name="b1-sampler") if profile else None
    with Simulation(opts, echo=lambda s: None) as sim:
        if sampler:
            sampler.__enter__()
        try:
            s = sim.run()
        finally:
            if sampler:
                sampler.__exit__(None, None, None)
        intervals = sim.all_intervals()
        # the simulator's window (its first step starts it, the last convergence ends it)
        window = (s.steps[0]["started"], s.steps[0]["started"] + s.window_s)
        res = _summarise(
            name,
            intervals,
            sim.task_ids,
            window,
            [st["converged_s"] for st in s.steps],
            {"rebalances": s.rebalances, "sim_summary": {k: v for k, v in s.to_dict().items() if k != "steps"}},
        )
        ctl = sim.active_controller()
        if ctl is not None:
            snap = ctl.thread.snapshot()
            res["controller_events"] = {
                k: {"count": v.count, "process_s": round(v.process_time_s, 3), "queue_s": round(v.queue_time_s, 3)}
                for k, v in snap.items()
            }
        if sampler:
            res["profile"] = sampler.report()
    return res, intervals


# ---- the peer -------------------------------------------------------------------------------------------
def run_peer(
    bench: Bench, hosts: str, name: str, brokers: int, tasks: int, gap: float, time_boundary: float
) -> tuple[dict[str, Any], list[RunInterval]]:
    ids = [f"task-{i:05d}" for i in range(tasks)]
    path = f"/setpartitioner-{int(time.time() * 1000) % 10**8}"
    cluster = PartitionerCluster(
        hosts,
        path,
        ids,
        time_boundary=time_boundary,
        start_latency_s=START_LATENCY_S,
        stop_latency_s=STOP_LATENCY_S,
        pool_size=POOL_SIZE,
    )
    timeout = 3 * time_boundary + 60
    try:
        for i in range(brokers):
            cluster.start_worker(f"broker-{i:03d}")
        if not wait_for(cluster.converged, timeout, 0.02):
            raise RuntimeError("SetPartitioner cluster did not converge at start")
        steps: list[float | None] = []
        t_start = time.time()
        for i in range(brokers):
            bid = f"broker-{i:03d}"
            t0 = time.monotonic()
            cluster.leave(bid)
            time.sleep(gap)
            cluster.start_worker(bid)
            ok = wait_for(cluster.converged, timeout, 0.02)
            steps.append(round(time.monotonic() - t0, 3) if ok else None)
            bench.log(f"{name}: bounce {bid} converged in {steps[-1]}s")
        t_end = time.time()
        intervals = cluster.all_intervals()
        res = _summarise(name, intervals, ids, (t_start, t_end), steps, {"time_boundary_s": time_boundary})
    finally:
        cluster.close()
    return res, intervals


# ---- the benchmark -------------------------------------------------------------------------------------
def run(bench: Bench) -> dict[str, Any]:
    quick = bench.quick
    brokers, tasks = (2, 20) if quick else (10, 200)
    gap = 1.0
    delay = 5.0
    reps = 1 if quick else 3
    tuned_tb = 2.0
    base = SimOptions(
        brokers=brokers,
        tasks=tasks,
        scenario="rolling-bounce",
        restart_gap_s=gap,
        start_latency_s=START_LATENCY_S,
        stop_latency_s=STOP_LATENCY_S,
        converge_timeout_s=120.0,
    )
    contenders = _contenders(delay)
    peers = [(f"kazoo SetPartitioner (time_boundary={tuned_tb:g} s, tuned)", tuned_tb, reps)]
    if not quick:
        peers.insert(
            0,
            (f"kazoo SetPartitioner (time_boundary={DEFAULT_TIME_BOUNDARY_S} s, default)", DEFAULT_TIME_BOUNDARY_S, 1),
        )
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    plotted: dict[str, str] = {}
    every = 1 if tasks <= 60 else 4
    with zookeeper(heap_mb=512, name="b1") as zk:
        for r in range(reps):
            order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
            for name, kw in order:
                res, intervals = run_ours(
                    bench, zk.address, name, base, kw, profile=(r == 0 and not quick and name.startswith("cooperative"))
                )
                runs[name].append(res)
                bench.log(
                    f"rep {r + 1}/{reps} {name:<36} downtime {res['task_downtime_s']:9.1f} task-s  moved {res['moved_tasks']:4d}  "
                    f"double {res['double_ownership']}  steps {res['step_convergence_median_s']}s"
                )
                if r == 0 and not quick:
                    plotted[name] = _plot(bench, _key(name), f"B1 rolling bounce — {name}", intervals, every)
            for name, tb, n in peers:
                if r >= n:
                    continue
                res, intervals = run_peer(bench, zk.address, name, brokers, tasks, gap, tb)
                runs[name].append(res)
                bench.log(
                    f"rep {r + 1}/{n} {name:<36} downtime {res['task_downtime_s']:9.1f} task-s  moved {res['moved_tasks']:4d}  "
                    f"double {res['double_ownership']}  steps {res['step_convergence_median_s']}s"
                )
                if r == 0 and not quick:
                    plotted[name] = _plot(
                        bench,
                        _key(name.split(" (")[0] + "_tb" + f"{tb:g}"),
                        f"B1 rolling bounce — {name}",
                        intervals,
                        every,
                    )
    # ---- table -----------------------------------------------------------------------------------------
    names = [n for n, _ in contenders] + [n for n, _, _ in peers]
    med = {n: median([x["task_downtime_s"] for x in runs[n]]) for n in names}
    sp_default = next((n for n, tb, _ in peers if tb == DEFAULT_TIME_BOUNDARY_S), None)
    sp_tuned = next(n for n, tb, _ in peers if tb == tuned_tb)
    rows = []
    for n in names:
        rs = runs[n]
        dec = rs[0]["decomposition"]
        tot = max(1e-9, dec["stopping"] + dec["handoff"] + dec["starting"])
        rows.append(
            [
                n,
                len(rs),
                med[n],
                median([x["moved_tasks"] for x in rs]),
                max(x["double_ownership"] for x in rs),
                median([x["step_convergence_median_s"] for x in rs]),
                f"{dec['stopping'] / tot:.0%}/{dec['handoff'] / tot:.0%}/{dec['starting'] / tot:.0%}",
                ratio(med[n], med["eager"]),
                ratio(med[n], med[sp_default]) if sp_default else None,
                ratio(med[n], med[sp_tuned]),
            ]
        )
    headers = [
        "contender",
        "runs",
        "downtime task-s (median)",
        "moved",
        "double own.",
        "step conv. s (median)",
        "stop/hand-off/start",
        "× eager",
        "× SetPartitioner default" if sp_default else "× SP default (n/a)",
        "× SetPartitioner tuned",
    ]
    print(table(headers, rows))
    coop, cs = med["cooperative"], med["cooperative + controlled shutdown"]
    sp_ref = med[sp_default] if sp_default else med[sp_tuned]
    sp_label = sp_default or sp_tuned
    roll = med["planned roll"]
    roll_moved = median([x["moved_tasks"] for x in runs["planned roll"]])
    roll_most = max(x["max_moves_per_task"] for x in runs["planned roll"])
    double_total = sum(x["double_ownership"] for n in names for x in runs[n])
    targets = [
        target(
            "B1 cooperative downtime vs eager",
            f"1/{med['eager'] / coop:.1f}" if coop else "-",
            "≤ 1/20",
            bool(coop) and coop <= med["eager"] / 20,
            quick_size=quick,
        ),
        target(
            "B1 cooperative downtime vs SetPartitioner",
            f"1/{sp_ref / coop:.1f}" if coop else "-",
            "≤ 1/50",
            bool(coop) and coop <= sp_ref / 50,
            f"against {sp_label}; against the tuned one 1/{med[sp_tuned] / coop:.1f}" if coop else "",
            quick_size=quick,
        ),
        target(
            "B1 controlled-shutdown downtime vs SetPartitioner",
            f"1/{sp_ref / cs:.1f}" if cs else "-",
            "≤ 1/100",
            bool(cs) and cs <= sp_ref / 100,
            f"against {sp_label}; against the tuned one 1/{med[sp_tuned] / cs:.1f}" if cs else "",
            quick_size=quick,
        ),
        target(
            "B1 reconcile downtime vs eager",
            f"1/{med['eager'] / med['reconcile']:.1f}" if med["reconcile"] else "-",
            "≤ 1/20",
            bool(med["reconcile"]) and med["reconcile"] <= med["eager"] / 20,
            f"cooperative in the same run: 1/{med['eager'] / coop:.1f}" if coop else "",
            quick_size=quick,
        ),
        target(
            "B1 planned roll downtime vs eager",
            f"1/{med['eager'] / roll:.1f}" if roll else "-",
            "≤ 1/25",
            bool(roll) and roll <= med["eager"] / 25,
            quick_size=quick,
        ),
        target(
            "B1 planned roll moves",
            roll_moved,
            f"≤ {tasks} (tasks)",
            roll_moved <= tasks,
            "the first broker restarts in place (its tasks held for it); moving its tasks first would cost "
            f"tasks + 2·tasks/brokers = {tasks + 2 * tasks // brokers}",
            quick_size=quick,
        ),
        target("B1 planned roll: most moves of one task", roll_most, "≤ 2", roll_most <= 2),
        target("B1 double ownership (all contenders, all runs)", double_total, "0", double_total == 0),
    ]
    doc = {
        "setup": {
            "brokers": brokers,
            "tasks": tasks,
            "gap_s": gap,
            "start_latency_s": START_LATENCY_S,
            "stop_latency_s": STOP_LATENCY_S,
            "worker_pool": POOL_SIZE,
            "static_scheduled_delay_s": delay,
            "setpartitioner_time_boundaries_s": [tb for _, tb, _ in peers],
            "reps": reps,
            "assignor": "cooperative-sticky (eager: sticky, the same algorithm)",
        },
        "median_downtime_s": med,
        "runs": runs,
        "timelines": plotted,
        "table": {"headers": headers, "rows": rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
