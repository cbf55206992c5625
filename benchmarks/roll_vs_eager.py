"""The planned roll against eager, one run (B1's cluster: 10 brokers, 200 no-op tasks, 200 ms stop, 500 ms
start, 8 start threads per broker, 1 s restart gap; medians of 3 each, interleaved on one embedded ZooKeeper):
eager's rolling bounce, the planned roll with its warm-up (each step's moves announced to their receivers,
which prepare them: ``--roll-warmup`` 1 s, the no-op runner's default ``prepare_share``) and the same roll
without it (no announcement wait, nothing prepared), so the warm-up's share of the gain shows in the same run.

``python -m benchmarks.roll_vs_eager [--quick] [--reps N]``: prints the table, writes
``benchmarks/results/roll_vs_eager.json`` and ``roll_vs_eager.png`` (``results/quick/`` with ``--quick``)."""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

from benchmarks.b1_rolling_bounce import POOL_SIZE, START_LATENCY_S, STOP_LATENCY_S, run_ours
from benchmarks.common import RESULTS_DIR, Bench, machine_info, median, quiet_logging, table, zookeeper
from broker_sim.runners.noop import DEFAULT_PREPARE_SHARE
from broker_sim.sim.simulation_types import SimOptions
from controller.protocol.cluster.roll_plan import DEFAULT_WARMUP_S
from controller.protocol.group.rules import EAGER, RECONCILE

NAME = "roll_vs_eager"
TITLE = "The planned roll against eager"

#: the rolls keep the first batch in place: their target is the fewest moves (at most one per task)
CONTENDERS: list[tuple[str, dict[str, Any]]] = [
    ("eager rolling bounce", dict(protocol=EAGER, assignor="sticky")),
    (
        "planned roll, warm-up",
        dict(
            protocol=RECONCILE,
            scenario="roll",
            roll_wave=POOL_SIZE,
            roll_warmup_s=DEFAULT_WARMUP_S,
            roll_in_place=True,
        ),
    ),
    (
        "planned roll, no warm-up",
        dict(
            protocol=RECONCILE,
            scenario="roll",
            roll_wave=POOL_SIZE,
            roll_warmup_s=0.0,
            prepare_share=0.0,
            roll_in_place=True,
        ),
    ),
]


def _plot(bench: Bench, rows: list[tuple[str, list[float]]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    names = [n for n, _ in rows]
    meds = [median(xs) or 0.0 for _, xs in rows]
    ax.barh(names, meds, color=["#b0b0b0", "#2a7ab9", "#8fbce0"][: len(rows)])
    for i, (_, xs) in enumerate(rows):
        ax.plot(xs, [i] * len(xs), "k|", markersize=12)
        ax.text(meds[i], i, f"  {meds[i]:,.0f}", va="center")
    ax.set_xlabel("task downtime, task-seconds (bars: medians, ticks: runs)")
    ax.invert_yaxis()
    ax.set_title("Planned roll vs eager rolling bounce (10 brokers, 200 tasks)")
    fig.tight_layout()
    out = bench.png(NAME)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out.name


def run(bench: Bench, reps: int | None = None) -> dict[str, Any]:
    quick = bench.quick
    brokers, tasks = (2, 20) if quick else (10, 200)
    reps = reps or (1 if quick else 3)
    base = SimOptions(
        brokers=brokers,
        tasks=tasks,
        scenario="rolling-bounce",
        restart_gap_s=1.0,
        start_latency_s=START_LATENCY_S,
        stop_latency_s=STOP_LATENCY_S,
        converge_timeout_s=120.0,
    )
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with zookeeper(heap_mb=512, name="roll") as zk:
        for r in range(reps):
            order = CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]
            for name, kw in order:
                res, _ = run_ours(bench, zk.address, name, base, kw, profile=False)
                res.pop("controller_events", None)
                runs[name].append(res)
                bench.log(
                    f"rep {r + 1}/{reps} {name:<26} downtime {res['task_downtime_s']:9.1f} task-s  "
                    f"moved {res['moved_tasks']:4d}  most moves of one task {res['max_moves_per_task']}  "
                    f"double {res['double_ownership']}  window {res['window_s']:.0f}s"
                )
    eager = median([x["task_downtime_s"] for x in runs["eager rolling bounce"]]) or 0.0
    headers = ["run", "downtime task-s (median)", "runs", "moved", "most moves of one task", "double own.", "× eager"]
    rows, medians = [], {}
    for name, _ in CONTENDERS:
        xs = [x["task_downtime_s"] for x in runs[name]]
        med = median(xs) or 0.0
        medians[name] = med
        rows.append(
            [
                name,
                round(med, 1),
                ", ".join(f"{x:,.1f}" for x in xs),
                median([x["moved_tasks"] for x in runs[name]]),
                max(x["max_moves_per_task"] for x in runs[name]),
                sum(x["double_ownership"] for x in runs[name]),
                "1" if name.startswith("eager") else (f"1/{eager / med:.1f}" if med else "-"),
            ]
        )
    print(table(headers, rows))
    roll = medians["planned roll, warm-up"]
    doc: dict[str, Any] = {
        "setup": {
            "brokers": brokers,
            "tasks": tasks,
            "start_latency_s": START_LATENCY_S,
            "stop_latency_s": STOP_LATENCY_S,
            "restart_gap_s": 1.0,
            "wave": POOL_SIZE,
            "roll_warmup_s": DEFAULT_WARMUP_S,
            "prepare_share": DEFAULT_PREPARE_SHARE,
            "reps": reps,
        },
        "runs": runs,
        "median_downtime_s": medians,
        "roll_vs_eager": round(eager / roll, 1) if roll else None,
        "target_met": bool(roll) and roll <= eager / 25,
        "table": {"headers": headers, "rows": rows},
    }
    if not quick:
        doc["png"] = _plot(bench, [(n, [x["task_downtime_s"] for x in runs[n]]) for n, _ in CONTENDERS])
    bench.write(NAME, doc)
    return doc


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m benchmarks.roll_vs_eager", description=__doc__)
    p.add_argument("--quick", action="store_true", help="2 brokers, 20 tasks, one run each")
    p.add_argument("--reps", type=int, default=None, help="runs of each (default 3; 1 with --quick)")
    args = p.parse_args()
    quiet_logging()
    out_dir = RESULTS_DIR / "quick" if args.quick else RESULTS_DIR
    run(Bench(quick=args.quick, machine=machine_info(), out_dir=out_dir), reps=args.reps)
