"""The join round of the ``eager`` and ``cooperative`` protocols, sans-IO: completing the join phase (who is
in the generation, its leader, protocol and assignor, the join result), the leader's proposal validated and
published (the sync phase), error assignments for the members left out, and a static member's return
inside the scheduled rebalance delay. A part of :class:`~controller.protocol.group.coordinator.GroupCoordinator`, which
owns one and gives it the few things it needs of the group (:class:`JoinCore`); the coordinator's
``prepare_rebalance`` starts a round, its ``on_tick`` ends one that timed out.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.errors import ProtocolError
from controller.protocol.group.reports import narrow_owned
from controller.protocol.group.rules import RECONCILE, choose_assignor, choose_protocol, validate_proposal
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import (
    Decision,
    DeleteGenerationsBelow,
    GroupCore,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
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


class JoinCore(GroupCore, Protocol):
    """What the join round needs of its group beyond ``GroupCore``: the generation it completes and the members
    it waits for."""

    @property
    def join_generation(self) -> int: ...
    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def shutting_down(self) -> Collection[str]: ...
    def all_prefer_reconcile(self, requests: Mapping[str, JoinRequest]) -> bool: ...


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

    def answered(self, member_id: str, request: JoinRequest) -> bool:
        """The same incompatible request again: answered already, no rebalance storm."""
        excluded = self.excluded.get(member_id)
        return bool(excluded and not excluded[0].retriable and excluded[1].protocols == request.protocols)

    # ---- the join phase ---------------------------------------------------------------------------
    def complete(self, force: bool) -> list[Decision] | EnterReconcile | Admitted:
        """Complete the join phase once every live member rejoined (or on timeout, with those that did): the
        generation admitted (``Admitted``, taken by the coordinator, then ``sync``); every member for reconcile:
        the coordinator enters it (``EnterReconcile``)."""
        core = self.core
        assert core.state is GroupState.PREPARING_REBALANCE
        if not core.members:
            return core.to_empty("all members left")
        target = core.join_generation
        joined = {
            m: r for m, r in core.members.items() if r.join_generation == target and r != self.static_returned.get(m)
        }
        if len(joined) < len(core.members) and not force:
            return []
        if not joined:
            self.deadline = core.clock.now() + core.config.rebalance_timeout_s
            core.reason = "no member rejoined in time; waiting again"
            return [WriteGroupState(core.info())]
        errors: dict[str, ProtocolError] = {m: ProtocolError.REBALANCE_TIMEOUT for m in core.members if m not in joined}
        leader_hint = core.leader if core.leader in joined else min(joined)
        choice = choose_protocol({m: r.protocols for m, r in joined.items()}, leader_hint)
        if choice.protocol == RECONCILE:
            if core.all_prefer_reconcile(core.members):
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
            core.reason = "no member could be admitted"
            return [WriteGroupState(core.info()), WriteAssignments(self.error_assignments(errors, target))]
        leader = leader_hint if leader_hint in members else members[0]
        assignor = choose_assignor({m: joined[m].assignors for m in members}, leader, core.config.default_assignor)
        return Admitted(target, leader, choice.protocol, assignor, {m: joined[m] for m in members}, errors)

    def sync(self, admitted: Admitted) -> list[Decision]:
        """The coordinator took the admitted generation: the leader's proposal is due now."""
        core = self.core
        self.deadline = None
        self.sync_deadline = core.clock.now() + core.config.rebalance_timeout_s
        self.result = result = self.join_result(admitted.joined, admitted.leader, admitted.protocol, admitted.assignor)
        core.transition(GroupState.AWAITING_SYNC)
        decisions: list[Decision] = [WriteJoinResult(result)]
        if admitted.errors:
            decisions.append(WriteAssignments(self.error_assignments(dict(admitted.errors), core.generation)))
        decisions += [WriteGroupState(core.info()), WatchSync(core.generation)]
        return decisions

    def join_result(self, joined: Mapping[str, JoinRequest], leader: str, protocol: str, assignor: str) -> JoinResult:
        """What the leader assigns from: the admitted members' metadata, the group's tasks, and each member's
        previous assignment (a static member back inside the delay takes its held tasks back as part of it)."""
        core = self.core
        members = list(joined)
        previous = {m: core.assignment[m] for m in members if m in core.assignment}
        for m in members:
            key = core.identity(m, joined[m])
            if key in core.holds.held:
                previous[m] = tuple(sorted(set(previous.get(m, ())) | set(core.holds.take(key))))
        descriptors = core.descriptors(joined)
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
    def on_proposal(self, proposal: SyncProposal) -> list[Decision]:
        """The leader wrote its proposal: validate, then publish per-member assignments (Stable)."""
        core, result = self.core, self.result
        if core.state is not GroupState.AWAITING_SYNC or result is None or proposal.generation != core.generation:
            log.info(
                "group %s: ignoring proposal for generation %d (ILLEGAL_GENERATION; now %s gen %d)",
                core.group,
                proposal.generation,
                core.state.value,
                core.generation,
            )
            return []
        problems = validate_proposal(result, proposal)
        if problems:
            log.warning(
                "group %s: refusing proposal of %s for generation %d: %s",
                core.group,
                proposal.leader,
                proposal.generation,
                "; ".join(problems[:3]),
            )
            return core.prepare_rebalance(f"{ProtocolError.INVALID_ASSIGNMENT.name}: {problems[0]}")
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
        for m in core.generation_members:
            assigned = tuple(sorted(wave.assigned.get(m, ())))
            revoked = tuple(sorted(wave.revoked.get(m, ())))
            core.assignment[m] = assigned
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
                        incoming=core.incoming_for(m, assigned),
                    ),
                )
            )
        self.sync_deadline = None
        self.result = None
        core.reason = "assignment published" + (
            f"; {len(ops.deferred)} moves wait ({'maintenance' if ops.maintenance else 'throttle'})"
            if ops.deferred
            else ""
        )
        core.transition(GroupState.STABLE)
        decisions: list[Decision] = [
            WriteAssignments(tuple(assignments)),
            WriteGroupState(core.info()),
            DeleteGenerationsBelow(core.generation),
        ]
        if ops.moving:
            decisions.append(WatchMoves(tuple(sorted(ops.moving))))
        return decisions

    # ---- a static member's return -----------------------------------------------------------------
    def static_rejoin(self, member_id: str, key: str) -> list[Decision]:
        """A static member came back within the delay: its held tasks again, nobody else disturbed."""
        core = self.core
        tasks = tuple(t for t in core.holds.take(key) if t in core.tasks)
        core.generation_members = tuple(sorted(set(core.generation_members) | {member_id}))
        core.assignment[member_id] = tasks
        self.static_returned[member_id] = core.members[member_id]
        core.reason = f"static member {key} returned"
        log.info(
            "group %s: %s returned as %s; %d tasks back without a rebalance", core.group, key, member_id, len(tasks)
        )
        a = Assignment(
            generation=core.generation,
            controller_epoch=core.controller_epoch,
            assigned=tasks,
            protocol=core.protocol or "eager",
            leader=core.leader,
        )
        return [WriteAssignments(((member_id, a),)), WriteGroupState(core.info())]
