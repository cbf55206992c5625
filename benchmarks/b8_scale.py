"""B8 — the cluster at scale, cooperative and reconcile side by side: brokers spread over broker farm
processes, the controller in this process, one group. Scenarios, each from a converged cluster: a broker
added, a broker shut down (controlled shutdown), a broker killed (its session closed at once, so the
figure is measured from its session's end), and the controller killed with a standby taking over
(convergence after the failover, its state loaded). Figures are the simulator's (``broker_sim.sim.simulator``):
step convergence is the time from the step until every task runs exactly once, balanced, group Stable
(to the instant it got there: the last task's start or the group's entering Stable, whichever is later),
each step taken after the converged cluster ran 3 s (``settle_s``), so from a steady cluster. Each cell
is the median of ``B8_REPEAT`` (3) such steps on one cluster, put back in between (``SimOptions.repeat``):
one step alone varies by a third from run to run on a shared 2-core machine.

Also measured per run: this process's peak RSS (the controller and the simulator's driver; the brokers
are in their farms), ZooKeeper's own request count over the scenario (from the settled cluster to the
end) and its average latency since it started (``mntr``), and how long the cluster took to converge at start.

The issue's full size is 100,000 tasks on 1,000 brokers; the size here is set by ``B8_TASKS`` /
``B8_BROKERS`` (default 10,000 × 100 in a full run: 1,000 brokers with a ZooKeeper session each do not
start on a 2-core machine within the session timeout; see docs/benchmarks-scale.md).
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import Bench, table, target
from broker_sim.sim.simulation_types import NotConverged, SimOptions
from broker_sim.sim.simulator import Simulation
from controller.protocol.group.rules import COOPERATIVE, RECONCILE
from controller.zk.server import four_letter_word

NAME = "b8_scale"
TITLE = "B8 scale: cooperative and reconcile side by side"

SCENARIOS = ("add-broker", "controlled-shutdown", "kill-broker", "kill-controller")


def _mntr(address: str) -> dict[str, float]:
    host, port = address.split(":")
    out: dict[str, float] = {}
    for line in four_letter_word(host, int(port), "mntr", timeout=5.0).splitlines():
        parts = line.split("\t")
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def run_one(bench: Bench, base: SimOptions, protocol: str, scenario: str) -> dict[str, Any]:
    opts = replace(base, protocol=protocol, scenario=scenario)
    marks: dict[str, Any] = {}
    sim: Simulation | None = None

    def echo(line: str) -> None:  # the simulator says when the cluster has converged: the scenario starts
        if "tasks running" in line:
            marks["converged_at_start_s"] = float(line.rsplit("after ", 1)[-1].rstrip("s"))
        if "the scenario starts" in line and sim is not None and sim.server is not None:
            marks["before"] = _mntr(sim.server.address)

    sim = Simulation(opts, echo).__enter__()
    row: dict[str, Any] = {"protocol": protocol, "scenario": scenario}
    try:
        t0 = time.monotonic()
        summary = sim.run()
        before = marks.get("before", {})
        row["initial_converge_s"] = marks.get("converged_at_start_s")
        after = _mntr(sim.server.address) if sim.server is not None else {}
        steps = summary.step_convergence_s
        row.update(
            status="ok",
            step_s=round(statistics.median(steps), 3) if steps else None,
            steps_s=steps,
            double_ownership=summary.double_ownership,
            moved=summary.moved_tasks,
            halts=summary.halts,
            downtime_task_s=summary.task_downtime_s,
            wall_s=round(time.monotonic() - t0, 1),
            rebalances=summary.rebalances,
        )
        if before and after:
            row["zk_requests"] = int(after.get("zk_packets_received", 0) - before.get("zk_packets_received", 0))
            row["zk_avg_latency_ms"] = after.get("zk_avg_latency")
    except NotConverged as exc:
        row.update(status="failed", error=str(exc))
    finally:
        sim.close()
    row["rss_peak_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    bench.log(
        f"{protocol:>11} {scenario:<20} {row.get('step_s')}s {row.get('steps_s')}  double {row.get('double_ownership')}  "
        f"halts {row.get('halts')}  ZooKeeper {row.get('zk_requests')} requests"
    )
    return row


def run(bench: Bench) -> dict[str, Any]:
    tasks = int(os.environ.get("B8_TASKS", 1000 if bench.quick else 10000))
    brokers = int(os.environ.get("B8_BROKERS", 10 if bench.quick else 100))
    farms = 0 if brokers <= 25 else max(2, brokers // 25)
    base = SimOptions(
        brokers=brokers,
        tasks=tasks,
        farms=farms,
        session_timeout_s=10.0 if farms else 6.0,
        converge_timeout_s=600.0,
        start_latency_s=0.0,
        stop_latency_s=0.0,
        settle_s=3.0,
        repeat=int(os.environ.get("B8_REPEAT", 3)),
    )
    rows: list[dict[str, Any]] = []
    for scenario in SCENARIOS:
        for protocol in (COOPERATIVE, RECONCILE):  # side by side, scenario by scenario
            rows.append(run_one(bench, base, protocol, scenario))
    headers = [
        "scenario",
        "protocol",
        "converged s (median)",
        "each s",
        "moved",
        "double own.",
        "halts",
        "ZooKeeper requests",
        "ZooKeeper avg latency ms",
        "start converged s",
        "wall s",
    ]
    print(
        table(
            headers,
            [
                [
                    r["scenario"],
                    r["protocol"],
                    r.get("step_s", r.get("error", "")[:40]),
                    " ".join(f"{x:.2f}" for x in r.get("steps_s") or ()),
                    r.get("moved"),
                    r.get("double_ownership"),
                    r.get("halts"),
                    r.get("zk_requests"),
                    r.get("zk_avg_latency_ms"),
                    r.get("initial_converge_s"),
                    r.get("wall_s"),
                ]
                for r in rows
            ],
        )
    )

    def step(protocol: str, scenario: str) -> float | None:
        r = next((r for r in rows if r["protocol"] == protocol and r["scenario"] == scenario), None)
        return r.get("step_s") if r else None

    quick = bench.quick
    targets = []
    for scenario in ("add-broker", "controlled-shutdown"):
        coop, rec = step(COOPERATIVE, scenario), step(RECONCILE, scenario)
        if coop and rec:
            targets.append(
                target(
                    f"B8 {tasks}×{brokers} {scenario}: reconcile vs cooperative",
                    f"{coop / rec:.1f}× faster",
                    "≥ 3×",
                    coop / rec >= 3,
                    f"cooperative {coop:.2f} s, reconcile {rec:.2f} s",
                    quick_size=quick,
                )
            )
    for scenario in ("add-broker", "controlled-shutdown", "kill-broker"):
        rec = step(RECONCILE, scenario)
        targets.append(
            target(
                f"B8 {tasks}×{brokers} {scenario} (reconcile): all running again",
                f"{rec} s",
                "< 5 s",
                rec is not None and rec < 5,
                quick_size=quick,
            )
        )
    fo = step(RECONCILE, "kill-controller")
    targets.append(
        target(
            f"B8 {tasks}×{brokers} controller failover (reconcile), state loaded",
            f"{fo} s",
            "< 3 s",
            fo is not None and fo < 3,
            quick_size=quick,
        )
    )
    rss = max(r["rss_peak_mb"] for r in rows)
    targets.append(
        target(
            "B8 controller process peak RSS",
            f"{rss:.0f} MB",
            "< 1 GB",
            rss < 1024,
            "this process: controller and the simulator's driver (brokers run in farms)",
        )
    )
    double = sum(r.get("double_ownership") or 0 for r in rows)
    targets.append(target("B8 double ownership (all runs)", double, "0", double == 0))
    doc = {
        "setup": {"tasks": tasks, "brokers": brokers, "farms": farms, "session_timeout_s": base.session_timeout_s},
        "rows": rows,
        "table": {"headers": headers},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
