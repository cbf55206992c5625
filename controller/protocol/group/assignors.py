"""Assignors: pure strategies that turn (members, tasks, previous assignment) into an assignment.

The group leader runs one of these in the sync phase (docs/protocol.md). They do no I/O, read no clock
and are deterministic: the same members, tasks and previous assignment give the same result whatever
order they come in. The cooperative two-phase revoke/assign is not their business: the protocol layer
(``controller.protocol.group.rules.cooperative_adjust``) turns any target assignment into what to revoke now and
what to hand out next generation.

Every assignor returns a key for every member (an empty tuple if it gets nothing), sorted tuples, and
every task at most once. A task is left out only when no member is *eligible* for it
(:func:`is_eligible`, the one rule they all share): a leaving member (controlled shutdown) is eligible
for nothing, and a task pinned with ``pin_mode="required"`` only on the members it names.

Inside, the sets are named as in Kafka Connect's IncrementalCooperativeAssignor: ``assignable``,
``held`` (what each member runs now), ``orphaned`` (assignable, run by no present eligible member),
``quota``, ``kept``, ``excess`` (held beyond quota: the only running tasks that move), ``to_place``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from controller.protocol.group.assignors_load import LoadBalancedAssignor
from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "CapacityAssignor",
    "CooperativeStickyAssignor",
    "LoadBalancedAssignor",
    "PinnedAssignor",
    "RackAwareAssignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "get_assignor",
    "is_eligible",
]

Placement = dict[str, str]  # task id -> member id
Allowed = dict[str, "frozenset[str] | None"]  # task id -> members it may go to; None = every active member


class Assignor(Protocol):
    """One assignment strategy (kafka-python's ``AbstractPartitionAssignor``, minus the metadata I/O)."""

    name: str

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        """member id -> sorted task ids, for every member; each task at most once overall."""
        ...


def is_eligible(member: MemberMetadata, task: TaskDescriptor) -> bool:
    """May ``member`` run ``task`` at all? The one hard rule; every assignor's preferences come after it.

    A leaving member (controlled shutdown) must drain, so it takes nothing; a task whose pin is
    *required* runs only on a member it names (a *preferred* pin is a wish, which only the ``pinned``
    assignor honours).
    """
    if member.leaving:
        return False
    return not _pin_required(task) or member.member_id in task.pinned


def _pin_required(task: TaskDescriptor) -> bool:
    return task.pin_mode == "required" and bool(task.pinned)


# --------------------------------------------------------------------------------------------------
# the shared problem
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AssignmentProblem:
    """The inputs, validated and put in canonical (sorted) order so that input order never matters.

    ``eligible`` maps every *assignable* task (one with at least one eligible member) to its eligible
    members; ``None`` stands for "every active member" (so that unconstrained tasks cost nothing), and
    is also used when a required pin happens to name every active member.
    """

    members: Mapping[str, MemberMetadata]  # by id, sorted
    active: tuple[str, ...]  # ids of the members that are not leaving, sorted
    tasks: Mapping[str, TaskDescriptor]  # by id, sorted
    eligible: Allowed
    previous: Mapping[str, Sequence[str]]

    @classmethod
    def build(
        cls,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> AssignmentProblem:
        by_member = {m.member_id: m for m in sorted(members, key=lambda m: m.member_id)}
        if len(by_member) != len(members):
            raise ValueError(f"duplicate member ids: {_duplicates(m.member_id for m in members)}")
        by_task = {t.task_id: t for t in sorted(tasks, key=lambda t: t.task_id)}
        if len(by_task) != len(tasks):
            raise ValueError(f"duplicate task ids: {_duplicates(t.task_id for t in tasks)}")
        active = tuple(m for m, meta in by_member.items() if not meta.leaving)
        eligible: Allowed = {}
        for tid, task in by_task.items():
            if not _pin_required(task):
                if active:
                    eligible[tid] = None
                continue
            pinned_here = frozenset(m for m in task.pinned if m in by_member and is_eligible(by_member[m], task))
            if pinned_here:  # a pin naming every active member narrows nothing
                eligible[tid] = None if len(pinned_here) == len(active) else pinned_here
        return cls(by_member, active, by_task, eligible, previous)

    def result(self, placement: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
        """The assignment in its published shape: every member, sorted tuples."""
        out: dict[str, list[str]] = {m: [] for m in self.members}
        for tid, member in placement.items():
            out[member].append(tid)
        return {m: tuple(sorted(ts)) for m, ts in out.items()}

    def current_placement(self, allowed: Allowed) -> Placement:
        """Who runs each task now, as far as the members tell us (only placements still allowed).

        A member's ``owned`` (cooperative: what it says it still runs) is the stronger evidence; a
        member that reports nothing falls back to ``previous`` (eager members, or a static member back
        from a restart). When two members claim one task, ``owned`` beats ``previous`` and then the
        lower member id wins: any deterministic choice will do, the protocol layer revokes the other.
        """
        claims: dict[str, tuple[int, str]] = {}
        for mid in self.active:
            meta = self.members[mid]
            evidence, strength = (meta.owned, 0) if meta.owned else (self.previous.get(mid, ()), 1)
            for tid in evidence:
                if tid not in allowed:
                    continue  # deleted, or no longer assignable
                choices = allowed[tid]
                if choices is not None and mid not in choices:
                    continue  # it may not stay there (pin or rack changed)
                claim = (strength, mid)
                if tid not in claims or claim < claims[tid]:
                    claims[tid] = claim
        return {tid: mid for tid, (_, mid) in claims.items()}


def _duplicates(ids: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dup: set[str] = set()
    for i in ids:
        (dup if i in seen else seen).add(i)
    return sorted(dup)


def _least(heap: list[tuple[int, str]], load: Mapping[str, int]) -> str:
    """The least-loaded member (ties: lowest id) in a lazily maintained min-heap of (load, id).

    An entry goes stale when its member's load changes. A raised load leaves an entry that is too
    low: it surfaces early and is refreshed here. A lowered load leaves one that is too high and would
    surface too late, so whoever lowers a load pushes a fresh entry.
    """
    while True:
        seen, mid = heap[0]
        now = load[mid]
        if seen == now:
            return mid
        heapq.heapreplace(heap, (now, mid))


def _heap(members: Iterable[str], load: Mapping[str, int]) -> list[tuple[int, str]]:
    heap = [(load[m], m) for m in members]
    heapq.heapify(heap)
    return heap


# --------------------------------------------------------------------------------------------------
# the classic two
# --------------------------------------------------------------------------------------------------


class RoundRobinAssignor:
    """Kafka's RoundRobinAssignor: tasks by id dealt to members by id in turn.

    A member that may not take the task is skipped (Kafka skips consumers not subscribed to the
    topic), so the turn passes to the next eligible one.
    """

    name: str = "round-robin"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        ring = problem.active
        placement: Placement = {}
        turn = 0
        for tid, choices in problem.eligible.items():
            while choices is not None and ring[turn % len(ring)] not in choices:
                turn += 1
            placement[tid] = ring[turn % len(ring)]
            turn += 1
        return problem.result(placement)


class RangeAssignor:
    """Kafka's RangeAssignor: contiguous ranges of the id-sorted tasks to the id-sorted members.

    Kafka ranges each topic over the consumers subscribed to it. Our "topics" are the classes of tasks
    that share one eligible set (without required pins: a single class, every active member); each
    class is split into ranges, the first ``len % members`` members getting one more.
    """

    name: str = "range"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        classes: dict[frozenset[str] | None, list[str]] = {}
        for tid, choices in problem.eligible.items():
            classes.setdefault(choices, []).append(tid)
        placement: Placement = {}
        for choices, class_tasks in classes.items():
            holders = problem.active if choices is None else tuple(sorted(choices))
            per_member, extra = divmod(len(class_tasks), len(holders))
            start = 0
            for i, mid in enumerate(holders):
                stop = start + per_member + (1 if i < extra else 0)
                for tid in class_tasks[start:stop]:
                    placement[tid] = mid
                start = stop
        return problem.result(placement)


# --------------------------------------------------------------------------------------------------
# sticky: balanced by count, moving the fewest tasks
# --------------------------------------------------------------------------------------------------


def _sticky_placement(problem: AssignmentProblem, allowed: Allowed) -> Placement:
    """Balance task counts over the active members while moving as few running tasks as possible.

    With E active members and A assignable tasks, a balanced assignment gives each member
    q = A // E tasks and r = A % E of them one more. Each member keeps what it holds up to its
    quota; the r "+1" quotas go to members that hold more than q (largest first), because only there
    does a +1 save a move. So the moves are exactly ``orphaned`` plus ``excess`` =
    Σ max(0, held_i − quota_i): the fewest any balanced assignment can make. ``to_place`` (orphaned and
    excess) then goes, most constrained first, to the least-loaded allowed member (ties: for a
    constrained task its current owner, then the lowest id), which fills every member to q or q + 1.
    (An unconstrained excess task never lands back on the member that shed it: that member would end
    above its quota.)

    ``allowed`` narrows where a task may go (None: anywhere). When some task is narrowed, quotas are
    only a guide; :func:`_settle` then moves tasks while one move lowers the spread among the members
    a task may use.
    """
    active = problem.active
    assignable = list(allowed)  # sorted by task id, like problem.tasks
    if not assignable:
        return {}
    width = len(active)

    def flexibility(tid: str) -> int:
        choices = allowed[tid]
        return width if choices is None else len(choices)

    current = problem.current_placement(allowed)
    held: dict[str, list[str]] = {m: [] for m in active}
    orphaned: list[str] = []
    for tid in assignable:
        owner = current.get(tid)
        if owner is None:
            orphaned.append(tid)
        else:
            held[owner].append(tid)

    q, r = divmod(len(assignable), width)
    quota = {m: q for m in active}
    over_q = sorted((m for m in active if len(held[m]) > q), key=lambda m: (-len(held[m]), m))
    for mid in over_q[:r]:
        quota[mid] = q + 1

    kept: dict[str, list[str]] = {}
    excess: list[str] = []
    for mid in active:
        mine = held[mid]
        if len(mine) > quota[mid]:
            mine = sorted(mine, key=lambda t: (flexibility(t), t))  # keep the hardest to move
            excess.extend(mine[quota[mid] :])
            mine = mine[: quota[mid]]
        kept[mid] = mine

    placement: Placement = {tid: mid for mid, tids in kept.items() for tid in tids}
    load = {mid: len(tids) for mid, tids in kept.items()}
    to_place = sorted(orphaned + excess, key=lambda t: (flexibility(t), t))
    heap = _heap(active, load)
    for tid in to_place:
        choices = allowed[tid]
        if choices is None:
            target = _least(heap, load)
        else:  # on a tie, back to the member that shed it: a stable group stays put
            owner = current.get(tid)
            target = min(choices, key=lambda m: (load[m], m != owner, m))
        placement[tid] = target
        load[target] += 1

    if any(choices is not None for choices in allowed.values()):
        _settle(placement, allowed, load, active)
    return placement


def _settle(placement: Placement, allowed: Allowed, load: dict[str, int], active: Sequence[str]) -> None:
    """Move single tasks while some task could go to an allowed member with ≥ 2 fewer tasks.

    Only needed when tasks are narrowed (pins, preferences): the greedy pass alone cannot see that a
    constrained task placed early forces a flexible one elsewhere. Every move lowers Σ load², so
    this ends; on return no single move improves balance ("locally balanced").
    """
    heap = _heap(active, load)
    moved = True
    while moved:
        moved = False
        for tid in sorted(placement):
            source = placement[tid]
            choices = allowed[tid]
            target = _least(heap, load) if choices is None else min(choices, key=lambda m: (load[m], m))
            if load[target] <= load[source] - 2:
                placement[tid] = target
                load[source] -= 1
                load[target] += 1
                heapq.heappush(heap, (load[source], source))
                moved = True


class StickyAssignor:
    """Kafka's StickyAssignor: balanced by count (max − min ≤ 1), moving the minimum number of tasks.

    Current placement is what members report in ``owned``, else ``previous``. Only eligibility
    (leaving members, required pins) narrows where tasks go; preferred pins and racks are ignored.
    O(T log T + T log M).
    """

    name: str = "sticky"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        return problem.result(_sticky_placement(problem, problem.eligible))


class CooperativeStickyAssignor(StickyAssignor):
    """Kafka's CooperativeStickyAssignor: the sticky placement, meant for the cooperative protocol.

    As in Kafka, the algorithm is the sticky one and current placement comes from ``owned``; revoking
    what moves before handing it out is the protocol layer's job, not the assignor's.
    """

    name: str = "cooperative-sticky"


# --------------------------------------------------------------------------------------------------
# weights, pins, racks
# --------------------------------------------------------------------------------------------------


class CapacityAssignor:
    """Weights against capacities, by LPT (longest processing time first).

    Tasks by descending weight (ties by id) each go to the allowed member whose load/capacity would
    be lowest with the task added (ties: the task's current owner, then the lowest id). So heavy tasks
    spread first and light ones fill in. Guarantee: for every member a and the last (lightest) task t
    placed on it, no other member b eligible for t has (load_b + w_t)/cap_b < load_a/cap_a.
    Capacities below 1 count as 1, negative weights as 0.
    """

    name: str = "capacity"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        capacity = {m: max(1, problem.members[m].capacity) for m in problem.active}
        weight = {t: max(0, problem.tasks[t].weight) for t in problem.eligible}
        current = problem.current_placement(problem.eligible)
        load = dict.fromkeys(problem.active, 0)
        # Within one capacity class the lowest load wins, so one heap per class gives the candidates.
        classes: dict[int, list[str]] = {}
        for mid in problem.active:
            classes.setdefault(capacity[mid], []).append(mid)
        heaps = [_heap(ms, load) for ms in classes.values()]
        placement: Placement = {}
        for tid in sorted(problem.eligible, key=lambda t: (-weight[t], t)):
            w = weight[tid]
            owner = current.get(tid)
            choices = problem.eligible[tid]
            candidates = [_least(h, load) for h in heaps] if choices is None else list(choices)
            if owner is not None:
                candidates.append(owner)
            target = min(candidates, key=lambda m: (Fraction(load[m] + w, capacity[m]), m != owner, m))
            placement[tid] = target
            load[target] += w
        return problem.result(placement)


class PinnedAssignor:
    """Explicit task → member affinity (``placement.pinned``), balanced by count among allowed members.

    ``required``: only on a pinned member (unassigned if none is present). ``preferred``: on a pinned
    member if any is present, else anywhere. Unpinned tasks go anywhere. Sticky like ``sticky`` where
    the pins allow: a preferred task running elsewhere returns as soon as a pinned member is back.
    """

    name: str = "pinned"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        active = frozenset(problem.active)
        allowed: Allowed = {}
        for tid, choices in problem.eligible.items():
            pinned_here = frozenset(m for m in problem.tasks[tid].pinned if m in active)
            allowed[tid] = pinned_here if pinned_here else choices
        return problem.result(_sticky_placement(problem, allowed))


class RackAwareAssignor:
    """Rack affinity: a task naming a rack runs in that rack while it has an eligible member.

    ``bound`` tasks (in-rack, or narrowed by a required pin) go first, most constrained first, each to
    the least-loaded member it may use. ``free`` tasks (no rack, or a rack with no member) are then
    dealt across racks so that racks differ by at most one free task (ties: the rack whose
    least-loaded member has least, then rack name; members without a rack form one group), and within
    the rack to its least-loaded member. Without required pins every rack's members differ by ≤ 1.
    """

    name: str = "rack-aware"

    def assign(
        self,
        members: Sequence[MemberMetadata],
        tasks: Sequence[TaskDescriptor],
        previous: Mapping[str, Sequence[str]],
    ) -> dict[str, tuple[str, ...]]:
        problem = AssignmentProblem.build(members, tasks, previous)
        racks: dict[str | None, list[str]] = {}
        for mid in problem.active:
            racks.setdefault(problem.members[mid].rack, []).append(mid)
        rack_order = sorted(racks, key=lambda r: (r is None, r or ""))
        load = dict.fromkeys(problem.active, 0)
        rack_heap = {r: _heap(racks[r], load) for r in rack_order}

        in_rack: list[tuple[str, str | None]] = []  # (task, rack): the whole rack may take it
        narrowed: list[tuple[str, frozenset[str]]] = []  # (task, members): a pinned subset
        free: list[str] = []
        for tid, choices in problem.eligible.items():
            rack = problem.tasks[tid].rack
            if choices is None:
                if rack is not None and rack in racks:
                    in_rack.append((tid, rack))
                else:
                    free.append(tid)
                continue
            same_rack = frozenset(m for m in choices if problem.members[m].rack == rack)
            narrowed.append((tid, same_rack if rack is not None and same_rack else choices))

        placement: Placement = {}
        for tid, subset in sorted(narrowed, key=lambda e: (len(e[1]), e[0])):
            target = min(subset, key=lambda m: (load[m], m))
            placement[tid] = target
            load[target] += 1
        for tid, rack in in_rack:
            target = _least(rack_heap[rack], load)
            placement[tid] = target
            load[target] += 1
        dealt = dict.fromkeys(rack_order, 0)  # free tasks per rack
        for tid in free:
            rack = min(rack_order, key=lambda r: (dealt[r], load[_least(rack_heap[r], load)]))
            target = _least(rack_heap[rack], load)
            placement[tid] = target
            load[target] += 1
            dealt[rack] += 1
        return problem.result(placement)


# --------------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------------

ASSIGNORS: dict[str, Assignor] = {
    a.name: a
    for a in (
        RoundRobinAssignor(),
        RangeAssignor(),
        StickyAssignor(),
        CooperativeStickyAssignor(),
        CapacityAssignor(),
        PinnedAssignor(),
        RackAwareAssignor(),
        LoadBalancedAssignor(),
    )
}


def get_assignor(name: str) -> Assignor:
    """The assignor called ``name``; a ValueError that lists the known names otherwise."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(f"unknown assignor {name!r}; known assignors: {', '.join(sorted(ASSIGNORS))}") from None
