"""The ``load-balanced`` assignor: places pipelines by what they are measured to cost, not by their count.

A task's *cost* is its measured load share (``TaskDescriptor.load``: its batches' time over its trigger
interval, smoothed, bounded by the controller), or, for a task with no history, its declared ``weight`` times
the group's measured load per unit of weight (1.0 when nothing is measured yet). A member's *load* is the sum
of its tasks' costs over its capacity. Pure and deterministic, like every assignor; the time-bound parts
(an imbalance must last a window before the controller acts on it, a task moved lately stays put) come in as
data: ``TaskDescriptor.moved_recently``.

The sets, named as the sticky assignor's: ``held`` (the current placement), ``orphaned`` (assignable, run by
no present eligible member: placed first, heaviest first, each on the least-loaded member that may run it),
then ``moves``: while the hottest member is over the mean by more than the tolerance, the one task of it whose
move to the coolest eligible member lowers the pair's larger load the most goes there; a task moves at most
once, a ``moved_recently`` task not at all, and never more than ``max_moves``. Each move lowers the larger load
of the pair it touches, so the loop ends; it also ends when no move helps (one task heavier than the gap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor

#: a member within this share of the mean load (or within ``MIN_GAP`` of it) counts as balanced
DEFAULT_TOLERANCE = 0.2
#: an absolute floor under the tolerance: on a nearly idle cluster a 20% spread is noise, not load
MIN_GAP = 0.1
#: loads are sums of floats: a member at the bound to the last bit is at it, not over it
EPSILON = 1e-9
#: the most tasks one assignment moves for balance (the controller's move throttle applies on top)
DEFAULT_MAX_MOVES = 8


@dataclass(frozen=True)
class LoadMove:
    """One balancing move and its reason, for ``rebalance --dry-run``."""

    task: str
    source: str
    dest: str
    cost: float
    source_load: float  # before the move (per capacity)
    dest_load: float
    source_after: float
    dest_after: float


@dataclass(frozen=True)
class LoadPlan:
    """What the assignor decided and why: the loads before and after, the mean, the moves."""

    placement: Mapping[str, str]  # task -> member
    before: Mapping[str, float]  # member -> load per capacity, current placement plus new tasks
    after: Mapping[str, float]
    mean: float
    tolerance: float
    moves: tuple[LoadMove, ...]
    stopped: str  # why it stopped moving: "balanced", "no move helps", "move limit"

    @property
    def hottest(self) -> str | None:
        return max(self.before, key=lambda m: (self.before[m], m), default=None)

    def over(self, loads: Mapping[str, float]) -> dict[str, float]:
        """Members over the mean by more than the tolerance, and by how much."""
        bound = self.mean + max(self.mean * self.tolerance, MIN_GAP) + EPSILON
        return {m: round(v - self.mean, 4) for m, v in sorted(loads.items()) if v > bound}

    def explain(self) -> list[str]:
        """The decision in words: who is over, by how much, what moves and why."""
        lines = [f"mean load {self.mean:.2f} per capacity, tolerance {self.tolerance:.0%} (at least {MIN_GAP})"]
        over = self.over(self.before)
        if not over:
            lines.append("no broker is over the tolerance: nothing moves for load")
        for m, by in over.items():
            lines.append(f"{m} is over: load {self.before[m]:.2f}, {by:+.2f} above the mean")
        for mv in self.moves:
            lines.append(
                f"move {mv.task} (cost {mv.cost:.2f}) from {mv.source} to {mv.dest}, the least loaded that may run it: "
                f"{mv.source} {mv.source_load:.2f} -> {mv.source_after:.2f}, {mv.dest} {mv.dest_load:.2f} -> {mv.dest_after:.2f}"
            )
        if over:
            lines.append(f"stopped: {self.stopped}; after: " + ", ".join(f"{m} {v:.2f}" for m, v in self.after.items()))
        return lines


def task_costs(tasks: Sequence[TaskDescriptor]) -> dict[str, float]:
    """Each task's cost: its measured load, or its weight times the measured load per unit of weight."""
    measured = [t for t in tasks if t.load is not None]
    unit_weight = sum(max(t.weight, 0) for t in measured)
    unit = sum(t.load or 0.0 for t in measured) / unit_weight if measured and unit_weight > 0 else 1.0
    return {t.task_id: (t.load if t.load is not None else max(t.weight, 0) * unit) for t in tasks}


def plan(
    members: Sequence[MemberMetadata],
    tasks: Sequence[TaskDescriptor],
    previous: Mapping[str, Sequence[str]],
    tolerance: float = DEFAULT_TOLERANCE,
    max_moves: int = DEFAULT_MAX_MOVES,
) -> LoadPlan:
    """The placement and its reasons (``LoadBalancedAssignor.assign`` returns its placement)."""
    from controller.protocol.group.assignors import AssignmentProblem  # (that module registers this one: imported late)

    problem = AssignmentProblem.build(members, tasks, previous)
    allowed = problem.eligible
    cost = task_costs(list(problem.tasks.values()))
    cap = {m: float(max(problem.members[m].capacity, 1)) for m in problem.active}
    placement = dict(problem.current_placement(allowed))
    load = dict.fromkeys(problem.active, 0.0)
    for tid, m in placement.items():
        load[m] += cost[tid]

    def may(tid: str, m: str) -> bool:
        choices = allowed[tid]
        return choices is None or m in choices

    orphaned = sorted((t for t in allowed if t not in placement), key=lambda t: (-cost[t], t))
    for tid in orphaned:
        best = min((m for m in problem.active if may(tid, m)), key=lambda m: ((load[m] + cost[tid]) / cap[m], m))
        placement[tid] = best
        load[best] += cost[tid]
    before = {m: load[m] / cap[m] for m in problem.active}
    mean = sum(load.values()) / sum(cap.values()) if cap else 0.0
    bound = mean + max(mean * tolerance, MIN_GAP) + EPSILON
    moves: list[LoadMove] = []
    moved: set[str] = set()
    stopped = "balanced"
    while True:
        rel = {m: load[m] / cap[m] for m in problem.active}
        hot = max(rel, key=lambda m: (rel[m], m), default=None)
        if hot is None or rel[hot] <= bound:
            stopped = "balanced"
            break
        if len(moves) >= max_moves:
            stopped = "move limit"
            break
        best_move: tuple[float, str, str] | None = None
        for tid in sorted(t for t, m in placement.items() if m == hot):
            if tid in moved or problem.tasks[tid].moved_recently or cost[tid] <= 0:
                continue
            for m in problem.active:
                if m == hot or not may(tid, m):
                    continue
                larger = max((load[hot] - cost[tid]) / cap[hot], (load[m] + cost[tid]) / cap[m])
                if larger < rel[hot] - 1e-9 and (best_move is None or (larger, tid, m) < best_move):
                    best_move = (larger, tid, m)
        if best_move is None:
            stopped = "no move helps"
            break
        _, tid, dest = best_move
        moved.add(tid)
        placement[tid] = dest
        load[hot] -= cost[tid]
        load[dest] += cost[tid]
        after_src, after_dest = load[hot] / cap[hot], load[dest] / cap[dest]
        moves.append(LoadMove(tid, hot, dest, cost[tid], rel[hot], rel[dest], after_src, after_dest))
    after = {m: load[m] / cap[m] for m in problem.active}
    return LoadPlan(placement, before, after, mean, tolerance, tuple(moves), stopped)


class LoadBalancedAssignor:
    """Evens out the members' measured load within a tolerance, moving few tasks (module docstring)."""

    name: str = "load-balanced"

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE, max_moves: int = DEFAULT_MAX_MOVES) -> None:
        if not 0 <= tolerance <= 10:
            raise ValueError(f"tolerance {tolerance!r} is not within 0..10")
        if max_moves < 0:
            raise ValueError("max_moves must not be negative")
        self.tolerance = tolerance
        self.max_moves = max_moves

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        placement = plan(members, tasks, previous, self.tolerance, self.max_moves).placement
        out: dict[str, list[str]] = {m.member_id: [] for m in members}
        for tid, m in placement.items():
            out[m].append(tid)
        return {m: tuple(sorted(ts)) for m, ts in out.items()}


__all__ = [
    "DEFAULT_MAX_MOVES",
    "DEFAULT_TOLERANCE",
    "LoadBalancedAssignor",
    "LoadMove",
    "LoadPlan",
    "plan",
    "task_costs",
]
