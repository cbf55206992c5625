"""The join round of the ``eager`` and ``cooperative`` protocols, sans-IO: what a change of members means for
the group (who left, who is back within the scheduled rebalance delay, whether a rebalance is needed),
completing the join phase (who is in the generation, its leader, protocol and assignor, the join result),
the leader's proposal validated and throttled (the sync phase), and error assignments for the members left
out. A part of :class:`~controller.protocol.group.coordinator.GroupCoordinator`: it keeps the round's own
state and returns results the coordinator takes (it reads the group through :class:`JoinCore`, never
writes it).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.errors import ProtocolError
from controller.protocol.group.reports import narrow_owned
from controller.protocol.group.rules import (
    RECONCILE,
    all_prefer_reconcile,
    choose_assignor,
    choose_protocol,
    identity,
    newly_leaving,
    rewritten,
    validate_proposal,
)
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import (
    Decision,
    GroupCore,
    MembersTaken,
    WriteAssignments,
)
from controller.protocol.records.group_messages import Assignment, JoinRequest, JoinResult, MemberMetadata, SyncProposal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnterReconcile:
    """A join round ended with every member for reconcile: the coordinator enters it at ``generation``."""

    generation: int
    reason: str


@dataclass(frozen=True)
class Admitted:
    """A join phase completed: the generation, its leader, protocol and assignor, the members admitted with
    their requests, and the members refused with why (answered in their assignments)."""

    generation: int
    leader: str
    protocol: str
    assignor: str
    joined: Mapping[str, JoinRequest]
    errors: Mapping[str, ProtocolError]


@dataclass(frozen=True)
class Waiting:
    """A join phase that admitted nobody: the round waits again (``reason``, shown with the group state), the
    members refused answered in ``answers``."""

    reason: str
    answers: tuple[tuple[str, Assignment], ...] = ()


@dataclass(frozen=True)
class Published:
    """The leader's proposal, validated and throttled: every generation member's assignment (what the
    coordinator takes as its placement and publishes), and why (shown with the group state)."""

    assignments: tuple[tuple[str, Assignment], ...]
    reason: str


class JoinCore(GroupCore, Protocol):
    """What the join round needs of its group beyond ``GroupCore``: the generation it completes and the members
    it waits for."""

    @property
    def join_generation(self) -> int: ...
    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def shutting_down(self) -> Collection[str]: ...


@dataclass(eq=False)
class JoinRound:
    """The join round of one group: its deadlines, its join result, and the members it answered."""

    core: JoinCore = field(repr=False)
    #: the join phase ends at this time with the members that rejoined (None: no join phase)
    deadline: float | None = None
    #: the leader's proposal is due by this time (None: no sync phase)
    sync_deadline: float | None = None
    result: JoinResult | None = None
    #: members refused by the last round, with the request they were refused for
    excluded: dict[str, tuple[ProtocolError, JoinRequest]] = field(default_factory=dict)
    #: join requests answered by a static rejoin: they predate the tasks given back, so they do not
    #: count as joining the next generation until the member rewrites them
    static_returned: dict[str, JoinRequest] = field(default_factory=dict)
    #: members answered INVALID_REPORT, with why: the same refusal is answered once (a member whose code
    #: writes the same bad request again is not answered in a loop); forgotten once its request is taken
    refusals: dict[str, str] = field(default_factory=dict)

    # ---- the round's life -------------------------------------------------------------------------
    def begin(self) -> None:
        """A round starts: the members have the rebalance timeout to rejoin."""
        self.deadline = self.core.clock.now() + self.core.config.rebalance_timeout_s
        self.sync_deadline = None
        self.result = None

    def close(self) -> None:
        """No round in progress (the group emptied)."""
        self.deadline = self.sync_deadline = None
        self.result = None

    def reset(self) -> None:
        """The group leaves join rounds behind (it entered reconcile): nothing of them is remembered."""
        self.close()
        self.excluded.clear()
        self.static_returned.clear()

    def resume(self, static_returned: Mapping[str, JoinRequest]) -> None:
        """After a failover: the requests answered by a static rejoin, which must be rewritten to count."""
        self.static_returned = dict(static_returned)

    def forget(self, member_id: str) -> None:
        """A member left: what the rounds knew of it goes too."""
        self.excluded.pop(member_id, None)
        self.static_returned.pop(member_id, None)
        self.refusals.pop(member_id, None)

    def refuse(self, member_id: str, reason: str, generation: int) -> list[Decision]:
        """A member's request is out of bounds: answer it INVALID_REPORT in its assignment, at the generation
        its last good request asked to join (the one it reads answers at), and it writes its request again
        (a rejoin). Its last good request stands meanwhile, so nothing it runs is handed on."""
        if self.refusals.get(member_id) == reason:
            return []
        self.refusals[member_id] = reason
        log.warning("group %s: refused the request of %s (%s): it rejoins", self.core.group, member_id, reason)
        return [WriteAssignments(self.error_assignments({member_id: ProtocolError.INVALID_REPORT}, generation))]

    def keep_refusals(self, ignored: Collection[str]) -> None:
        """The refusals of members whose request was taken since are forgotten: a new refusal is answered again."""
        for m in [m for m in self.refusals if m not in ignored]:
            del self.refusals[m]

    def answered(self, member_id: str, request: JoinRequest) -> bool:
        """The same incompatible request again: answered already, no rebalance storm."""
        excluded = self.excluded.get(member_id)
        return bool(excluded and not excluded[0].retriable and excluded[1].protocols == request.protocols)

    # ---- the join phase ---------------------------------------------------------------------------
    def complete(self, force: bool) -> None | Waiting | EnterReconcile | Admitted:
        """Complete the join phase once every live member rejoined (or on timeout, with those that did; the
        coordinator empties a group with no member first): the generation admitted (``Admitted``, taken by the
        coordinator, then ``sync``); every member for reconcile: the coordinator enters it (``EnterReconcile``);
        nobody admitted (``Waiting``); None: members still to rejoin."""
        core = self.core
        assert core.state is GroupState.PREPARING_REBALANCE and core.members
        target = core.join_generation
        joined = {
            m: r for m, r in core.members.items() if r.join_generation == target and r != self.static_returned.get(m)
        }
        if len(joined) < len(core.members) and not force:
            return None
        if not joined:
            self.deadline = core.clock.now() + core.config.rebalance_timeout_s
            return Waiting("no member rejoined in time; waiting again")
        errors: dict[str, ProtocolError] = {m: ProtocolError.REBALANCE_TIMEOUT for m in core.members if m not in joined}
        leader_hint = core.leader if core.leader in joined else min(joined)
        choice = choose_protocol({m: r.protocols for m, r in joined.items()}, leader_hint)
        if choice.protocol == RECONCILE:
            if all_prefer_reconcile(core.members, core.leader):
                # no sync phase: the coordinator places the tasks itself, every live member takes part
                return EnterReconcile(target, f"generation {target} joined by {len(joined)} members")
            # a member that did not join (yet) cannot reconcile: choose among the others
            choice = choose_protocol(
                {m: tuple(p for p in r.protocols if p != RECONCILE) for m, r in joined.items()}, leader_hint
            )
        for m in choice.incompatible:
            errors[m] = ProtocolError.INCONSISTENT_PROTOCOL
        members = [m for m in sorted(joined) if m not in errors]
        self.excluded = {m: (e, core.members[m]) for m, e in errors.items()}
        if not members or choice.protocol is None:
            self.deadline = core.clock.now() + core.config.rebalance_timeout_s
            return Waiting("no member could be admitted", self.error_assignments(errors, target))
        leader = leader_hint if leader_hint in members else members[0]
        assignor = choose_assignor({m: joined[m].assignors for m in members}, leader, core.config.default_assignor)
        return Admitted(target, leader, choice.protocol, assignor, {m: joined[m] for m in members}, errors)

    def sync(self, admitted: Admitted) -> JoinResult:
        """The coordinator took the admitted generation: the join result the leader assigns from, its
        proposal due within the rebalance timeout."""
        self.deadline = None
        self.sync_deadline = self.core.clock.now() + self.core.config.rebalance_timeout_s
        self.result = self.join_result(admitted.joined, admitted.leader, admitted.protocol, admitted.assignor)
        return self.result

    def join_result(self, joined: Mapping[str, JoinRequest], leader: str, protocol: str, assignor: str) -> JoinResult:
        """What the leader assigns from: the admitted members' metadata, the group's tasks, and each member's
        previous assignment (a static member back inside the delay takes its held tasks back as part of it)."""
        core = self.core
        members = list(joined)
        previous = {m: core.assignment[m] for m in members if m in core.assignment}
        for m in members:
            key = identity(m, joined[m])
            if key in core.holds.held:
                previous[m] = tuple(sorted(set(previous.get(m, ())) | set(core.holds.take(key))))
        descriptors = core.operations.descriptors(joined)
        # a member's join metadata narrows what it holds, never claims what the last generation gave another
        # member (that member's owner znodes say whether it still runs it): a ghost or a stale claim moves nothing
        owned = narrow_owned({m: joined[m].owned for m in members}, {m: core.assignment.get(m, ()) for m in members})
        return JoinResult(
            generation=core.generation,
            leader=leader,
            protocol=protocol,
            assignor=assignor,
            controller_epoch=core.controller_epoch,
            members=tuple(
                MemberMetadata(
                    member_id=m,
                    owned=tuple(sorted(owned[m])),
                    capacity=joined[m].capacity,
                    rack=joined[m].rack,
                    instance_id=joined[m].instance_id,
                    leaving=joined[m].leaving or m in core.shutting_down,
                )
                for m in members
            ),
            tasks=tuple(descriptors),
            held=tuple(sorted(core.holds.tasks() & set(core.tasks))),
            previous={m: tuple(sorted(ts)) for m, ts in previous.items()},
        )

    def error_assignments(
        self, errors: Mapping[str, ProtocolError], generation: int
    ) -> tuple[tuple[str, Assignment], ...]:
        core = self.core
        return tuple(
            (
                m,
                Assignment(
                    generation=generation,
                    controller_epoch=core.controller_epoch,
                    error=e.name,
                    protocol=core.protocol or "eager",
                    leader=core.leader,
                ),
            )
            for m, e in sorted(errors.items(), key=lambda kv: kv[0])
        )

    # ---- the sync phase ---------------------------------------------------------------------------
    def on_proposal(self, proposal: SyncProposal) -> None | str | Published:
        """The leader wrote its proposal: validated (a refusal: why, for a new round), then throttled into
        this generation's wave (``Published``); None: no round awaits it (ILLEGAL_GENERATION, ignored)."""
        core, result = self.core, self.result
        if core.state is not GroupState.AWAITING_SYNC or result is None or proposal.generation != core.generation:
            log.info(
                "group %s: ignoring proposal for generation %d (ILLEGAL_GENERATION; now %s gen %d)",
                core.group,
                proposal.generation,
                core.state.value,
                core.generation,
            )
            return None
        problems = validate_proposal(result, proposal)
        if problems:
            log.warning(
                "group %s: refusing proposal of %s for generation %d: %s",
                core.group,
                proposal.leader,
                proposal.generation,
                "; ".join(problems[:3]),
            )
            return f"{ProtocolError.INVALID_ASSIGNMENT.name}: {problems[0]}"
        ops = core.operations
        wave = ops.wave(
            {m: proposal.assigned.get(m, ()) for m in core.generation_members},
            {m: proposal.revoked.get(m, ()) for m in core.generation_members},
            had=lambda: {
                mm.member_id: set(mm.owned) | set(result.previous.get(mm.member_id, ())) for mm in result.members
            },
            leaving=lambda: [mm.member_id for mm in result.members if mm.leaving],
        )
        if wave.deferred:
            log.info(
                "group %s: generation %d moves %d tasks now; %d wait for a later wave%s",
                core.group,
                core.generation,
                len(wave.moving),
                len(wave.deferred),
                " (maintenance)" if ops.maintenance else "",
            )
        ops.settle_preferred(wave.assigned, core.generation_members)
        assignments = []
        # the leader starts the second round of a cooperative move: only if a revocation went out (a throttled
        # wave may hold back every one its proposal made, and a rejoin for nothing would start another)
        second_round = any(wave.revoked.values()) and core.protocol == "cooperative"
        handoff = self.handoffs(wave.revoked, result) if second_round and core.config.handoff else {}
        for m in core.generation_members:
            assigned = tuple(sorted(wave.assigned.get(m, ())))
            revoked = tuple(sorted(wave.revoked.get(m, ())))
            assignments.append(
                (
                    m,
                    Assignment(
                        generation=core.generation,
                        controller_epoch=core.controller_epoch,
                        assigned=assigned,
                        revoked=revoked,
                        protocol=core.protocol or "eager",
                        leader=core.leader,
                        follow_up=second_round and m == core.leader,
                        incoming=core.operations.incoming_for(m, assigned + handoff.get(m, ())),
                        handoff=handoff.get(m, ()),
                    ),
                )
            )
        self.sync_deadline = None
        self.result = None
        reason = "assignment published" + (
            f"; {len(ops.deferred)} moves wait ({'maintenance' if ops.maintenance else 'throttle'})"
            if ops.deferred
            else ""
        )
        return Published(tuple(assignments), reason)

    def handoffs(self, revoked: Mapping[str, Collection[str]], result: JoinResult) -> dict[str, tuple[str, ...]]:
        """The planned moves this generation revokes, each for the member a roll or a reassign pins it to: that
        member takes it as soon as its owner releases it (the owner znode is the lock), not a round later. Never
        to a leaving member nor to one that revokes it itself; the assignment of the generation lists every
        task for one member at most (a handed-off task for none: the next generation assigns it)."""
        pins = self.core.operations.reassign
        members = {mm.member_id: mm for mm in result.members}
        out: dict[str, list[str]] = {}
        for owner, ts in revoked.items():
            for t in ts:
                to = pins.get(t)
                if to is None or to == owner or t not in self.core.tasks or to not in members or members[to].leaving:
                    continue
                if to not in self.core.generation_members or to in self.core.shutting_down:
                    continue
                out.setdefault(to, []).append(t)
        return {m: tuple(sorted(ts)) for m, ts in out.items()}

    # ---- the members --------------------------------------------------------------------------------
    def take_members(self, old: Mapping[str, JoinRequest]) -> MembersTaken:
        """The live members changed (the coordinator's now; ``old``: before): who left (their tasks held or
        placed again), who came back within the delay, who rejoined or changed, and whether that needs a
        rebalance. What it means for the coordinator's record is returned, for the coordinator to take."""
        core, ops, holds = self.core, self.core.operations, self.core.holds
        new = core.members
        stable = core.state is GroupState.STABLE
        need = ""
        for m in sorted(old.keys() - new.keys()):
            self.forget(m)
            was_member = m in core.generation_members
            tasks = core.assignment.get(m, ())
            ops.drop_moves(dest=m)  # that move ends with its destination; the task is held or placed again
            key = identity(m, old[m])
            if not holds.on_leave(m, key, tasks if was_member and stable else (), old[m].leaving):
                if was_member and tasks:
                    holds.note_departed(key, tasks)
                if core.state is not GroupState.PREPARING_REBALANCE:
                    need = need or f"member {m} left"
        gone = old.keys() - new.keys()
        if not need and gone and stable and new:
            placed = {t for m, ts in core.assignment.items() if m not in gone for t in ts}
            if set(core.tasks) - placed - holds.tasks():
                # tasks revoked this generation wait for their revoker's rejoin; a departed revoker never sends it
                need = "unplaced tasks after a departure"
        returned: list[tuple[str, str]] = []
        for m in sorted(new.keys() - old.keys()):
            request = new[m]
            key = identity(m, request)
            if key in holds.held and key not in {k for _, k in returned} and stable and not request.leaving:
                returned.append((m, key))  # its held tasks again, nobody else disturbed
                self.static_returned[m] = request
            elif ops.maintenance and stable:
                ops.postpone(f"member {m} joined")  # it gets tasks after maintenance
            elif core.state is not GroupState.PREPARING_REBALANCE:
                need = need or f"member {m} joined"
        shutdowns: list[str] = []
        for m, before, after in rewritten(old, new):
            if newly_leaving(core.shutting_down, m, before, after):
                shutdowns.append(m)
                need = need or f"controlled shutdown of {m}"
            if self.answered(m, after):
                continue  # the same incompatible request again: answered already, no rebalance storm
            if core.state in (GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.EMPTY):
                if after.join_generation > core.generation or m not in core.generation_members:
                    if ops.maintenance and stable and m not in core.generation_members:
                        ops.postpone(f"member {m} joined")
                        continue
                    need = need or f"member {m} rejoined"
        return MembersTaken(tuple(sorted(gone)), tuple(shutdowns), need, tuple(returned))
