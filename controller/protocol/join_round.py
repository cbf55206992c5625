"""The join round of the ``eager`` and ``cooperative`` protocols, sans-IO: completing the join phase (who is
in the generation, its leader, protocol and assignor, the join result), the leader's proposal validated and
published (the sync phase), error assignments for the members left out, and a static member's return
inside the scheduled rebalance delay. A mixin of :class:`~controller.protocol.group.GroupCoordinator`, whose fields
it uses; ``_prepare_rebalance`` there starts a round, ``on_tick`` ends one that timed out.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

from controller.protocol.codecs import Assignment, JoinResult, MemberMetadata, SyncProposal
from controller.protocol.errors import ProtocolError
from controller.protocol.group_types import (
    Decision,
    DeleteGenerationsBelow,
    GroupState,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.rules import RECONCILE, choose_assignor, choose_protocol, validate_proposal
from controller.protocol.throttle import Wave, plan_wave

if TYPE_CHECKING:  # the mixin's host
    from controller.protocol.group import GroupCoordinator

log = logging.getLogger(__name__)


class JoinRoundMixin:
    """The join-round half of :class:`~controller.protocol.group.GroupCoordinator` (its fields live there)."""

    def _maybe_complete_join(self: "GroupCoordinator", force: bool) -> list[Decision]:
        """Complete the join phase once every live member rejoined (or on timeout, with those that did)."""
        assert self.state is GroupState.PREPARING_REBALANCE
        if not self.members:
            return self._to_empty("all members left")
        target = self.join_generation
        joined = {m: r for m, r in self.members.items()
                  if r.join_generation == target and r != self.static_returned.get(m)}
        if len(joined) < len(self.members) and not force:
            return []
        if not joined:
            self.join_deadline = self.clock.now() + self.config.rebalance_timeout_s
            self.reason = "no member rejoined in time; waiting again"
            return [WriteGroupState(self.info())]
        decisions: list[Decision] = []
        errors: dict[str, ProtocolError] = {m: ProtocolError.REBALANCE_TIMEOUT for m in self.members if m not in joined}
        leader_hint = self.leader if self.leader in joined else min(joined)
        choice = choose_protocol({m: r.protocols for m, r in joined.items()}, leader_hint)
        if choice.protocol == RECONCILE:
            if self._all_prefer_reconcile(self.members):
                # no sync phase: the coordinator places the tasks itself, every live member takes part
                self.generation = target
                return decisions + self._r_enter(f"generation {target} joined by {len(joined)} members")
            # a member that did not join (yet) cannot reconcile: choose among the others
            choice = choose_protocol({m: tuple(p for p in r.protocols if p != RECONCILE) for m, r in joined.items()},
                                     leader_hint)
        for m in choice.incompatible:
            errors[m] = ProtocolError.INCONSISTENT_PROTOCOL
        members = [m for m in sorted(joined) if m not in errors]
        self.excluded = {m: (e, self.members[m]) for m, e in errors.items()}
        if not members or choice.protocol is None:
            self.join_deadline = self.clock.now() + self.config.rebalance_timeout_s
            self.reason = "no member could be admitted"
            return [WriteGroupState(self.info()), WriteAssignments(self._error_assignments(errors, target))]
        self.generation = target
        self.leader = leader_hint if leader_hint in members else members[0]
        self.protocol = choice.protocol
        self.assignor = choose_assignor({m: joined[m].assignors for m in members}, self.leader,
                                        self.config.default_assignor)
        self.generation_members = tuple(members)
        self.join_deadline = None
        self.sync_deadline = self.clock.now() + self.config.rebalance_timeout_s
        # static members back inside the delay take their held tasks back (as their previous assignment)
        previous = {m: self.assignment[m] for m in members if m in self.assignment}
        for m in members:
            key = self.identity(m, joined[m])
            if key in self.held:
                previous[m] = tuple(sorted(set(previous.get(m, ())) | set(self.held.pop(key).tasks)))
        descriptors = self._descriptors({m: joined[m] for m in members})
        self.join_result = JoinResult(
            generation=self.generation,
            leader=self.leader,
            protocol=self.protocol,
            assignor=self.assignor,
            controller_epoch=self.controller_epoch,
            members=tuple(
                MemberMetadata(member_id=m, owned=tuple(sorted(joined[m].owned)), capacity=joined[m].capacity,
                               rack=joined[m].rack, instance_id=joined[m].instance_id,
                               leaving=joined[m].leaving or m in self.shutting_down)
                for m in members
            ),
            tasks=tuple(descriptors),
            held=tuple(sorted(self.held_tasks() & set(self.tasks))),
            previous={m: tuple(sorted(ts)) for m, ts in previous.items()},
        )
        self.assignment = {m: ts for m, ts in self.assignment.items() if m in members}
        self.reason = f"generation {self.generation} joined by {len(members)} members"
        self._transition(GroupState.AWAITING_SYNC)
        decisions.append(WriteJoinResult(self.join_result))
        if errors:
            decisions.append(WriteAssignments(self._error_assignments(errors, self.generation)))
        decisions += [WriteGroupState(self.info()), WatchSync(self.generation)]
        return decisions

    def _error_assignments(self: "GroupCoordinator", errors: Mapping[str, ProtocolError],
                           generation: int) -> tuple[tuple[str, Assignment], ...]:
        return tuple(
            (m, Assignment(generation=generation, controller_epoch=self.controller_epoch, error=e.name,
                           protocol=self.protocol or "eager", leader=self.leader))
            for m, e in sorted(errors.items(), key=lambda kv: kv[0])
        )

    def on_proposal(self: "GroupCoordinator", proposal: SyncProposal) -> list[Decision]:
        """The leader wrote its proposal: validate, then publish per-member assignments (Stable)."""
        if (self.state is not GroupState.AWAITING_SYNC or self.join_result is None
                or proposal.generation != self.generation):
            log.info("group %s: ignoring proposal for generation %d (ILLEGAL_GENERATION; now %s gen %d)",
                     self.group, proposal.generation, self.state.value, self.generation)
            return []
        problems = validate_proposal(self.join_result, proposal)
        if problems:
            log.warning("group %s: refusing proposal of %s for generation %d: %s", self.group,
                        proposal.leader, proposal.generation, "; ".join(problems[:3]))
            return self._prepare_rebalance(f"{ProtocolError.INVALID_ASSIGNMENT.name}: {problems[0]}")
        proposed = {m: proposal.assigned.get(m, ()) for m in self.generation_members}
        revocations = {m: proposal.revoked.get(m, ()) for m in self.generation_members}
        if self.throttled():
            had = {mm.member_id: set(mm.owned) | set(self.join_result.previous.get(mm.member_id, ()))
                   for mm in self.join_result.members}
            wave = plan_wave(proposed, revocations, had, self.tasks, self.moving, self.limits, self.clock.now(),
                             frozen=self.maintenance, room=self.cluster_room,
                             leaving=[mm.member_id for mm in self.join_result.members if mm.leaving])
        else:  # no limit in force: nothing to count, no status to watch
            wave = Wave(proposed, {m: ts for m, ts in revocations.items() if ts}, {}, ())
        if wave.deferred:
            log.info("group %s: generation %d moves %d tasks now; %d wait for a later wave%s", self.group,
                     self.generation, len(wave.moving), len(wave.deferred),
                     " (maintenance)" if self.maintenance else "")
        self.moving, self.deferred = wave.moving, wave.deferred
        for t, to in list(self.preferred.items()):
            if t in wave.assigned.get(to, ()) or t not in self.tasks or to not in self.generation_members:
                del self.preferred[t]  # there (or no longer possible): the pin has done its work
        assignments = []
        # the leader starts the second round of a cooperative move: only if a revocation went out (a throttled
        # wave may hold back every one its proposal made, and a rejoin for nothing would start another)
        second_round = any(wave.revoked.values()) and self.protocol == "cooperative"
        for m in self.generation_members:
            assigned = tuple(sorted(wave.assigned.get(m, ())))
            revoked = tuple(sorted(wave.revoked.get(m, ())))
            self.assignment[m] = assigned
            assignments.append((m, Assignment(
                generation=self.generation, controller_epoch=self.controller_epoch, assigned=assigned,
                revoked=revoked, protocol=self.protocol or "eager", leader=self.leader,
                follow_up=second_round and m == self.leader)))
        self.sync_deadline = None
        self.join_result = None
        self.reason = "assignment published" + (
            f"; {len(self.deferred)} moves wait ({'maintenance' if self.maintenance else 'throttle'})"
            if self.deferred else "")
        self._transition(GroupState.STABLE)
        decisions: list[Decision] = [WriteAssignments(tuple(assignments)), WriteGroupState(self.info()),
                                     DeleteGenerationsBelow(self.generation)]
        if self.moving:
            decisions.append(WatchMoves(tuple(sorted(self.moving))))
        return decisions

    def _static_rejoin(self: "GroupCoordinator", member_id: str, key: str) -> list[Decision]:
        """A static member came back within the delay: its held tasks again, nobody else disturbed."""
        tasks = tuple(t for t in self.held.pop(key).tasks if t in self.tasks)
        self.generation_members = tuple(sorted(set(self.generation_members) | {member_id}))
        self.assignment[member_id] = tasks
        self.static_returned[member_id] = self.members[member_id]
        self.reason = f"static member {key} returned"
        log.info("group %s: %s returned as %s; %d tasks back without a rebalance", self.group, key, member_id,
                 len(tasks))
        a = Assignment(generation=self.generation, controller_epoch=self.controller_epoch, assigned=tasks,
                       protocol=self.protocol or "eager", leader=self.leader)
        return [WriteAssignments(((member_id, a),)), WriteGroupState(self.info())]
