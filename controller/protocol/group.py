"""The group coordinator, sans-IO: one GroupCoordinator per group, fed events, returning decisions.

It never touches ZooKeeper. The controller's event thread feeds it snapshots (members' join requests,
the group's tasks), leader proposals, operator requests and clock ticks, and carries out the decisions
it returns (fenced writes). That is what lets the deterministic simulation drive it directly.

States and transitions follow Kafka's GroupCoordinator (GroupMetadata.scala): each state names the
states it may be entered from, and one ``_transition`` refuses anything else loudly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Collection, Mapping

from controller.protocol.clock import Clock, WallClock
from controller.protocol.codecs import (
    Assignment,
    GroupStateInfo,
    HeldTasks,
    JoinRequest,
    JoinResult,
    MoveLimits,
    TaskDescriptor,
)
from controller.protocol.errors import ProtocolError
from controller.protocol.group_types import (  # noqa: F401 (the coordinator's vocabulary, imported from here too)
    FOREVER,
    VALID_PREVIOUS,
    DeleteGenerationsBelow,
    Decision,
    GroupConfig,
    GroupState,
    IllegalTransition,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
    Held,
    check_transition,
)
from controller.protocol.group_operations import OperationsMixin
from controller.protocol.join_round import JoinRoundMixin
from controller.protocol.rules import RECONCILE
from controller.protocol.reconcile import ReconcileMixin
from controller.protocol.throttle import Move

log = logging.getLogger(__name__)


@dataclass
class GroupCoordinator(ReconcileMixin, JoinRoundMixin, OperationsMixin):
    group: str
    controller_epoch: int
    clock: Clock
    config: GroupConfig = field(default_factory=GroupConfig)
    #: for the holds' deadlines in ZooKeeper: a monotonic clock does not survive a failover, wall time does
    wall: Clock = field(default_factory=WallClock)

    state: GroupState = GroupState.EMPTY
    #: wall time the group entered its state (what a benchmark takes as the instant a group became Stable)
    state_since: float | None = None
    generation: int = 0
    join_generation: int = 0
    protocol: str | None = None
    assignor: str | None = None
    leader: str | None = None
    generation_members: tuple[str, ...] = ()
    reason: str = ""
    members: dict[str, JoinRequest] = field(default_factory=dict)
    tasks: dict[str, TaskDescriptor] = field(default_factory=dict)
    assignment: dict[str, tuple[str, ...]] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)
    shutting_down: set[str] = field(default_factory=set)
    reassign: dict[str, str] = field(default_factory=dict)
    excluded: dict[str, tuple[ProtocolError, JoinRequest]] = field(default_factory=dict)
    # join requests answered by a static rejoin: they predate the tasks given back, so they do not
    # count as joining the next generation until the member rewrites them
    static_returned: dict[str, JoinRequest] = field(default_factory=dict)
    join_deadline: float | None = None
    sync_deadline: float | None = None
    join_result: JoinResult | None = None
    rebalances: int = 0
    # ---- operations: throttle, maintenance, preferred placement (controller/protocol/throttle.py) ----
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
    imbalance: int | None = None
    preferred_check_s: float = 0.0
    max_imbalance: int = 1
    next_check: float | None = None
    # ---- reconcile protocol (controller/protocol/reconcile.py) ----
    #: member -> the tasks the assignor gives it
    target: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: member -> task -> the member epoch of a revocation not yet confirmed released
    unreleased: dict[str, dict[str, int]] = field(default_factory=dict)
    #: member -> the member epoch of its last published assignment
    epochs: dict[str, int] = field(default_factory=dict)
    last_retarget: float = float("-inf")
    #: a new target put off by ``retarget_interval_s`` (when, and why)
    retarget_due: float | None = None
    retarget_reason: str = ""
    #: reconcile: while a new group forms (nothing runs yet), the latest its first target may wait until
    forming_until: float | None = None

    # ---- state ------------------------------------------------------------------------------------
    def _transition(self, target: GroupState) -> None:
        check_transition(self.state, target)
        log.debug("group %s: %s -> %s (%s)", self.group, self.state.value, target.value, self.reason)
        self.state = target
        self.state_since = self.wall.now()

    def info(self) -> GroupStateInfo:
        return GroupStateInfo(
            state=self.state.value,
            generation=self.generation,
            join_generation=self.join_generation,
            controller_epoch=self.controller_epoch,
            protocol=self.protocol,
            assignor=self.assignor,
            leader=self.leader,
            members=self.generation_members,
            reason=self.reason,
            held=self._held_info(),
            moving=tuple(sorted(self.moving)),
            deferred=len(self.deferred),
            imbalance=self.imbalance,
            maintenance=self.maintenance,
        )

    def _held_info(self) -> tuple[HeldTasks, ...]:
        """The holds with wall-clock deadlines (a remaining delay carried from this clock to the wall's);
        a hold of maintenance mode has none."""
        now, wall = self.clock.now(), self.wall.now()
        return tuple(HeldTasks(instance=k, tasks=tuple(sorted(h.tasks)),
                               until=None if h.deadline == FOREVER else round(wall + h.deadline - now, 3))
                     for k, h in sorted(self.held.items()))

    def _restore_held(self, info: GroupStateInfo) -> None:
        """The holds of the previous controller, minus members back already and tasks gone or placed."""
        now, wall = self.clock.now(), self.wall.now()
        present = {self.identity(m, r) for m, r in self.members.items()}
        placed = {t for ts in self.assignment.values() for t in ts}
        for h in info.held:
            tasks = tuple(t for t in h.tasks if t in self.tasks and t not in placed)
            if h.until is None and not self.maintenance:
                continue  # held for a maintenance that has ended since: the tasks move now
            if tasks and h.instance not in present:
                self.held[h.instance] = Held(tasks, FOREVER if h.until is None else now + max(0.0, h.until - wall))

    def _note_held(self, before: tuple[HeldTasks, ...], decisions: list[Decision]) -> list[Decision]:
        """A hold made, ended or shrunk is written with the group state (ZooKeeper keeps it across failover)."""
        if [(h.instance, h.tasks) for h in before] != [(h.instance, h.tasks) for h in self._held_info()] \
                and self.state is not GroupState.DEAD and not any(isinstance(d, WriteGroupState) for d in decisions):
            decisions.append(WriteGroupState(self.info()))
        return decisions

    def next_deadline(self) -> float | None:
        candidates = [d for d in (self.join_deadline, self.sync_deadline, self.next_check, self.retarget_due)
                      if d is not None]
        candidates += [h.deadline for h in self.held.values() if h.deadline != FOREVER]
        candidates += [mv.since + self.config.move_timeout_s for mv in self.moving.values()]
        return min(candidates) if candidates else None

    def held_tasks(self) -> set[str]:
        return {t for h in self.held.values() for t in h.tasks}

    @staticmethod
    def identity(member_id: str, request: JoinRequest | None) -> str:
        """Static members are known by instance id across restarts; others by member id."""
        return request.instance_id if request is not None and request.instance_id else member_id

    # ---- inputs -----------------------------------------------------------------------------------
    def load(
        self,
        info: GroupStateInfo | None,
        members: Mapping[str, JoinRequest],
        tasks: Mapping[str, TaskDescriptor],
        assignments: Mapping[str, Assignment],
    ) -> list[Decision]:
        """Resume a group after controller failover from what ZooKeeper holds.

        A group that was Stable and still matches (same members, every task placed, no pending join)
        stays Stable with no rebalance; anything else rebalances (reason: controller failover).
        """
        self.members = dict(members)
        self.tasks = dict(tasks)
        if info is not None and info.protocol == RECONCILE:
            # member epochs run ahead of the state znode (it is not rewritten for every step)
            self.generation = max([info.generation, info.join_generation - 1, 0]
                                  + [a.generation for a in assignments.values()])
            self.join_generation = self.generation
            self.protocol, self.assignor, self.leader = info.protocol, info.assignor, None
            self._restore_held(info)
            if (info.state in (GroupState.RECONCILING.value, GroupState.STABLE.value) and self.members
                    and self._all_prefer_reconcile(self.members)):
                self.generation_members = tuple(sorted(self.members))
                return self._r_load(assignments)
            # (a member that cannot reconcile, or no members: a join round, as for the other protocols)
            self.assignment = {m: a.assigned for m, a in assignments.items() if m in self.members and a.error is None}
            self.generation_members = tuple(m for m in info.members if m in self.members)
            self.state = GroupState.STABLE
            if not self.members:
                self._transition(GroupState.PREPARING_REBALANCE)
                self._transition(GroupState.EMPTY)
                self.generation_members = ()
                return [WriteGroupState(self.info())]
            return self._prepare_rebalance("controller failover")
        if info is not None:
            self.generation = max(info.generation, info.join_generation - 1, 0)
            self.join_generation = self.generation
            self.protocol, self.assignor, self.leader = info.protocol, info.assignor, info.leader
            self.generation_members = tuple(m for m in info.members if m in self.members)
            self.assignment = {
                m: a.assigned for m, a in assignments.items()
                if a.generation == info.generation and a.error is None and m in self.generation_members
            }
            self._restore_held(info)
            now = self.clock.now()
            where = {t: m for m, ts in self.assignment.items() for t in ts}
            self.moving = {t: Move(t, None, where.get(t), now) for t in info.moving if t in self.tasks}
            # a request older than the member's assignment that asks for a later generation was answered
            # by a static rejoin: it does not list the tasks given back, so it must be rewritten to count
            self.static_returned = {
                m: r for m, r in self.members.items()
                if (a := assignments.get(m)) is not None and a.error is None and a.generation == info.generation
                and r.generation < a.generation < r.join_generation
            }
            consistent = (
                info.state == GroupState.STABLE.value
                and set(self.generation_members) == set(self.members)
                and all(r.join_generation <= info.generation and not r.leaving for r in self.members.values())
                and {t for ts in self.assignment.values() for t in ts} | self.held_tasks() == set(self.tasks)
                and not info.deferred  # moves waiting for a wave: the next generation computes them again
            )
            self.state = GroupState.STABLE
            self.state_since = self.wall.now()
            if consistent:
                self.reason = "controller failover: resumed"
                return [WriteGroupState(self.info())] + ([WatchMoves(tuple(sorted(self.moving)))] if self.moving else [])
        else:
            self.state = GroupState.EMPTY
            # no readable state: resume above every generation the members and assignments carry, or the
            # members would take the new generations for stale ones and ignore them
            self.generation = max([a.generation for a in assignments.values()]
                                  + [r.generation for r in members.values()] + [0])
            self.join_generation = self.generation
        if not self.members:
            if self.state is GroupState.STABLE:
                self._transition(GroupState.PREPARING_REBALANCE)
                self._transition(GroupState.EMPTY)
                self.generation_members, self.leader = (), None
            return [WriteGroupState(self.info())]
        return self._prepare_rebalance("controller failover")

    def on_members(self, snapshot: Mapping[str, JoinRequest]) -> list[Decision]:
        """The live members' join requests changed (joined, left, or rewrote their request)."""
        now = self.clock.now()
        held_before = self._held_info()
        if self.reconciling():
            return self._note_held(held_before, self._r_on_members(snapshot))
        old, new = self.members, dict(snapshot)
        self.members = new
        decisions: list[Decision] = []
        need = ""
        for m in sorted(old.keys() - new.keys()):
            self.shutting_down.discard(m)
            self.excluded.pop(m, None)
            self.static_returned.pop(m, None)
            was_member = m in self.generation_members
            tasks = self.assignment.pop(m, ())
            if was_member:
                self.generation_members = tuple(x for x in self.generation_members if x != m)
            for t in [t for t, mv in self.moving.items() if mv.dest == m]:
                del self.moving[t]  # that move ends with its destination; the task is held or placed again
            if was_member and tasks and self.state is GroupState.STABLE and self.maintenance:
                key = self.identity(m, old[m])
                kept = self.held[key].tasks if key in self.held else ()
                self.held[key] = Held(tuple(sorted(set(kept) | set(tasks))), FOREVER)
                log.info("group %s: %s left in maintenance mode; its %d tasks wait", self.group, m, len(tasks))
            elif (was_member and tasks and self.state is GroupState.STABLE
                    and self.config.scheduled_rebalance_delay_s > 0 and not old[m].leaving):
                self.held[self.identity(m, old[m])] = Held(tasks, now + self.config.scheduled_rebalance_delay_s)
                log.info("group %s: %s left; holding %d tasks for %.1fs", self.group, m, len(tasks),
                         self.config.scheduled_rebalance_delay_s)
            elif self.state is not GroupState.PREPARING_REBALANCE:
                need = need or f"member {m} left"
        if (not need and old.keys() - new.keys() and self.state is GroupState.STABLE and new
                and set(self.tasks) - {t for ts in self.assignment.values() for t in ts} - self.held_tasks()):
            # tasks revoked this generation wait for their revoker's rejoin; a departed revoker never sends it
            need = "unplaced tasks after a departure"
        for m in sorted(new.keys() - old.keys()):
            request = new[m]
            key = self.identity(m, request)
            if key in self.held and self.state is GroupState.STABLE and not request.leaving:
                decisions += self._static_rejoin(m, key)
            elif self.maintenance and self.state is GroupState.STABLE:
                self.postponed = self.postponed or f"member {m} joined"  # it gets tasks after maintenance
            elif self.state is not GroupState.PREPARING_REBALANCE:
                need = need or f"member {m} joined"
        for m in sorted(new.keys() & old.keys()):
            before, after = old[m], new[m]
            if before == after:
                continue
            leaving = self._newly_leaving(m, before, after)
            need = need or leaving
            excluded = self.excluded.get(m)
            if excluded and not excluded[0].retriable and excluded[1].protocols == after.protocols:
                continue  # the same incompatible request again: answered already, no rebalance storm
            if self.state in (GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.EMPTY):
                if after.join_generation > self.generation or m not in self.generation_members:
                    if self.maintenance and self.state is GroupState.STABLE and m not in self.generation_members:
                        self.postponed = self.postponed or f"member {m} joined"
                        continue
                    need = need or f"member {m} rejoined"
        if need:
            decisions += self._prepare_rebalance(need)
        elif self.state is GroupState.PREPARING_REBALANCE:
            decisions += self._maybe_complete_join(force=False)
        elif self.state is GroupState.STABLE and not self.members:
            decisions += self._to_empty("all members left")
        return self._note_held(held_before, decisions)

    def _newly_leaving(self, m: str, before: JoinRequest, after: JoinRequest) -> str:
        """A member whose request now says it is leaving starts its controlled shutdown (once): the reason
        for a rebalance, or "" when nothing changed."""
        if after.leaving and not before.leaving and m not in self.shutting_down:
            self.shutting_down.add(m)
            return f"controlled shutdown of {m}"
        return ""

    def on_tasks(self, tasks: Mapping[str, TaskDescriptor]) -> list[Decision]:
        """The group's runnable tasks changed (created, deleted, paused, resumed, reconfigured)."""
        tasks = dict(tasks)
        if tasks == self.tasks:
            return []
        self.tasks = tasks
        held_before = self._held_info()
        for key, h in list(self.held.items()):
            kept = tuple(t for t in h.tasks if t in tasks)
            if kept:
                h.tasks = kept
            else:
                del self.held[key]
        for t in list(self.reassign):
            if t not in tasks:
                del self.reassign[t]
        for t in [t for t in self.moving if t not in tasks]:
            del self.moving[t]
        if not self.members:
            return self._note_held(held_before, [])
        return self._note_held(held_before, self._prepare_rebalance("tasks changed"))

    def on_rebalance_request(self, reason: str = "manual", preferred: bool = False) -> list[Decision]:
        """An operator's rebalance; ``preferred``: towards the assignor's layout from scratch (Kafka's
        preferred leader election), in waves as the throttle allows."""
        if not self.members:
            return []
        if preferred:
            self.preferred = self._preferred_layout()
            moves = sum(1 for t, m in self.preferred.items() if t not in self.assignment.get(m, ()))
            reason = f"{reason}: preferred placement ({moves} tasks off it)"
            log.info("group %s: restoring the preferred placement: %d tasks to move", self.group, moves)
        return self._prepare_rebalance(reason)

    def on_controlled_shutdown(self, member_id: str) -> list[Decision]:
        """Move the member's tasks away before it leaves (it exits once it owns nothing)."""
        if member_id not in self.members or member_id in self.shutting_down:
            return []
        self.shutting_down.add(member_id)
        return self._prepare_rebalance(f"controlled shutdown of {member_id}")

    def on_reassign(self, task_id: str, to: str) -> list[Decision]:
        """Move one task to one member: a required placement until that member leaves."""
        if task_id not in self.tasks or to not in self.members:
            return []
        self.reassign[task_id] = to
        return self._prepare_rebalance(f"reassign {task_id} to {to}")

    def on_tick(self) -> list[Decision]:
        """Deadlines: join timeout, sync timeout, expired holds of the scheduled rebalance delay."""
        now = self.clock.now()
        decisions: list[Decision] = []
        held_before = self._held_info()
        expired = [k for k, h in self.held.items() if h.deadline <= now]
        for k in expired:
            log.info("group %s: %s did not return within the delay; its tasks move", self.group, k)
            del self.held[k]
        stale = [t for t, mv in self.moving.items() if now >= mv.since + self.config.move_timeout_s]
        for t in stale:
            log.warning("group %s: the move of %s to %s is not done after %.0fs; it stops counting against the "
                        "throttle", self.group, t, self.moving[t].dest, self.config.move_timeout_s)
            del self.moving[t]
        if self.next_check is not None and now >= self.next_check:
            self.next_check = now + self.preferred_check_s if self.preferred_check_s > 0 else None
            if self.state is GroupState.STABLE and self.members:
                before = self.imbalance
                self.imbalance = self.measure_imbalance()
                if (self.imbalance > self.max_imbalance and not self.maintenance and not self.moving
                        and not self.deferred):
                    decisions += self._prepare_rebalance(f"imbalance: {self.imbalance} tasks off the assignor's layout")
                elif self.imbalance != before:
                    decisions.append(WriteGroupState(self.info()))
        if self.retarget_due is not None and now >= self.retarget_due and self.reconciling():
            decisions += self._prepare_rebalance(self.retarget_reason or "target put off")
        if self.state is GroupState.PREPARING_REBALANCE and self.join_deadline is not None and now >= self.join_deadline:
            decisions += self._maybe_complete_join(force=True)
        elif self.state is GroupState.AWAITING_SYNC and self.sync_deadline is not None and now >= self.sync_deadline:
            decisions += self._prepare_rebalance(f"{ProtocolError.REBALANCE_TIMEOUT.name}: leader {self.leader} did not sync")
        elif expired and self.state in (GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.RECONCILING) \
                and self.members:
            # (AwaitingSync: the pending proposal leaves the expired tasks out; nothing would place them)
            decisions += self._prepare_rebalance("scheduled rebalance delay expired")
        elif stale and not decisions:
            decisions += self._next_wave()
        return self._note_held(held_before, decisions)

    def shutdown(self) -> None:
        """The group is gone (controller resigning): Dead, no more decisions."""
        self.state = GroupState.DEAD

    # ---- internals --------------------------------------------------------------------------------
    def _to_empty(self, reason: str) -> list[Decision]:
        if self.state is not GroupState.PREPARING_REBALANCE:
            self._transition(GroupState.PREPARING_REBALANCE)
        self.reason = reason
        self._transition(GroupState.EMPTY)
        self.generation = max(self.generation, self.join_generation)
        self.join_generation = self.generation
        self.generation_members, self.leader = (), None
        self.assignment.clear()
        self.target.clear()
        self.unreleased.clear()
        self.epochs.clear()
        self.join_deadline = self.sync_deadline = None
        # a reconcile target put off (or a group forming) is void with nobody left: a deadline kept from it
        # would come due forever in a group that no longer reconciles
        self.retarget_due, self.retarget_reason, self.forming_until = None, "", None
        self.join_result = None
        return [WriteGroupState(self.info())]

    def _prepare_rebalance(self, reason: str) -> list[Decision]:
        self.reason = reason
        if self.state is GroupState.DEAD:
            return []
        leaving_reconcile = False
        if self.reconciling():
            if self._all_prefer_reconcile(self.members):
                return self._r_retarget_soon(reason)
            # a member that cannot reconcile (a rolling downgrade): one join round, cooperative from here
            log.info("group %s: leaving the reconcile protocol (%s)", self.group, reason)
            self.target.clear()
            self.unreleased.clear()
            self.retarget_due, self.retarget_reason, self.forming_until = None, "", None
            leaving_reconcile = True
        if self.state is not GroupState.PREPARING_REBALANCE:
            if not self.members:
                return self._to_empty(reason) if self.state is not GroupState.EMPTY else []
            self._transition(GroupState.PREPARING_REBALANCE)
            self.join_generation = self.generation + 1
            self.join_deadline = self.clock.now() + self.config.rebalance_timeout_s
            self.sync_deadline = None
            self.join_result = None
            self.rebalances += 1
            decisions: list[Decision] = [WriteGroupState(self.info())]
            if leaving_reconcile:
                decisions.append(WriteAssignments(self._r_leave_notices()))
        else:
            decisions = []
        return decisions + self._maybe_complete_join(force=False)

    def _descriptors(self, eligible: Mapping[str, JoinRequest], skip: Collection[str] = ()) -> list[TaskDescriptor]:
        """The group's tasks as its assignor gets them (``skip``: tasks left out, e.g. held). A task being
        reassigned, or restored to its preferred member, is pinned to that member while it is ``eligible``
        (a preferred one also while it is not leaving); a pin that can no longer hold is dropped."""
        if not (skip or self.reassign or self.preferred):  # (most rounds: every task as it is)
            return [self.tasks[t_id] for t_id in sorted(self.tasks)]
        descriptors = []
        for t_id in sorted(self.tasks):
            if t_id in skip:
                continue
            d = self.tasks[t_id]
            to = self.reassign.get(t_id) or self.preferred.get(t_id)
            if to is not None and to in eligible and (t_id in self.reassign or not eligible[to].leaving):
                d = TaskDescriptor(task_id=d.task_id, weight=d.weight, pinned=(to,), pin_mode="required", rack=d.rack)
            elif to is not None:
                self.reassign.pop(t_id, None)
                self.preferred.pop(t_id, None)
            descriptors.append(d)
        return descriptors
