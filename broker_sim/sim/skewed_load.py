"""``zkctl sim run --scenario skewed-load``: a few heavy pipelines among many light ones, placed by each
assignor in turn on a fresh simulated cluster, in one run.

No-op tasks declare their cost (``NoopPipeline.cost``, reported as their load share); the declared weights are
all 1, as an operator who guessed would leave them. The first broker starts alone and takes every task; the
others join. A count-based assignor keeps its quota on the first broker, the heavy ones among it (their ids
sort first): three heavy pipelines on one broker, its neighbours idle. Sampled every ``sample_s``: each
broker's load (the sum of its tasks' costs, capacity 1), the largest one over time, every move, and the
modelled lag of the pipelines on the hottest broker: a broker carrying load ``L > 1`` gives each pipeline
``1/L`` of the time its batches need, so each falls behind by ``1 - 1/L`` seconds per second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from controller.protocol.group.assignors_load import DEFAULT_TOLERANCE, MIN_GAP
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

SCENARIO = "skewed-load"
COUNT_ASSIGNORS = ("sticky", "range")
LOAD_ASSIGNOR = "load-balanced"


@dataclass(frozen=True)
class SkewOptions:
    """The shape of the run (the simulator's options give the rest: ZooKeeper, session timeout, protocol)."""

    heavy: int = 3
    light: int = 12
    heavy_cost: float = 0.6
    light_cost: float = 0.05
    duration_s: float = 30.0  # sampled after the last broker joined
    sample_s: float = 0.25
    assignors: tuple[str, ...] = (*COUNT_ASSIGNORS, LOAD_ASSIGNOR)

    def costs(self) -> dict[str, float]:
        heavy = {f"heavy-{i}": self.heavy_cost for i in range(self.heavy)}
        return heavy | {f"light-{i:03d}": self.light_cost for i in range(self.light)}


@dataclass
class AssignorRun:
    """What one assignor did with the skewed cluster."""

    assignor: str
    max_load: list[tuple[float, float]] = field(default_factory=list)  # (seconds since the join, largest load)
    moves: list[tuple[float, str, str, str]] = field(default_factory=list)  # (at, task, from, to)
    final_loads: dict[str, float] = field(default_factory=dict)
    hottest: str = ""
    hottest_lag_s: float = 0.0  # the largest modelled lag among the pipelines ending on the hottest broker
    max_lag_s: float = 0.0
    mean: float = 0.0
    bound: float = 0.0  # the tolerance's bound on a broker's load (mean + max(20% of it, MIN_GAP))

    @property
    def within_tolerance(self) -> bool:
        return max(self.final_loads.values(), default=0.0) <= self.bound + 1e-9

    def moves_per_task_in(self, window_s: float) -> int:
        """The most moves of one task within any ``window_s`` (0: nothing moved)."""
        by_task: dict[str, list[float]] = {}
        for at, t, _, _ in self.moves:
            by_task.setdefault(t, []).append(at)
        worst = 0
        for ats in by_task.values():
            for i, a in enumerate(ats):
                worst = max(worst, sum(1 for b in ats[i:] if b - a < window_s))
        return worst

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "within_tolerance": self.within_tolerance,
            "largest_load_end": max(self.final_loads.values(), default=0.0),
            "largest_load_peak": max((v for _, v in self.max_load), default=0.0),
        }


def _where(sim: Simulation) -> dict[str, str]:
    return {t: b for b, w in sim.workers.items() for t in w.running_tasks()}


def play(base: SimOptions, skew: SkewOptions, assignor: str, echo: Callable[[str], None]) -> AssignorRun:
    """One assignor on a fresh cluster: the first broker alone, then the others; sampled for ``duration_s``."""
    costs = skew.costs()
    opts = replace(base, assignor=assignor, tasks=len(costs), scenario=SCENARIO)
    run = AssignorRun(assignor)
    total = sum(costs.values())
    run.mean = total / opts.brokers
    run.bound = run.mean + max(run.mean * DEFAULT_TOLERANCE, MIN_GAP)
    with Simulation(opts, echo) as sim:
        specs = [TaskSpec(id=t, pipeline=NoopPipeline(kind="noop", cost=c)) for t, c in sorted(costs.items())]
        tx = sim.admin.transaction()
        for s in specs:
            tx.create(sim.layout.task(s.id), s.encode())
        tx.commit()
        sim.task_ids = [s.id for s in specs]
        sim.start_controller("ctl-0")
        first = sim.broker_id(0)
        sim.start_worker(first)
        if sim.wait_converged() is None:
            raise RuntimeError(f"{assignor}: {first} did not take every task")
        t0 = time.monotonic()
        where = _where(sim)  # (every task on the first broker)
        for i in range(1, opts.brokers):
            sim.start_worker(sim.broker_id(i))
        lag: dict[str, float] = dict.fromkeys(costs, 0.0)
        last = t0
        while (now := time.monotonic()) - t0 < skew.duration_s:
            time.sleep(skew.sample_s)
            now = time.monotonic()
            seen = _where(sim)
            loads = {b: 0.0 for b in sim.workers}
            for t, b in seen.items():
                loads[b] += costs[t]
            for t, b in seen.items():
                prev = where.get(t)
                if prev is not None and prev != b:
                    run.moves.append((round(now - t0, 2), t, prev, b))
                over = loads[b]
                if over > 1.0:
                    lag[t] += (1.0 - 1.0 / over) * (now - last)
            where.update(seen)
            last = now
            run.max_load.append((round(now - t0, 2), round(max(loads.values(), default=0.0), 3)))
        run.final_loads = {b: round(v, 3) for b, v in sorted(loads.items())}
        run.hottest = max(run.final_loads, key=lambda b: (run.final_loads[b], b))
        on_hottest = [t for t, b in seen.items() if b == run.hottest]
        run.hottest_lag_s = round(max((lag[t] for t in on_hottest), default=0.0), 2)
        run.max_lag_s = round(max(lag.values(), default=0.0), 2)
    return run


def run_skewed(base: SimOptions, skew: SkewOptions, echo: Callable[[str], None]) -> list[AssignorRun]:
    """Every assignor of ``skew.assignors`` in turn, each on its own cluster."""
    runs = []
    for a in skew.assignors:
        echo(f"{a}: {base.brokers} brokers, {skew.heavy} heavy ({skew.heavy_cost}) and {skew.light} light tasks")
        runs.append(play(base, skew, a, echo))
    return runs


def format_runs(runs: list[AssignorRun], window_s: float) -> str:
    """The comparison table, and each run's largest load over time (a few points) and its moves."""
    head = f"{'assignor':<15} {'peak load':>9} {'end load':>9} {'bound':>6} {'moves':>6} {'per task/window':>15} "
    head += f"{'lag hottest':>12} {'in tolerance':>12}"
    lines = [head]
    for r in runs:
        d = r.to_dict()
        lines.append(
            f"{r.assignor:<15} {d['largest_load_peak']:>9.2f} {d['largest_load_end']:>9.2f} {r.bound:>6.2f} "
            f"{len(r.moves):>6} {r.moves_per_task_in(window_s):>15} {r.hottest_lag_s:>11.1f}s "
            f"{'yes' if r.within_tolerance else 'no':>12}"
        )
    for r in runs:
        step = max(1, len(r.max_load) // 8)
        series = ", ".join(f"{t:g}s {v:.2f}" for t, v in r.max_load[::step])
        lines.append(f"{r.assignor}: largest load over time: {series}")
        lines.append("  loads at the end: " + ", ".join(f"{b} {v:.2f}" for b, v in r.final_loads.items()))
        if r.moves:
            lines.append("  moves: " + ", ".join(f"{t} {a}->{b} at {at:g}s" for at, t, a, b in r.moves[:12]))
    return "\n".join(lines)


__all__ = ["AssignorRun", "SCENARIO", "SkewOptions", "format_runs", "play", "run_skewed"]
