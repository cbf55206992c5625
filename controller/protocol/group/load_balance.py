"""When the controller rebalances a ``load-balanced`` group for load, sans-IO: the hysteresis around the
assignor (``assignors_load``), which itself has no clock.

The IO layer hands in the brokers' load reports (:meth:`LoadWatch.on_reports`); a task's figure counts only
from the member the group has assigned it to (a report is a claim: a broker cannot weigh another broker's
tasks). At each check the group's coordinator asks whether the assignor would move anything for load
(:meth:`LoadWatch.observe`): a rebalance is asked for only when that has held for ``window_s`` without a
break, so a burst does not move pipelines back and forth, and a task that moved (for load, or as members came
and went) is left where it is for a window after (``moved_recently`` in its descriptor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from controller.protocol.records.group_messages import TaskDescriptor
from controller.protocol.tasks.load import MAX_LOAD_SHARE

ASSIGNOR = "load-balanced"


@dataclass(eq=False)
class LoadWatch:
    """The load figures of one group's tasks, how long its imbalance has lasted, and its recent moves."""

    window_s: float = 60.0
    check_s: float = 10.0
    reports: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # broker -> task -> load share
    unbalanced_since: float | None = None
    moved_at: dict[str, float] = field(default_factory=dict)
    next_check: float | None = None
    last_plan: tuple[str, ...] = ()  # the last check's explanation (the group's reason shows its first line)
    owners: dict[str, str] = field(default_factory=dict)  # task -> member, as last seen (to see every move)

    def on_reports(self, reports: Mapping[str, Mapping[str, float]]) -> None:
        """The brokers' latest task figures (bounded by ``controller.protocol.tasks.load``)."""
        self.reports = reports

    def loads(self, assignment: Mapping[str, Iterable[str]]) -> dict[str, float]:
        """task -> load share, each as reported by the member it is assigned to (anyone else's claim is ignored)."""
        loads: dict[str, float] = {}
        for member, tasks in assignment.items():
            figures = self.reports.get(member)
            if not figures:
                continue
            for t in tasks:
                v = figures.get(t)
                if v is not None:
                    loads[t] = min(max(float(v), 0.0), MAX_LOAD_SHARE)
        return loads

    def descriptors(
        self, tasks: Iterable[TaskDescriptor], now: float, assignment: Mapping[str, Iterable[str]]
    ) -> list[TaskDescriptor]:
        """The tasks as the load-balanced assignor sees them: with their load, and whether they moved lately."""
        loads = self.loads(assignment)
        out = []
        for d in tasks:
            load = loads.get(d.task_id)
            recent = now - self.moved_at.get(d.task_id, -1e18) < self.window_s
            out.append(d if load is None and not recent else replace(d, load=load, moved_recently=recent))
        return out

    def due(self, now: float) -> bool:
        """Whether a check is due (the first one at once, then every ``check_s``)."""
        if self.next_check is not None and now < self.next_check:
            return False
        self.next_check = now + self.check_s
        return True

    def observe(self, now: float, unbalanced: bool) -> bool:
        """One check's finding; True when the imbalance has now lasted the whole window (then it starts over)."""
        if not unbalanced:
            self.unbalanced_since = None
            return False
        if self.unbalanced_since is None:
            self.unbalanced_since = now
        if now - self.unbalanced_since < self.window_s:
            return False
        self.unbalanced_since = None
        return True

    def note_assignment(self, assignment: Mapping[str, Iterable[str]], now: float) -> None:
        """Every task whose member changed since the last look moved now, whatever moved it (a join, a leave, a
        load check): the balancer leaves it where it is for a window."""
        owners = {t: m for m, ts in assignment.items() for t in ts}
        self.note_moves([t for t, m in owners.items() if t in self.owners and self.owners[t] != m], now)
        self.owners = owners

    def note_moves(self, tasks: Iterable[str], now: float) -> None:
        """Tasks the balancer moves now (they stay put for a window); forgets the moves older than that."""
        self.moved_at = {t: at for t, at in self.moved_at.items() if now - at < self.window_s}
        for t in tasks:
            self.moved_at[t] = now


__all__ = ["ASSIGNOR", "LoadWatch"]
