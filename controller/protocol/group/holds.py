"""Tasks held for a member that left, sans-IO: instead of moving, they wait for it to come back, for the
scheduled rebalance delay (a static member), until a planned roll's deadline (a broker restarted in place), or
without a deadline while maintenance mode lasts. A part of :class:`~controller.protocol.group.coordinator.GroupCoordinator`,
which owns one (``holds``) and gives it the few things it needs of the group (:class:`HoldsCore`); either
protocol family asks it, as a member leaves, whether that member's tasks wait, and takes them back from it when
the member returns. The holds are written with the group state, so a failover keeps them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.clock import Clock
from controller.protocol.group.rules import identity
from controller.protocol.group.state import GroupState
from controller.protocol.group.throttle import Throttle
from controller.protocol.group.vocabulary import FOREVER, Decision, GroupView, WriteGroupState
from controller.protocol.records.group_messages import (
    Assignment,
    GroupStateInfo,
    HeldTasks,
    JoinRequest,
    TaskDescriptor,
)

log = logging.getLogger(__name__)


@dataclass
class Held:
    """Tasks of a departed member, waiting up to the delay for it (same instance id) to return."""

    tasks: tuple[str, ...]
    deadline: float


class HoldsCore(GroupView, Protocol):
    """What the holds need of their group beyond ``GroupView``: the wall clock their deadlines are written in,
    whether maintenance mode is on, its members and their placement, and its state (written when a hold
    changes)."""

    @property
    def wall(self) -> Clock: ...
    @property
    def operations(self) -> Throttle: ...
    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def assignment(self) -> Mapping[str, tuple[str, ...]]: ...

    def info(self) -> GroupStateInfo: ...


@dataclass(eq=False)
class Holds:
    """The tasks one group holds for departed members (by identity: a static member's instance id), and the
    members whose tasks are to wait when they leave."""

    core: HoldsCore = field(repr=False)
    #: identity -> the tasks held for it, and until when
    held: dict[str, Held] = field(default_factory=dict)
    #: members a planned roll restarts in place: when one leaves, its tasks wait for it until this deadline
    leave_holds: dict[str, float] = field(default_factory=dict)
    #: identity -> tasks of members that left during the join round now under way, neither held nor placed
    #: again yet: should maintenance mode begin before the round ends, they wait for their member
    departed: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def tasks(self) -> set[str]:
        """Every task held (left out of every placement while it waits)."""
        return {t for h in self.held.values() for t in h.tasks}

    def deadline(self) -> float | None:
        """When the first hold with a deadline expires (None: none has one)."""
        return min((h.deadline for h in self.held.values() if h.deadline != FOREVER), default=None)

    def info(self) -> tuple[HeldTasks, ...]:
        """The holds with wall-clock deadlines (a remaining delay carried from this clock to the wall's);
        a hold of maintenance mode has none."""
        now, wall = self.core.clock.now(), self.core.wall.now()
        return tuple(
            HeldTasks(
                instance=k,
                tasks=tuple(sorted(h.tasks)),
                until=None if h.deadline == FOREVER else round(wall + h.deadline - now, 3),
            )
            for k, h in sorted(self.held.items())
        )

    def note(self, before: tuple[HeldTasks, ...], decisions: list[Decision]) -> list[Decision]:
        """A hold made, ended or shrunk is written with the group state (ZooKeeper keeps it across failover)."""
        if (
            [(h.instance, h.tasks) for h in before] != [(h.instance, h.tasks) for h in self.info()]
            and self.core.state is not GroupState.DEAD
            and not any(isinstance(d, WriteGroupState) for d in decisions)
        ):
            decisions.append(WriteGroupState(self.core.info()))
        return decisions

    # ---- made --------------------------------------------------------------------------------------
    def note_departed(self, key: str, tasks: tuple[str, ...]) -> None:
        """A generation member left during a join round with ``tasks``, neither held nor placed again yet."""
        self.departed[key] = tasks

    def hold_on_leave(self, member_id: str, seconds: float) -> bool:
        """A planned roll restarts this member in place (its tasks have nowhere to go first): when it leaves,
        its tasks wait up to ``seconds`` for it to come back, as a static member's do, instead of moving.
        False for a member not in the group."""
        if member_id not in self.core.members:
            return False
        self.leave_holds[member_id] = self.core.clock.now() + max(0.0, seconds)
        return True

    def on_leave(self, member: str, key: str, tasks: tuple[str, ...], leaving: bool) -> bool:
        """A member (identity ``key``) left with ``tasks``: they wait for it while a planned roll restarts it
        in place, in maintenance mode, or (unless it left on purpose) for the scheduled rebalance delay. False
        when they do not wait (they are placed again)."""
        core = self.core
        now = core.clock.now()
        hold_until = self.leave_holds.pop(member, None)
        if not tasks:
            return False
        if hold_until is not None and hold_until > now:
            self.held[key] = Held(tasks, hold_until)
            log.info("group %s: %s restarts in place; its %d tasks wait for it", core.group, member, len(tasks))
        elif core.operations.maintenance:
            kept = self.held[key].tasks if key in self.held else ()
            self.held[key] = Held(tuple(sorted(set(kept) | set(tasks))), FOREVER)
            log.info("group %s: %s left in maintenance mode; its %d tasks wait", core.group, member, len(tasks))
        elif core.config.scheduled_rebalance_delay_s > 0 and not leaving:
            self.held[key] = Held(tasks, now + core.config.scheduled_rebalance_delay_s)
            log.info(
                "group %s: %s left; holding %d tasks for %.1fs",
                core.group,
                member,
                len(tasks),
                core.config.scheduled_rebalance_delay_s,
            )
        else:
            return False
        return True

    def hold_departed(self) -> bool:
        """The tasks of the members that left during the join round under way, not placed again, are held for
        them without a deadline (maintenance mode's hold). True when the round's join result is out already
        (AwaitingSync), so the round must run again without those tasks."""
        core = self.core
        if core.state not in (GroupState.PREPARING_REBALANCE, GroupState.AWAITING_SYNC):
            self.departed.clear()
            return False
        present = {identity(m, r) for m, r in core.members.items()}
        placed = {t for ts in core.assignment.values() for t in ts} | self.tasks()
        added = False
        for key, tasks in sorted(self.departed.items()):
            keep = tuple(sorted(t for t in tasks if t in core.tasks and t not in placed))
            if key in present or not keep:
                continue  # back already (it rejoins this round), or nothing of it left to wait
            self.held[key] = Held(keep, FOREVER)
            added = True
            log.info(
                "group %s: maintenance mode: %d tasks of %s, lost in this rebalance, wait", core.group, len(keep), key
            )
        self.departed.clear()
        return added and core.state is GroupState.AWAITING_SYNC

    # ---- ended -------------------------------------------------------------------------------------
    def take(self, key: str) -> tuple[str, ...]:
        """Its member is back: the tasks held for it, no longer held."""
        return self.held.pop(key).tasks

    def expire(self, now: float) -> list[str]:
        """The holds whose delay is over, ended: their tasks move (the identities they were held for)."""
        expired = [k for k, h in self.held.items() if h.deadline <= now]
        for k in expired:
            log.info("group %s: %s did not return within the delay; its tasks move", self.core.group, k)
            del self.held[k]
        return expired

    def end_maintenance(self) -> list[str]:
        """Maintenance mode ended: its holds (no deadline) end, their tasks move (the identities released)."""
        released = [k for k, h in self.held.items() if h.deadline == FOREVER]
        for k in released:
            del self.held[k]
        return released

    def keep_only(self, tasks: Mapping[str, TaskDescriptor]) -> None:
        """The group's tasks changed: a task gone is held no more (a hold left with none ends)."""
        for key, h in list(self.held.items()):
            kept = tuple(t for t in h.tasks if t in tasks)
            if kept:
                h.tasks = kept
            else:
                del self.held[key]

    # ---- failover ----------------------------------------------------------------------------------
    def restore(self, info: GroupStateInfo) -> None:
        """The holds of the previous controller, minus members back already and tasks gone or placed."""
        core = self.core
        now, wall = core.clock.now(), core.wall.now()
        present = {identity(m, r) for m, r in core.members.items()}
        placed = {t for ts in core.assignment.values() for t in ts}
        for h in info.held:
            tasks = tuple(t for t in h.tasks if t in core.tasks and t not in placed)
            if h.until is None and not core.operations.maintenance:
                continue  # held for a maintenance that has ended since: the tasks move now
            if tasks and h.instance not in present:
                self.held[h.instance] = Held(tasks, FOREVER if h.until is None else now + max(0.0, h.until - wall))

    def hold_lost(self, info: GroupStateInfo, assignments: Mapping[str, Assignment], generation: int | None) -> None:
        """Maintenance mode at failover: the members of the last-written group that are gone now (their sessions
        ended while no controller was active) have the tasks they were published held for them, as the live
        path holds those of a member that leaves in maintenance mode. Without it the failover's rebalance would
        move them, in the very window where nothing may move. ``generation``: the join round's generation whose
        assignments count (None: reconcile, where each member has its own epoch)."""
        core = self.core
        if not core.operations.maintenance:
            return
        present = {identity(m, r) for m, r in core.members.items()}
        placed = {t for ts in core.assignment.values() for t in ts} | self.tasks()
        for m in sorted(set(info.members) - set(core.members)):
            a = assignments.get(m)
            if a is None or a.error is not None or (generation is not None and a.generation != generation):
                continue
            if m in present:
                continue  # (a static member back under another member id)
            keep = tuple(sorted(t for t in a.assigned if t in core.tasks and t not in placed))
            if keep:
                kept = self.held[m].tasks if m in self.held else ()
                self.held[m] = Held(tuple(sorted(set(kept) | set(keep))), FOREVER)
                log.info("group %s: maintenance mode: %d tasks of %s, lost at failover, wait", core.group, len(keep), m)
