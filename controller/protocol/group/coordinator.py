"""The group coordinator, sans-IO: one GroupCoordinator per group, fed events, returning decisions.

It never touches ZooKeeper. The controller's event thread feeds it snapshots (members' join requests,
the group's tasks), leader proposals, operator requests and clock ticks, and carries out the decisions
it returns (fenced writes). That is what lets the deterministic simulation drive it directly.

The coordinator keeps what every protocol shares (the generation, the members, the tasks, their placement)
and is the only writer of it: it hands each input to the part whose job it is, takes the result the part
returns, and writes the group state, so that no part's change lands half-way in another's state.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.protocol.clock import Clock, WallClock
from controller.protocol.errors import ProtocolError
from controller.protocol.group import failover_load as group_load
from controller.protocol.group.holds import Holds
from controller.protocol.group.join_round import Admitted, JoinRound, Waiting
from controller.protocol.group.operations import GroupOperations
from controller.protocol.group.reconcile import Reconciled, ReconcileGroup
from controller.protocol.group.rules import RECONCILE, choose_assignor
from controller.protocol.group.state import (
    GroupState,
    GroupStateMachine,
)
from controller.protocol.group.vocabulary import (
    Ask,
    Decision,
    DeleteGenerationsBelow,
    GroupConfig,
    MembersTaken,
    Rebalance,
    Step,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import (
    Assignment,
    GroupStateInfo,
    IgnoredMember,
    JoinRequest,
    JoinResult,
    SyncProposal,
    TaskDescriptor,
)

log = logging.getLogger(__name__)


@dataclass
class GroupCoordinator:
    group: str
    controller_epoch: int
    clock: Clock
    config: GroupConfig = field(default_factory=GroupConfig)
    #: for the holds' deadlines in ZooKeeper: a monotonic clock does not survive a failover, wall time does
    wall: Clock = field(default_factory=WallClock)

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
    shutting_down: set[str] = field(default_factory=set)
    rebalances: int = 0
    #: member znodes the IO layer set apart (no live broker of the same session, an unreadable request): why
    ignored: dict[str, str] = field(default_factory=dict)
    # ---- the parts it owns ----
    machine: GroupStateMachine = field(init=False)
    join: JoinRound = field(init=False)
    reconcile: ReconcileGroup = field(init=False)
    operations: GroupOperations = field(init=False)
    holds: Holds = field(init=False)

    def __post_init__(self) -> None:
        self.machine = GroupStateMachine(self.wall)
        self.join = JoinRound(self)
        self.reconcile = ReconcileGroup(self)
        self.operations = GroupOperations(self)
        self.holds = Holds(self)

    # ---- state ------------------------------------------------------------------------------------
    @property
    def state(self) -> GroupState:
        return self.machine.state

    def transition(self, target: GroupState) -> None:
        log.debug("group %s: %s -> %s (%s)", self.group, self.state.value, target.value, self.reason)
        self.machine.transition(target)
        if target in (GroupState.STABLE, GroupState.EMPTY, GroupState.DEAD):
            self.holds.departed.clear()  # the round is over: what they had is placed (or deferred) by now

    def info(self) -> GroupStateInfo:
        ops = self.operations
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
            held=self.holds.info(),
            moving=tuple(sorted(ops.moving)),
            deferred=len(ops.deferred),
            imbalance=ops.imbalance,
            maintenance=ops.maintenance,
            ignored=self.ignored_info(),
            unacked=self.reconcile.acks.unacked() if self.reconcile.active() else (),
            starting=self.reconcile.acks.starting() if self.reconcile.active() else (),
        )

    def ignored_info(self) -> tuple[IgnoredMember, ...]:
        """Every member znode given no work, and why: set apart by the IO layer, or a report refused."""
        why = dict(self.ignored)
        why.update({m: f"refused: {reason}" for m, (reason, _) in self.reconcile.refused.items()})
        why.update(self.reconcile.acks.probation.describe(self.clock.now()))
        return tuple(IgnoredMember(m, r[:300]) for m, r in sorted(why.items())[:100])

    def set_ignored(self, ignored: Mapping[str, str]) -> list[Decision]:
        """The IO layer's member znodes set apart changed: shown with the group state (status, watch)."""
        self.join.keep_refusals(ignored)
        if dict(ignored) == self.ignored:
            return []
        self.ignored = dict(ignored)
        if self.state is GroupState.DEAD:
            return []
        return [WriteGroupState(self.info())]

    def refuse_report(self, member: str, reason: str, last_good: JoinRequest) -> list[Decision]:
        """A member's request was refused by the IO layer (garbage, out of bounds, an acknowledgement ZooKeeper
        contradicts), which keeps ``last_good``, its last good one: the member is answered INVALID_REPORT in its
        assignment and writes its request again; meanwhile it is shown as ignored."""
        if member not in self.members or self.state is GroupState.DEAD:
            return []
        if self.reconcile.active():
            return self.take(self.reconcile.refuse(member, reason, last_good.incarnation))
        return self.join.refuse(member, reason, last_good.join_generation)

    def kept_from_work(self) -> set[str]:
        """The members in a back-off now (``probation``): given no work."""
        p = self.reconcile.acks.probation
        now = self.clock.now()
        return {m for m in p.until if p.kept(m, now)}

    def contradicted(self, member: str, why: str) -> list[Decision]:
        """ZooKeeper contradicted the member's acknowledgement (it does not hold what it says it took): counted;
        once that starts a back-off (``probation``) the group is re-targeted without it at once, and the group
        state shows it."""
        if member not in self.members or not self.reconcile.active():
            return []
        if not self.reconcile.acks.probation.contradicted(member, self.clock.now(), why):
            return []
        reason = f"{member} kept from new work: {self.reconcile.acks.probation.why[member]}"
        log.warning("group %s: %s", self.group, reason)
        return self.take(self.reconcile.retarget(reason))

    def on_load_reports(self, reports: Mapping[str, Mapping[str, float]]) -> None:
        """The brokers' load reports changed (bounded task figures per broker): the next load check reads them."""
        self.operations.load.on_reports(reports)

    def next_deadline(self) -> float | None:
        candidates = [
            d
            for d in (
                self.join.deadline,
                self.join.sync_deadline,
                self.operations.deadline(),
                self.reconcile.retarget_due,
                self.reconcile.ack_due() if self.reconcile.active() else None,
                self.reconcile.acks.probation.deadline(),
                self.holds.deadline(),
            )
            if d is not None
        ]
        return min(candidates) if candidates else None

    # ---- the protocol families --------------------------------------------------------------------
    def complete_join(self, force: bool) -> list[Decision]:
        """The join phase completed when it can (``force``: on timeout): the generation admitted taken, then
        synced; every member for reconcile: the group enters it at the round's generation, nothing of join rounds
        kept, every present member taking part."""
        if not self.members:
            return self.to_empty("all members left")
        outcome = self.join.complete(force)
        if outcome is None:
            return []
        if isinstance(outcome, Waiting):
            self.reason = outcome.reason
            decisions: list[Decision] = [WriteGroupState(self.info())]
            return decisions + [WriteAssignments(outcome.answers)] if outcome.answers else decisions
        if isinstance(outcome, Admitted):
            self.generation, self.leader, self.protocol = outcome.generation, outcome.leader, outcome.protocol
            self.assignor, self.generation_members = outcome.assignor, tuple(outcome.joined)
            self.assignment = {m: ts for m, ts in self.assignment.items() if m in outcome.joined}
            self.reason = f"generation {self.generation} joined by {len(outcome.joined)} members"
            result = self.join.sync(outcome)
            self.transition(GroupState.AWAITING_SYNC)
            decisions = [WriteJoinResult(result)]
            if outcome.errors:
                decisions.append(WriteAssignments(self.join.error_assignments(outcome.errors, self.generation)))
            return decisions + [WriteGroupState(self.info()), WatchSync(self.generation)]
        self.join.reset()
        self.generation, self.protocol, self.leader = outcome.generation, RECONCILE, None
        self.assignor = choose_assignor(
            {m: r.assignors for m, r in self.members.items()}, min(self.members), self.config.default_assignor
        )
        self.assignment = {m: ts for m, ts in self.assignment.items() if m in self.members}
        self.generation_members = tuple(sorted(self.members))
        return self.take(self.reconcile.enter(outcome.reason))

    def ask(self, asked: Ask) -> list[Decision]:
        """What a part asked for, done: a new placement, a reconcile step (the group state written), or the
        group state written (nothing for a Dead group)."""
        if isinstance(asked, Rebalance):
            return self.prepare_rebalance(asked.reason)
        if isinstance(asked, Step):
            self.reason = asked.reason
            return self.take(self.reconcile.step(write_state=True))
        if asked is None or self.state is GroupState.DEAD:
            return []
        self.reason = self.reason if asked.reason is None else asked.reason
        return [WriteGroupState(self.info())]

    @property
    def join_result(self) -> JoinResult | None:
        """The join result of the round awaiting the leader's proposal (None: no such round)."""
        return self.join.result

    def on_proposal(self, proposal: SyncProposal) -> list[Decision]:
        """The leader wrote its proposal: validated, then the per-member assignments published (Stable); a
        proposal refused starts a new round."""
        outcome = self.join.on_proposal(proposal)
        if outcome is None:
            return []
        if isinstance(outcome, str):
            return self.prepare_rebalance(outcome)
        self.assignment.update({m: a.assigned for m, a in outcome.assignments})
        self.reason = outcome.reason
        self.transition(GroupState.STABLE)
        decisions: list[Decision] = [
            WriteAssignments(outcome.assignments),
            WriteGroupState(self.info()),
            DeleteGenerationsBelow(self.generation),
        ]
        if self.operations.moving:
            decisions.append(WatchMoves(tuple(sorted(self.operations.moving))))
        return decisions

    # ---- operations: maintenance mode (the settings, the throttle's moves: ``operations`` itself) ------------
    def on_maintenance(self, on: bool) -> list[Decision]:
        """Maintenance mode on or off (nothing moves while on; what waited goes when it ends). Turned on during a
        join round, the tasks of the members that left in it wait for them too (``hold_departed``), as if they
        had left a moment later: a broker lost as maintenance begins gets its tasks back when it returns, rather
        than its tasks deferred to the window's end with its rejoin."""
        held_before = self.holds.info()
        rerun = on and not self.operations.maintenance and not self.reconcile.active() and self.holds.hold_departed()
        decisions = self.ask(self.operations.on_maintenance(on))
        if rerun:
            decisions += self.prepare_rebalance("maintenance mode: the tasks of members lost in this rebalance wait")
        return self.holds.note(held_before, decisions)

    def on_settings(self, limits: MoveLimits, preferred_check_s: float, max_imbalance: int) -> list[Decision]:
        """The operators' settings changed: a wider throttle may let the next wave go now."""
        return self.ask(self.operations.on_settings(limits, preferred_check_s, max_imbalance, self.reconcile.active()))

    def on_move_done(self, task_id: str, broker: str) -> list[Decision]:
        """A moved task runs on its new owner (or ended there): its slot in the throttle is free."""
        return self.ask(self.operations.on_move_done(task_id, broker, self.reconcile.active()))

    # ---- inputs -----------------------------------------------------------------------------------
    def load(
        self,
        info: GroupStateInfo | None,
        members: Mapping[str, JoinRequest],
        tasks: Mapping[str, TaskDescriptor],
        assignments: Mapping[str, Assignment],
    ) -> list[Decision]:
        """Resume a group after controller failover from what ZooKeeper holds (read by ``failover_load.py``): a
        Stable group that still matches stays Stable with no rebalance; anything else rebalances."""
        self.members, self.tasks = dict(members), dict(tasks)
        if info is None:
            self.machine.restore(GroupState.EMPTY)
            self.generation = self.join_generation = group_load.fresh_generation(members, assignments)
        else:
            by_protocol = self._load_reconcile if info.protocol == RECONCILE else self._load_join_round
            resumed = by_protocol(info, assignments)
            if resumed is not None:
                return resumed
        if not self.members:
            if self.state is GroupState.STABLE:
                self.transition(GroupState.PREPARING_REBALANCE)
                self.transition(GroupState.EMPTY)
                self.generation_members, self.leader = (), None
            return [WriteGroupState(self.info())]
        return self.prepare_rebalance("controller failover")

    def _load_reconcile(self, info: GroupStateInfo, assignments: Mapping[str, Assignment]) -> list[Decision] | None:
        """A group that ran reconcile goes on reconciling, or (a member that cannot reconcile, or no members:
        None, Stable restored) goes through a join round as for the other protocols."""
        resumed = group_load.reconcile_record(info, assignments)
        self.generation = self.join_generation = resumed.generation
        self.protocol, self.assignor, self.leader = resumed.protocol, resumed.assignor, resumed.leader
        self.holds.restore(info)
        self.holds.hold_lost(info, assignments, None)
        if (
            info.state in (GroupState.RECONCILING.value, GroupState.STABLE.value)
            and self.members
            and self.reconcile.all_prefer(self.members)
        ):
            self.generation_members = tuple(sorted(self.members))
            self.machine.restore(GroupState.RECONCILING)
            screened, loaded = self.reconcile.load(assignments)
            answers = self.take(loaded)
            self.members = screened
            return answers + self.take(self.reconcile.retarget("controller failover"))
        self.assignment = group_load.published(assignments, self.members)
        self.generation_members = tuple(m for m in info.members if m in self.members)
        self.machine.restore(GroupState.STABLE)
        return None

    def _load_join_round(self, info: GroupStateInfo, assignments: Mapping[str, Assignment]) -> list[Decision] | None:
        """A group of the join-round protocols: the decisions of a Stable group that still matches what
        ZooKeeper holds (it goes on with no rebalance), else None (Stable restored, to rebalance from)."""
        resumed = group_load.join_round_record(info, self.members, assignments)
        self.generation = self.join_generation = resumed.generation
        self.protocol, self.assignor, self.leader = resumed.protocol, resumed.assignor, resumed.leader
        self.generation_members, self.assignment = resumed.generation_members, resumed.assignment
        self.holds.restore(info)
        self.holds.hold_lost(info, assignments, info.generation)
        self.operations.resume_moves(info.moving, {t: m for m, ts in self.assignment.items() for t in ts})
        self.join.resume(group_load.static_returned(info, self.members, assignments))
        placed = {t for ts in self.assignment.values() for t in ts} | self.holds.tasks()
        consistent = group_load.still_matches(info, self.members, self.tasks, self.generation_members, placed)
        self.machine.restore(GroupState.STABLE, resumed=True)
        if not consistent:
            return None
        self.reason = "controller failover: resumed"
        decisions: list[Decision] = [WriteGroupState(self.info())]
        if self.operations.moving:
            decisions.append(WatchMoves(tuple(sorted(self.operations.moving))))
        return decisions

    def on_members(self, snapshot: Mapping[str, JoinRequest]) -> list[Decision]:
        """The live members' join requests changed (joined, left, or rewrote their request)."""
        held_before = self.holds.info()
        if self.reconcile.active():
            screened, refusals = self.reconcile.screen(snapshot)
            answers = self.take(refusals)
            restarted = self.reconcile.restarted(self.members, screened)
            if restarted is not None:  # it left, then joined
                gone = {m: r for m, r in screened.items() if m != restarted}
                return self.holds.note(held_before, answers + self.on_members(gone) + self.on_members(screened))
            old, self.members = self.members, screened
            taken = self.take_members(self.reconcile.take_members(old))
            self.generation_members = tuple(sorted(self.members))
            if not self.members:
                answers += self.to_empty("all members left")
            elif taken.need:  # re-targets (or leaves reconcile for a cooperative round)
                answers += self.prepare_rebalance(taken.need)
            else:  # (the state lists the members)
                answers += self.take(self.reconcile.step(write_state=taken.quiet))
            return self.holds.note(held_before, answers)
        old, self.members = self.members, dict(snapshot)
        taken = self.take_members(self.join.take_members(old))
        decisions: list[Decision] = []
        for m, key in taken.returned:
            decisions += self.static_return(m, key)
        if taken.need:
            decisions += self.prepare_rebalance(taken.need)
        elif self.state is GroupState.PREPARING_REBALANCE:
            decisions += self.complete_join(force=False)
        elif self.state is GroupState.STABLE and not self.members:
            decisions += self.to_empty("all members left")
        return self.holds.note(held_before, decisions)

    def take_members(self, taken: MembersTaken) -> MembersTaken:
        """A family's reading of a change of members taken: who left is out of the generation and the
        placement, who began a controlled shutdown is noted."""
        self.generation_members = tuple(m for m in self.generation_members if m not in taken.left)
        for m in taken.left:
            self.shutting_down.discard(m)
            self.assignment.pop(m, None)
        self.shutting_down.update(taken.shutdowns)
        return taken

    def take(self, r: Reconciled) -> list[Decision]:
        """A reconcile step taken: its member epoch, placement, reason, states; then the group state shown and
        its new moves watched, as the step asked."""
        if r.generation is not None:
            self.generation = self.join_generation = r.generation
        self.assignment = dict(r.assignment)
        if r.generation_members is not None:
            self.generation_members = r.generation_members
        self.reason = r.reason
        self.rebalances += r.rebalances
        for state in r.states:
            self.transition(state)
        decisions = list(r.decisions)
        if r.show_state:
            decisions.append(WriteGroupState(self.info()))
        if r.watch:
            decisions.append(WatchMoves(r.watch))
        return decisions

    def static_return(self, member_id: str, key: str) -> list[Decision]:
        """A static member came back within the delay: its held tasks again, nobody else disturbed."""
        tasks = tuple(t for t in self.holds.take(key) if t in self.tasks)
        self.generation_members = tuple(sorted(set(self.generation_members) | {member_id}))
        self.assignment[member_id] = tasks
        self.reason = f"static member {key} returned"
        log.info(
            "group %s: %s returned as %s; %d tasks back without a rebalance", self.group, key, member_id, len(tasks)
        )
        a = Assignment(
            self.generation,
            self.controller_epoch,
            assigned=tasks,
            protocol=self.protocol or "eager",
            leader=self.leader,
        )
        return [WriteAssignments(((member_id, a),)), WriteGroupState(self.info())]

    def on_tasks(self, tasks: Mapping[str, TaskDescriptor]) -> list[Decision]:
        """The group's runnable tasks changed (created, deleted, paused, resumed, reconfigured)."""
        tasks = dict(tasks)
        if tasks == self.tasks:
            return []
        self.tasks = tasks
        held_before = self.holds.info()
        self.holds.keep_only(tasks)
        self.operations.forget_tasks(tasks)
        if not self.members:
            return self.holds.note(held_before, [])
        return self.holds.note(held_before, self.prepare_rebalance("tasks changed"))

    def on_rebalance_request(self, reason: str = "manual", preferred: bool = False) -> list[Decision]:
        """An operator's rebalance; ``preferred``: towards the assignor's layout from scratch (Kafka's
        preferred leader election), in waves as the throttle allows."""
        if not self.members:
            return []
        if preferred:
            moves = self.operations.restore_preferred()
            reason = f"{reason}: preferred placement ({moves} tasks off it)"
            log.info("group %s: restoring the preferred placement: %d tasks to move", self.group, moves)
        return self.prepare_rebalance(reason)

    def on_controlled_shutdown(self, member_id: str) -> list[Decision]:
        """Move the member's tasks away before it leaves (it exits once it owns nothing)."""
        if member_id not in self.members or member_id in self.shutting_down:
            return []
        self.shutting_down.add(member_id)
        return self.prepare_rebalance(f"controlled shutdown of {member_id}")

    def on_reassign(self, task_id: str, to: str) -> list[Decision]:
        """Move one task to one member: a required placement until that member leaves."""
        if task_id not in self.tasks or to not in self.members:
            return []
        self.operations.pin(task_id, to)
        return self.prepare_rebalance(f"reassign {task_id} to {to}")

    def on_roll_placement(self, placement: Mapping[str, str], reason: str) -> list[Decision]:
        """A planned roll's step: every task it names pinned to that member (``reassign``), so the round
        moves exactly what the plan moves; a rebalance only when something is not where the plan puts it."""
        return self.prepare_rebalance(reason) if self.operations.pin_roll(placement) else []

    def on_roll_incoming(self, incoming: Mapping[str, Sequence[str]]) -> list[Decision]:
        """A planned roll's next moves, announced to the members that receive them before any of them moves:
        under reconcile each member whose announcement changes is published its assignment again with it (its
        tasks unchanged); a join round's members learn it with their next assignment."""
        self.operations.announce(incoming)
        if not self.reconcile.active():
            return []
        return self.take(self.reconcile.step(write_state=False))

    def end_roll(self) -> list[Decision]:
        """The roll is over (or paused): no pins left, nothing announced (under reconcile the members told of
        moves are published their assignment again without them, so they discard what they prepared); the
        assignor places as it always does."""
        if self.operations.end_roll() and self.reconcile.active():
            return self.take(self.reconcile.step(write_state=False))
        return []

    def on_tick(self) -> list[Decision]:
        """Deadlines: join timeout, sync timeout, expired holds of the scheduled rebalance delay."""
        now = self.clock.now()
        decisions: list[Decision] = []
        held_before = self.holds.info()
        expired = self.holds.expire(now)
        stale = self.operations.expire_moves(now)
        decisions += self.ask(self.operations.check_load(now)) or self.ask(self.operations.check_imbalance(now))
        due = self.reconcile.retarget_due
        if due is not None and now >= due and self.reconcile.active():
            decisions += self.prepare_rebalance(self.reconcile.retarget_reason or "target put off")
        ack_due = self.reconcile.ack_due() if self.reconcile.active() else None
        if ack_due is not None and now >= ack_due:
            decisions += self.take(self.reconcile.fence_overdue(now))
        join = self.join
        if self.state is GroupState.PREPARING_REBALANCE and join.deadline is not None and now >= join.deadline:
            decisions += self.complete_join(force=True)
        elif self.state is GroupState.AWAITING_SYNC and join.sync_deadline is not None and now >= join.sync_deadline:
            decisions += self.prepare_rebalance(
                f"{ProtocolError.REBALANCE_TIMEOUT.name}: leader {self.leader} did not sync"
            )
        elif (
            expired
            and self.state in (GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.RECONCILING)
            and self.members
        ):
            # (AwaitingSync: the pending proposal leaves the expired tasks out; nothing would place them)
            decisions += self.prepare_rebalance("scheduled rebalance delay expired")
        elif stale and not decisions:
            decisions += self.ask(self.operations.next_wave(self.reconcile.active()))
        back = self.reconcile.acks.probation.expire(now)
        if back and self.reconcile.active() and self.members:  # they may be given work again
            decisions += self.prepare_rebalance(f"{', '.join(back[:5])} back from a back-off")
        return self.holds.note(held_before, decisions)

    # ---- internals --------------------------------------------------------------------------------
    def to_empty(self, reason: str) -> list[Decision]:
        """Every member left: Empty, with nothing of any protocol's round kept."""
        if self.state is not GroupState.PREPARING_REBALANCE:
            self.transition(GroupState.PREPARING_REBALANCE)
        self.reason = reason
        self.transition(GroupState.EMPTY)
        self.generation = max(self.generation, self.join_generation)
        self.join_generation = self.generation
        self.generation_members, self.leader = (), None
        self.assignment.clear()
        self.reconcile.reset()
        self.join.close()
        return [WriteGroupState(self.info())]

    def prepare_rebalance(self, reason: str) -> list[Decision]:
        """Something changed that needs a new placement: a join round starts (or goes on), or under reconcile
        a new target is computed, now or at the end of the retarget interval."""
        self.reason = reason
        if self.state is GroupState.DEAD:
            return []
        leaving_reconcile = False
        if self.reconcile.active():
            if self.reconcile.all_prefer(self.members):
                return self.take(self.reconcile.retarget_soon(reason))
            # a member that cannot reconcile (a rolling downgrade): one join round, cooperative from here
            log.info("group %s: leaving the reconcile protocol (%s)", self.group, reason)
            self.reconcile.abandon()
            leaving_reconcile = True
        if self.state is not GroupState.PREPARING_REBALANCE:
            if not self.members:
                return self.to_empty(reason) if self.state is not GroupState.EMPTY else []
            self.transition(GroupState.PREPARING_REBALANCE)
            self.join_generation = self.generation + 1
            self.join.begin()
            self.rebalances += 1
            decisions: list[Decision] = [WriteGroupState(self.info())]
            if leaving_reconcile:
                decisions.append(WriteAssignments(self.reconcile.leave_notices()))
        else:
            decisions = []
        return decisions + self.complete_join(force=False)
