"""The invariant checker: independent of the controller's code, it reads only recorded run intervals
(and, for the live checks, what ZooKeeper shows) and computes the figures every test and benchmark
reports: double ownership, task downtime, moved tasks.

Double ownership uses the widest window in which a worker may have been running a task (from owner
acquisition to owner release); downtime uses the narrow one (runner started to runner stopping).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controller.protocol.records.task_records import RunInterval


@dataclass(frozen=True)
class Overlap:
    task_id: str
    first: RunInterval
    second: RunInterval

    def __str__(self) -> str:
        return (
            f"{self.task_id}: {self.first.broker} [{self.first.start:.3f},{_end(self.first)}] overlaps "
            f"{self.second.broker} [{self.second.start:.3f},{_end(self.second)}]"
        )


def _end(i: RunInterval) -> str:
    return "open" if i.end is None else f"{i.end:.3f}"


def close_open(intervals: Iterable[RunInterval], at: float) -> list[RunInterval]:
    """Intervals still running at ``at`` end there (for a final evaluation)."""
    out = []
    for i in intervals:
        if i.end is None:
            i = RunInterval(
                task_id=i.task_id,
                broker=i.broker,
                start=i.start,
                end=at,
                generation=i.generation,
                acquired=i.acquired,
                released=i.released if i.released is not None else at,
            )
        out.append(i)
    return out


def double_ownership(intervals: Sequence[RunInterval], now: float | None = None) -> list[Overlap]:
    """Pairs of intervals of one task, on different brokers, whose ownership windows overlap."""
    by_task: dict[str, list[tuple[float, float, RunInterval]]] = defaultdict(list)
    for i in intervals:
        lo = i.acquired if i.acquired is not None else i.start
        hi = (
            i.released
            if i.released is not None
            else (i.end if i.end is not None else (now if now is not None else float("inf")))
        )
        by_task[i.task_id].append((lo, hi, i))
    found: list[Overlap] = []
    for task, runs in by_task.items():
        runs.sort(key=lambda r: r[0])
        active: list[tuple[float, float, RunInterval]] = []
        for lo, hi, i in runs:
            active = [a for a in active if a[1] > lo + 1e-6]
            for a in active:
                if a[2].broker != i.broker:
                    found.append(Overlap(task, a[2], i))
            active.append((lo, hi, i))
    return found


def downtime(intervals: Sequence[RunInterval], tasks: Iterable[str], window: tuple[float, float]) -> dict[str, float]:
    """Per task, seconds inside ``window`` during which no interval was running it."""
    t0, t1 = window
    by_task: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for i in intervals:
        end = i.end if i.end is not None else t1
        lo, hi = max(i.start, t0), min(end, t1)
        if hi > lo:
            by_task[i.task_id].append((lo, hi))
    out = {}
    for task in tasks:
        covered = 0.0
        cursor = t0
        for lo, hi in sorted(by_task.get(task, [])):
            if hi <= cursor:
                continue
            covered += hi - max(lo, cursor)
            cursor = hi
        out[task] = max(0.0, (t1 - t0) - covered)
    return out


def moved_tasks(intervals: Sequence[RunInterval], window: tuple[float, float]) -> int:
    """How many times, inside the window, a task started on a different broker than it last ran on."""
    t0, t1 = window
    by_task: dict[str, list[RunInterval]] = defaultdict(list)
    for i in intervals:
        by_task[i.task_id].append(i)
    moves = 0
    for runs in by_task.values():
        runs.sort(key=lambda i: i.start)
        for prev, cur in zip(runs, runs[1:]):
            if t0 <= cur.start <= t1 and cur.broker != prev.broker:
                moves += 1
    return moves


@dataclass(frozen=True)
class MoveRun:
    """A task starting on a broker other than the one it last ran on (or its first run): the period from
    taking its owner znode until its runner had started, when the move counts against the throttle."""

    task_id: str
    broker: str
    source: str | None
    acquired: float
    started: float


def move_runs(
    intervals: Sequence[RunInterval], window: tuple[float, float] = (0.0, float("inf")), first_runs: bool = False
) -> list[MoveRun]:
    """The moves whose owner was taken inside ``window``; ``first_runs``: a task's first run counts too."""
    t0, t1 = window
    by_task: dict[str, list[RunInterval]] = defaultdict(list)
    for i in intervals:
        by_task[i.task_id].append(i)
    out: list[MoveRun] = []
    for runs in by_task.values():
        runs.sort(key=lambda i: i.acquired if i.acquired is not None else i.start)
        for prev, cur in zip([None, *runs], runs):
            if prev is None and not first_runs:
                continue
            if prev is not None and prev.broker == cur.broker:
                continue
            acquired = cur.acquired if cur.acquired is not None else cur.start
            if t0 <= acquired <= t1:
                out.append(MoveRun(cur.task_id, cur.broker, prev.broker if prev else None, acquired, cur.start))
    return out


def concurrent_moves(moves: Sequence[MoveRun]) -> tuple[int, dict[str, int]]:
    """The most moves in flight at one instant, in all and per broker starting them: what a move
    throttle bounds."""
    points: list[tuple[float, int, MoveRun]] = []
    for m in moves:
        points.append((m.acquired, 1, m))
        points.append((max(m.started, m.acquired), -1, m))
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same instant
    now = 0
    most = 0
    per: dict[str, int] = defaultdict(int)
    per_most: dict[str, int] = defaultdict(int)
    for _t, delta, m in points:
        now += delta
        most = max(most, now)
        per[m.broker] += delta
        per_most[m.broker] = max(per_most[m.broker], per[m.broker])
    return most, dict(per_most)
