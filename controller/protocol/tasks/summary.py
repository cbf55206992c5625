"""The cluster summary (``/cluster_summary``): task counts computed from what the active controller holds in
memory, when to write them, and when a reader must not trust them. Pure: the controller's ``SummaryWriter``
does the I/O, ``ClusterAdmin.status`` the reading."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from controller.protocol.records.admin_records import ClusterSummary, GroupTaskCount
from controller.protocol.tasks.spec import TaskSpec

#: the controller looks at its counts this often (seconds) and writes them when they changed
REFRESH_S = 1.0
#: and rewrites them unchanged this often, so that a reader can tell a live summary from a dead controller's
REWRITE_S = 10.0
#: a summary older than this (seconds, by its ``computed_at``) is not trusted: ``status`` reads every task
MAX_AGE_S = 30.0


def summarize(
    epoch: int,
    now: float,
    tasks: Mapping[str, TaskSpec],
    invalid: Collection[str],
    deleting: Collection[str],
    assignments: Mapping[str, Mapping[str, tuple[str, ...]]],
) -> ClusterSummary:
    """Counts of ``tasks`` (valid specs) and ``invalid`` ids: by spec state, by group, those being deleted, and
    the RUNNING specs that a group's current ``assignments`` (group -> member -> tasks) places or does not."""
    by_state: Counter[str] = Counter()
    running: Counter[str] = Counter()
    paused: Counter[str] = Counter()
    stopped: Counter[str] = Counter()
    per_state = {"RUNNING": running, "PAUSED": paused, "STOPPED": stopped}
    for spec in tasks.values():
        by_state[spec.state] += 1
        per_state[spec.state][spec.group] += 1
    by_broker: Counter[str] = Counter()
    assigned_in: Counter[str] = Counter()
    for group, members in assignments.items():
        for member, placed in members.items():
            live = [t for t in placed if t in tasks and tasks[t].state == "RUNNING"]
            by_broker[member] += len(live)
            assigned_in[group] += len(live)
    groups = tuple(
        GroupTaskCount(group=g, running=running[g], paused=paused[g], assigned=assigned_in[g], stopped=stopped[g])
        for g in sorted(set(running) | set(paused) | set(stopped) | set(assigned_in))
    )
    assigned = sum(assigned_in.values())
    return ClusterSummary(
        epoch=epoch,
        computed_at=now,
        total=len(tasks) + len(invalid),
        by_state=dict(sorted(by_state.items())),
        invalid=len(invalid),
        deleting=len(deleting),
        assigned=assigned,
        unassigned=max(by_state["RUNNING"] - assigned, 0),
        by_broker=dict(sorted(by_broker.items())),
        groups=groups,
    )


@dataclass(frozen=True)
class SummaryPlan:
    """What the controller last wrote, and when: decides whether a fresh count is worth a write."""

    written: ClusterSummary | None = None

    def should_write(self, fresh: ClusterSummary) -> bool:
        last = self.written
        if last is None or last.epoch != fresh.epoch:
            return True
        if replace(last, computed_at=fresh.computed_at) != fresh:
            return True
        return fresh.computed_at - last.computed_at >= REWRITE_S


def summary_age(summary: ClusterSummary, now: float) -> float:
    return max(now - summary.computed_at, 0.0)


def trusted(summary: ClusterSummary, epoch: int | None, now: float) -> str | None:
    """Why ``summary`` cannot stand for the full read (None: it can): written by another epoch than the
    controller's now, or older than :data:`MAX_AGE_S`."""
    if epoch is None or summary.epoch != epoch:
        return f"the summary is of epoch {summary.epoch}, the controller's is {epoch}"
    age = summary_age(summary, now)
    if age > MAX_AGE_S:
        return f"the summary is {age:.0f} s old (over {MAX_AGE_S:.0f} s)"
    return None
