"""Operations on a group, sans-IO: the move throttle's waves, maintenance mode, the operators' settings and
the preferred layout it measures the group's imbalance against. A part of
:class:`~controller.protocol.group.coordinator.GroupCoordinator`, which owns one and gives it the few things it needs of
the group (:class:`OperationsCore`); ``controller/protocol/group/throttle.py`` plans the waves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.assignors_load import LoadPlan
from controller.protocol.group.assignors_load import plan as plan_load
from controller.protocol.group.load_balance import ASSIGNOR as LOAD_ASSIGNOR
from controller.protocol.group.load_balance import LoadWatch
from controller.protocol.group.state import GroupState
from controller.protocol.group.throttle import Move, Wave, plan_wave
from controller.protocol.group.vocabulary import Ask, GroupView, Rebalance, ShowState, Step
from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import (
    MAX_INCOMING,
    JoinRequest,
    MemberMetadata,
    TaskDescriptor,
)

log = logging.getLogger(__name__)


class OperationsCore(GroupView, Protocol):
    """What the operations part reads of its group beyond ``GroupView``: its members and their assignment,
    and the members kept from work (a back-off, which is no imbalance)."""

    @property
    def assignor(self) -> str | None: ...
    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def generation_members(self) -> tuple[str, ...]: ...
    @property
    def assignment(self) -> Mapping[str, tuple[str, ...]]: ...
    @property
    def shutting_down(self) -> Collection[str]: ...

    def kept_from_work(self) -> Collection[str]: ...


@dataclass(eq=False)
class GroupOperations:
    """The throttle, maintenance mode and the preferred placement of one group."""

    core: OperationsCore = field(repr=False)
    limits: MoveLimits = field(default_factory=MoveLimits)
    #: what the cluster-wide limit leaves this group (the IO layer sets it from the other groups' moves)
    cluster_room: int | None = None
    maintenance: bool = False
    moving: dict[str, Move] = field(default_factory=dict)
    deferred: tuple[str, ...] = ()
    #: a rebalance that maintenance mode put off (why), started when it ends
    postponed: str = ""
    #: task -> member: the preferred layout being restored (``rebalance --preferred``), wave by wave
    preferred: dict[str, str] = field(default_factory=dict)
    #: task -> member: an operator's reassignment or a planned roll's step, required until that member leaves
    reassign: dict[str, str] = field(default_factory=dict)
    #: member -> tasks a planned roll moves to it next: announced in its assignment (``Assignment.incoming``)
    #: so that it prepares their start before they arrive
    incoming: dict[str, tuple[str, ...]] = field(default_factory=dict)
    imbalance: int | None = None
    preferred_check_s: float = 0.0
    max_imbalance: int = 1
    next_check: float | None = None
    #: a load-balanced group's figures and hysteresis, its window from the group's config
    load: LoadWatch = field(init=False)

    def __post_init__(self) -> None:
        self.load = LoadWatch(self.core.config.load_window_s, self.core.config.load_check_s)

    # ---- inputs -----------------------------------------------------------------------------------
    def configure(
        self,
        limits: MoveLimits,
        maintenance: bool,
        max_imbalance: int,
        preferred_check_s: float,
        next_check: float | None,
    ) -> None:
        """A new group takes the settings and the maintenance mode in force (it has placed nothing: no decision)."""
        self.limits, self.maintenance, self.max_imbalance = limits, maintenance, max_imbalance
        self.preferred_check_s, self.next_check = preferred_check_s, next_check

    def set_room(self, room: int | None) -> None:
        """What the cluster-wide limit leaves this group now (the IO layer counts the other groups' moves)."""
        self.cluster_room = room

    def on_settings(self, limits: MoveLimits, preferred_check_s: float, max_imbalance: int, reconciling: bool) -> Ask:
        """The operators' settings changed: a wider throttle may let the next wave go now."""
        self.limits = limits
        self.max_imbalance = max_imbalance
        if preferred_check_s != self.preferred_check_s:
            self.preferred_check_s = preferred_check_s
            self.next_check = self.core.clock.now() + preferred_check_s if preferred_check_s > 0 else None
        return self.next_wave(reconciling)

    def on_maintenance(self, on: bool) -> Ask:
        """Maintenance mode: while on, nothing moves and nothing gains an owner; a departed member's tasks
        wait for it (held without a deadline) and the rebalances it would have caused wait for the end."""
        core = self.core
        if on == self.maintenance:
            return None
        self.maintenance = on
        if on:
            return ShowState("maintenance mode: placement frozen")
        released = core.holds.end_maintenance()
        placed = {t for ts in core.assignment.values() for t in ts}
        why = self.postponed or ("maintenance ended: held tasks move" if released else "")
        if not why and (
            self.deferred
            or set(core.tasks) - placed - core.holds.tasks()
            or set(core.members) - set(core.generation_members)
        ):
            why = "maintenance ended"
        self.postponed = ""
        if why and core.members and core.state is not GroupState.DEAD:
            return Rebalance(f"maintenance ended ({why})" if not why.startswith("maintenance") else why)
        return ShowState("maintenance ended")

    def on_move_done(self, task_id: str, broker: str, reconciling: bool) -> Ask:
        """A moved task runs on its new owner (or ended there): its slot in the throttle is free."""
        mv = self.moving.get(task_id)
        if mv is None or mv.dest != broker:
            return None
        del self.moving[task_id]
        return self.next_wave(reconciling) or (ShowState() if not self.moving else None)

    def next_wave(self, reconciling: bool) -> Ask:
        """Deferred moves go once the last wave's tasks all run (and the cluster's limit leaves room)."""
        core = self.core
        if reconciling:
            if self.deferred and not self.moving and not self.maintenance and self.room() != 0:
                return Step(f"next wave: {len(self.deferred)} moves waiting for the throttle")
            return None
        if (
            self.deferred
            and not self.moving
            and core.state is GroupState.STABLE
            and not self.maintenance
            and core.members
            and self.room() != 0
        ):
            return Rebalance(f"next wave: {len(self.deferred)} moves waiting for the throttle")
        return None

    # ---- the throttle -----------------------------------------------------------------------------
    def throttled(self) -> bool:
        """Whether moves are counted: a limit or maintenance mode is in force."""
        return (
            self.maintenance
            or self.cluster_room is not None
            or self.limits.max_moves is not None
            or self.limits.max_moves_per_broker is not None
        )

    def room(self) -> int | None:
        """How many more moves may start now (None: no limit)."""
        left = None if self.limits.max_moves is None else self.limits.max_moves - len(self.moving)
        if self.cluster_room is not None:
            left = self.cluster_room if left is None else min(left, self.cluster_room)
        return None if left is None else max(0, left)

    def wave(
        self,
        assigned: Mapping[str, tuple[str, ...]],
        revoked: Mapping[str, tuple[str, ...]],
        had: Callable[[], Mapping[str, Iterable[str]]],
        leaving: Callable[[], Iterable[str]],
    ) -> Wave:
        """This generation's share of a placement under the throttle (all of it when no limit is in force),
        its moves counted from here on. ``had`` and ``leaving`` are asked only when moves are counted."""
        if self.throttled():
            wave = plan_wave(
                assigned,
                revoked,
                had(),
                self.core.tasks,
                self.moving,
                self.limits,
                self.core.clock.now(),
                frozen=self.maintenance,
                room=self.cluster_room,
                leaving=leaving(),
            )
        else:  # no limit in force: nothing to count, no status to watch
            wave = Wave(dict(assigned), {m: ts for m, ts in revoked.items() if ts}, {}, ())
        self.moving, self.deferred = wave.moving, wave.deferred
        return wave

    def resume_moves(self, tasks: Iterable[str], where: Mapping[str, str]) -> None:
        """Failover: the moves the previous controller recorded in flight count again from now."""
        now = self.core.clock.now()
        self.moving = {t: Move(t, None, where.get(t), now) for t in tasks if t in self.core.tasks}

    def drop_moves(self, dest: str | None = None, runnable: Collection[str] | None = None) -> None:
        """Moves that ended without arriving: into a member that left (``dest``), of tasks no longer runnable."""
        for t in [
            t
            for t, mv in self.moving.items()
            if (dest is not None and mv.dest == dest) or (runnable is not None and t not in runnable)
        ]:
            del self.moving[t]

    def expire_moves(self, now: float) -> list[str]:
        """Moves not done within the move timeout stop counting against the throttle."""
        timeout = self.core.config.move_timeout_s
        stale = [t for t, mv in self.moving.items() if now >= mv.since + timeout]
        for t in stale:
            log.warning(
                "group %s: the move of %s to %s is not done after %.0fs; it stops counting against the throttle",
                self.core.group,
                t,
                self.moving[t].dest,
                timeout,
            )
            del self.moving[t]
        return stale

    def forget_tasks(self, runnable: Collection[str]) -> None:
        """The group's runnable tasks changed: the pins and the moves of tasks no longer runnable go."""
        for t in [t for t in self.reassign if t not in runnable]:
            del self.reassign[t]
        self.drop_moves(runnable=runnable)

    def postpone(self, why: str) -> None:
        """Maintenance mode puts off a rebalance: the first reason is kept, and it starts when maintenance ends."""
        self.postponed = self.postponed or why

    def deadline(self) -> float | None:
        """The earliest of the next imbalance check, the next load check and the moves' timeouts."""
        candidates = [mv.since + self.core.config.move_timeout_s for mv in self.moving.values()]
        if self.next_check is not None:
            candidates.append(self.next_check)
        if self.balancing_load() and self.core.members:
            candidates.append(self.load.next_check or self.core.clock.now() + self.load.check_s)
        return min(candidates) if candidates else None

    # ---- pins: an operator's reassignment, a planned roll ------------------------------------------------
    def pin(self, task_id: str, to: str) -> None:
        """One task to one member: a required placement until that member leaves."""
        self.reassign[task_id] = to

    def pin_roll(self, placement: Mapping[str, str]) -> bool:
        """A planned roll's step: every task it names pinned to that member; whether something is not where
        the plan puts it (a rebalance moves exactly that)."""
        core = self.core
        self.reassign = {t: m for t, m in placement.items() if t in core.tasks and m in core.members}
        current = {t: m for m, ts in core.assignment.items() for t in ts}
        return not all(current.get(t) == m for t, m in self.reassign.items())

    def announce(self, incoming: Mapping[str, Iterable[str]]) -> None:
        """A planned roll's next moves, announced to the members that receive them before any of them moves."""
        self.incoming = {m: tuple(sorted(ts)) for m, ts in incoming.items() if ts and m in self.core.members}

    def end_roll(self) -> bool:
        """The roll is over (or paused): no pins left, nothing announced; whether anything was announced."""
        self.reassign.clear()
        announced = bool(self.incoming)
        self.incoming.clear()
        return announced

    def incoming_for(self, member_id: str, assigned: Collection[str]) -> tuple[str, ...]:
        """What a member's assignment announces as incoming: the roll's next moves to it, less what it is
        assigned already and tasks gone, at most ``MAX_INCOMING``."""
        ts = self.incoming.get(member_id)
        if not ts:
            return ()
        mine = set(assigned)
        return tuple(t for t in ts if t not in mine and t in self.core.tasks)[:MAX_INCOMING]

    def descriptors(self, eligible: Mapping[str, JoinRequest], skip: Collection[str] = ()) -> list[TaskDescriptor]:
        """The group's tasks as its assignor gets them (``skip``: tasks left out, e.g. held). A task being
        reassigned, or restored to its preferred member, is pinned to that member while it is ``eligible``
        (a preferred one also while it is not leaving); a pin that can no longer hold is dropped."""
        tasks = self.core.tasks
        if not (skip or self.reassign or self.preferred):  # (most rounds: every task as it is)
            return self.with_loads([tasks[t_id] for t_id in sorted(tasks)])
        descriptors = []
        for t_id in sorted(tasks):
            if t_id in skip:
                continue
            d = tasks[t_id]
            to = self.reassign.get(t_id) or self.preferred.get(t_id)
            if to is not None and to in eligible and (t_id in self.reassign or not eligible[to].leaving):
                d = TaskDescriptor(task_id=d.task_id, weight=d.weight, pinned=(to,), pin_mode="required", rack=d.rack)
            elif to is not None:
                self.reassign.pop(t_id, None)
                self.preferred.pop(t_id, None)
            descriptors.append(d)
        return self.with_loads(descriptors)

    # ---- the preferred layout ---------------------------------------------------------------------
    def restore_preferred(self) -> int:
        """``rebalance --preferred``: pin every task to its member in the preferred layout; how many move."""
        self.preferred = self.layout(previous={})
        return sum(1 for t, m in self.preferred.items() if t not in self.core.assignment.get(m, ()))

    def settle_preferred(self, placed: Mapping[str, tuple[str, ...]], members: Collection[str]) -> None:
        """A pin that has done its work (its task placed on its member, or no longer possible) is dropped."""
        for t, to in list(self.preferred.items()):
            if t in placed.get(to, ()) or t not in self.core.tasks or to not in members:
                del self.preferred[t]

    def check_imbalance(self, now: float) -> Ask:
        """At the periodic check (the coordinator asks once the load check asked for nothing): measure the
        imbalance, and rebalance a Stable group off its layout by more than ``max_imbalance`` tasks (when
        nothing moves and nothing waits)."""
        if self.next_check is None or now < self.next_check:
            return None
        core = self.core
        self.next_check = now + self.preferred_check_s if self.preferred_check_s > 0 else None
        if core.state is not GroupState.STABLE or not core.members:
            return None
        before = self.imbalance
        self.imbalance = imbalance = self.measure_imbalance()
        if imbalance > self.max_imbalance and not self.maintenance and not self.moving and not self.deferred:
            return Rebalance(f"imbalance: {imbalance} tasks off the assignor's layout")
        return ShowState() if imbalance != before else None

    def layout(self, previous: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
        """Task -> member in the layout the group's assignor gives from ``previous`` (empty: no history), among
        the members not kept from work (a back-off is no imbalance to rebalance)."""
        core = self.core
        kept = core.kept_from_work()
        members = [
            MemberMetadata(
                member_id=m,
                capacity=r.capacity,
                rack=r.rack,
                instance_id=r.instance_id,
                leaving=r.leaving or m in core.shutting_down,
            )
            for m, r in sorted(core.members.items())
            if m in core.generation_members and m not in kept
        ]
        if not members:
            return {}
        held = core.holds.tasks()
        tasks = [d for t, d in sorted(core.tasks.items()) if t not in held]
        try:
            target = get_assignor(core.assignor or core.config.default_assignor).assign(members, tasks, previous)
        except (KeyError, ValueError) as exc:
            log.warning("group %s: cannot compute a layout: %s", core.group, exc)
            return {}
        return {t: m for m, ts in target.items() for t in ts}

    # ---- load ---------------------------------------------------------------------------------------
    def balancing_load(self) -> bool:
        return (self.core.assignor or self.core.config.default_assignor) == LOAD_ASSIGNOR

    def with_loads(self, descriptors: list[TaskDescriptor]) -> list[TaskDescriptor]:
        """The descriptors with their measured loads, for a load-balanced group (as they are for any other)."""
        if not self.balancing_load():
            return descriptors
        now = self.core.clock.now()
        self.load.note_assignment(self.core.assignment, now)
        return self.load.descriptors(descriptors, now, self.core.assignment)

    def load_plan(self) -> LoadPlan | None:
        """What the load-balanced assignor would do from where the tasks run now (None: no member)."""
        core = self.core
        members = [
            MemberMetadata(member_id=m, capacity=r.capacity, rack=r.rack, leaving=r.leaving or m in core.shutting_down)
            for m, r in sorted(core.members.items())
            if m in core.generation_members
        ]
        if not members:
            return None
        held = core.holds.tasks()
        current = {m: ts for m, ts in core.assignment.items() if m in core.generation_members}
        tasks = self.with_loads([d for t, d in sorted(core.tasks.items()) if t not in held])
        try:
            return plan_load(members, tasks, current)
        except (KeyError, ValueError) as exc:
            log.warning("group %s: cannot plan by load: %s", core.group, exc)
            return None

    def check_load(self, now: float) -> Ask:
        """A load-balanced group's periodic check: rebalance once the assignor has wanted to move something for
        load at every check for a whole window (and nothing else is moving or frozen)."""
        core = self.core
        if not self.balancing_load() or not self.load.due(now):
            return None
        self.load.note_assignment(core.assignment, now)
        if core.state is not GroupState.STABLE or not core.members or self.maintenance or self.moving or self.deferred:
            return None
        found = self.load_plan()
        if found is None:
            return None
        self.load.last_plan = tuple(found.explain())
        if not self.load.observe(now, bool(found.moves)):
            return None
        over = ", ".join(f"{m} {by:+.2f}" for m, by in found.over(found.before).items())
        moved = ", ".join(f"{mv.task} {mv.source}->{mv.dest}" for mv in found.moves)
        return Rebalance(f"load: {over} over the mean {found.mean:.2f} for {self.load.window_s:g}s; moving {moved}")

    def measure_imbalance(self) -> int:
        """How many tasks the group's assignor would move from where they run now (0: balanced)."""
        current = {m: ts for m, ts in self.core.assignment.items() if m in self.core.generation_members}
        target = self.layout(previous=current)
        where = {t: m for m, ts in current.items() for t in ts}
        return sum(1 for t, m in target.items() if where.get(t) != m)
