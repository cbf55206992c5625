"""B2 — rebalance latency vs scale: one broker joins a stable group; the time from its start until every
task runs under the new assignment (the joiner runs its whole share: under the cooperative protocol that
is the second generation, after the owners of the moving tasks stopped them; under reconcile, after they
reported the release), plus the assignor's own compute time and the controller's CPU per rebalance.
Cooperative and reconcile run side by side, cell by cell, in the same run.

The controller runs in this process; the stable group's brokers run in a farm child process (their own
interpreter), and the joiner here, so its run intervals give the exact moment its last task started.
Controller CPU is the OS-reported CPU time of its event thread over the join (psutil, per thread), next
to the event thread's busy time (``thread.snapshot()``).
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.cluster import Cluster
from benchmarks.common import Bench, median, percentile, table, target, thread_cpu_s, zookeeper
from broker_sim.runners.noop import NoopRunner
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import wait_for
from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.rules import COOPERATIVE, RECONCILE, cooperative_adjust, protocols_for
from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor

NAME = "b2_rebalance"
TITLE = "B2 rebalance latency vs scale"


def assignor_time(tasks: int, members: int, reps: int = 5) -> dict[str, float]:
    """The cooperative-sticky assignor (and the cooperative adjustment) on a balanced group plus one
    empty newcomer: median seconds over ``reps``."""
    ids = [f"task-{i:05d}" for i in range(tasks)]
    descs = [TaskDescriptor(task_id=t) for t in ids]
    owned = {f"broker-{m:03d}": tuple(ids[m::members]) for m in range(members)}
    metas = [MemberMetadata(member_id=m, owned=o) for m, o in owned.items()] + [MemberMetadata(member_id="joiner")]
    a = get_assignor("cooperative-sticky")
    assign_s, adjust_s = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        result = a.assign(metas, descs, owned)
        t1 = time.perf_counter()
        cooperative_adjust(result, owned)
        t2 = time.perf_counter()
        assign_s.append(t1 - t0)
        adjust_s.append(t2 - t1)
    return {"assign_s": median(assign_s), "cooperative_adjust_s": median(adjust_s)}


def _busy_s(ctl: Any) -> tuple[float, int]:
    snap = ctl.thread.snapshot()
    return sum(v.process_time_s for v in snap.values()), sum(v.count for v in snap.values())


def run_cell(
    bench: Bench, hosts: str, tasks: int, brokers: int, groups: int, reps: int, protocol: str = COOPERATIVE
) -> dict[str, Any]:
    cell: dict[str, Any] = {"tasks": tasks, "brokers": brokers, "groups": groups, "protocol": protocol, "joins": []}
    cluster = Cluster(hosts, tasks, brokers, groups=groups, name=f"b2-{protocol}", session_timeout_s=30.0)
    try:
        cell["create_tasks_s"] = round(cluster.create_tasks(), 3)
        ctl = cluster.start_controller("ctl-b2")
        if not ctl.wait_active(60):
            raise RuntimeError("controller did not become active")
        t0 = time.monotonic()
        cluster.start_farm(protocol=protocol)
        converged = wait_for(
            lambda: cluster.farm_converged() and cluster.stable() or bool(cluster.errors.records),
            900 if tasks >= 5000 else 180,
            0.5,
        )
        if cluster.errors.records or not converged:
            cell["status"] = "failed"
            coords = {
                g: (c.state.value, c.generation, c.reason) for g, c in (ctl.ctx.groups.items() if ctl.ctx else [])
            }
            cell["diagnostics"] = {
                "farm": cluster.farm.call("status") if cluster.farm else None,
                "groups": coords,
                "queue": ctl.thread.queue_size(),
                "errors": cluster.errors.records[:5],
                "waited_s": round(time.monotonic() - t0, 1),
            }
            cell["error"] = (
                cluster.errors.records[0]
                if cluster.errors.records
                else f"the group did not converge within {cell['diagnostics']['waited_s']}s: {coords}"
            )
            bench.log(f"{tasks} tasks × {brokers} brokers: FAILED to form the group: {cell['error'][:300]}")
            return cell
        cell["initial_converge_s"] = round(time.monotonic() - t0, 3)
        group = cluster.group_names[0]
        coord = ctl.ctx.groups[group]
        group_tasks = len([i for i in range(tasks) if cluster.group_of(i) == group])
        group_brokers = len([i for i in range(brokers) if (i % groups if groups > 1 else 0) == 0])
        share = group_tasks // (group_brokers + 1)
        for r in range(reps):
            jid = f"joiner-{r:02d}"
            cfg = WorkerConfig(
                broker_id=jid,
                settings=cluster.settings,
                group=group,
                protocols=protocols_for(protocol),
                assignors=("cooperative-sticky",),
                pool_size=8,
                status_interval_s=1.0,
                intervals_flush_s=3600.0,
                on_halt="kill",
            )
            worker = Worker(cfg, runner=NoopRunner())
            gen0 = coord.generation
            busy0, events0 = _busy_s(ctl)
            cpu0 = thread_cpu_s([ctl.thread.native_id])
            t_join = time.time()
            worker.start()

            def done() -> bool:
                c = ctl.ctx.groups[group] if ctl.ctx else None
                if c is None or c.state.value != "Stable" or c.generation <= gen0:
                    return False
                running = worker.running_tasks()
                return len(running) >= share and running == set(worker.table.desired)

            ok = wait_for(done, 120, 0.005)
            t_seen = time.time()
            cpu1 = thread_cpu_s([ctl.thread.native_id])
            busy1, events1 = _busy_s(ctl)
            starts = [i.start for i in worker.open_intervals()]
            t_done = max(starts) if starts and share > 0 else t_seen
            join = {
                "ok": ok,
                "latency_s": round(t_done - t_join, 4) if ok else None,
                "observed_s": round(t_seen - t_join, 4),
                "first_task_started_s": round(min(starts) - t_join, 4) if starts else None,
                "generations": coord.generation - gen0,
                "joiner_tasks": len(worker.running_tasks()),
                "controller_event_cpu_s": round(cpu1 - cpu0, 4),
                "controller_event_busy_s": round(busy1 - busy0, 4),
                "controller_events": events1 - events0,
            }
            cell["joins"].append(join)
            bench.log(
                f"{protocol:>11} {tasks:>6} tasks × {brokers:>3} brokers{f' ({groups} groups)' if groups > 1 else ''}: join {r + 1}/{reps} "
                f"{join['latency_s']}s, {join['generations']} generations, controller CPU {join['controller_event_cpu_s']}s"
            )
            worker.stop()
            if not wait_for(lambda: cluster.farm_converged() and cluster.stable(), 120, 0.1):
                cell["status"] = "partial"
                cell["error"] = "the group did not settle after the joiner left"
                break
        lat = [j["latency_s"] for j in cell["joins"] if j["latency_s"] is not None]
        cell.update(
            status=cell.get("status", "ok"),
            latency_p50_s=median(lat),
            latency_max_s=max(lat) if lat else None,
            latency_p90_s=percentile(lat, 90),
            controller_cpu_s_median=median([j["controller_event_cpu_s"] for j in cell["joins"]]),
            controller_busy_s_median=median([j["controller_event_busy_s"] for j in cell["joins"]]),
            joiner_share=share,
            group_tasks=group_tasks,
            group_brokers=group_brokers,
        )
        cell.update(assignor_time(group_tasks, group_brokers, reps=3 if tasks >= 5000 else 5))
        return cell
    finally:
        cluster.close()


def plot(cells: list[dict[str, Any]], out: Any) -> None:
    """Join latency (p50, with the max as a whisker) against brokers, one line per task count."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for protocol in sorted({c["protocol"] for c in cells}):
        for tasks in sorted({c["tasks"] for c in cells}):
            pts = sorted(
                (c["brokers"], c["latency_p50_s"], c["latency_max_s"])
                for c in cells
                if c["tasks"] == tasks
                and c["groups"] == 1
                and c["protocol"] == protocol
                and c.get("latency_p50_s") is not None
            )
            if not pts:
                continue
            xs, ys, mx = zip(*pts)
            ax.errorbar(
                xs,
                ys,
                yerr=[[0] * len(ys), [m - y for m, y in zip(mx, ys)]],
                marker="o" if protocol == COOPERATIVE else "^",
                linestyle="-" if protocol == COOPERATIVE else "--",
                capsize=3,
                label=f"{tasks} tasks, {protocol}",
            )
    split = [c for c in cells if c["groups"] > 1 and c.get("latency_p50_s") is not None]
    for c in split:
        ax.plot(
            [c["brokers"]],
            [c["latency_p50_s"]],
            marker="s",
            linestyle="none",
            color="black",
            label=f"{c['tasks']} tasks in {c['groups']} groups ({c['protocol']})",
        )
    ax.axhline(0.15, color="grey", linestyle=":", linewidth=1)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("brokers in the group before the join")
    ax.set_ylabel("join → every task running (s), p50 and max")
    ax.set_title("B2: one broker joins a stable group (cooperative vs reconcile)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)


def run(bench: Bench) -> dict[str, Any]:
    if bench.quick:
        grid = [(100, 10, 1), (1000, 20, 1)]
        reps = 3
    else:
        grid = [(100, 10, 1), (1000, 20, 1), (1000, 100, 1), (10000, 100, 1)]
        reps = 5
    cells = []
    with zookeeper(heap_mb=1536, name="b2") as zk:
        for tasks, brokers, groups in grid:
            for protocol in (COOPERATIVE, RECONCILE):  # side by side, cell by cell
                cells.append(
                    run_cell(bench, zk.address, tasks, brokers, groups, reps if tasks < 10000 else 3, protocol)
                )
    rows = []
    for c in cells:
        label = f"{c['tasks']} × {c['brokers']}" + (
            f" ({c['groups']} groups of {c.get('group_tasks')}×{c.get('group_brokers')})" if c["groups"] > 1 else ""
        )
        if c.get("status") == "failed":
            rows.append([label, c["protocol"], "FAILED", None, None, None, None, None, None, c["error"][:70]])
            continue
        rows.append(
            [
                label,
                c["protocol"],
                len(c["joins"]),
                c["latency_p50_s"],
                c["latency_max_s"],
                median([j["generations"] for j in c["joins"]]),
                c.get("assign_s"),
                c["controller_cpu_s_median"],
                c["controller_busy_s_median"],
                c.get("initial_converge_s"),
            ]
        )
    headers = [
        "tasks × brokers",
        "protocol",
        "joins",
        "latency p50 s",
        "max s",
        "generations",
        "assignor s",
        "ctl CPU s",
        "ctl busy s",
        "initial converge s / error",
    ]
    print(table(headers, rows))

    def find(t: int, b: int, protocol: str) -> dict[str, Any] | None:
        return next(
            (c for c in cells if (c["tasks"], c["brokers"], c["groups"], c["protocol"]) == (t, b, 1, protocol)), None
        )

    targets = []
    checks = [(1000, 20, 0.15)] + ([] if bench.quick else [(10000, 100, 1.0)])
    for tasks, brokers, limit in checks:
        for protocol in (COOPERATIVE, RECONCILE):
            c = find(tasks, brokers, protocol)
            name = f"B2 {tasks} tasks × {brokers} brokers (one group), {protocol}, p50"
            if c is None:
                continue
            if c.get("latency_p50_s") is None:
                targets.append(target(name, "fails", f"< {limit:g} s", False, str(c.get("error", ""))[:200]))
                continue
            other = find(tasks, brokers, COOPERATIVE)
            note = ""
            if protocol == RECONCILE and other and other.get("latency_p50_s"):
                note = f"{other['latency_p50_s'] / c['latency_p50_s']:.1f}× faster than cooperative in this run"
            targets.append(
                target(
                    name,
                    f"{c['latency_p50_s'] * 1000:.0f} ms",
                    f"< {limit * 1000:.0f} ms",
                    c["latency_p50_s"] < limit,
                    note,
                )
            )
    png = bench.png("b2_rebalance_latency")
    plot(cells, png)
    doc = {"cells": cells, "table": {"headers": headers, "rows": rows}, "targets": targets, "plot": png.name}
    bench.write(NAME, doc)
    return doc
