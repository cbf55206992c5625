"""The group member (worker side of the protocol), sans-IO.

States: Down -> PreparingJoin -> Joining -> Syncing -> Stable, back to PreparingJoin on the protocol
error codes, on a rebalance and on lost assignments (DataLink's worker state diagram). The worker's
IO layer feeds observations (group state, own assignment, join result, which tasks it holds) and
carries out the returned actions (write the join request, write a proposal, reconcile its tasks).
Reactions to errors read the flags of :class:`~controller.protocol.errors.ProtocolError`, not scattered ifs.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from controller.protocol.errors import InternalError, ProtocolError
from controller.protocol.group.rules import COOPERATIVE, EAGER, RECONCILE, cooperative_adjust
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest, JoinResult, SyncProposal

log = logging.getLogger(__name__)


class WorkerState(str, Enum):
    DOWN = "Down"
    PREPARING_JOIN = "PreparingJoin"
    JOINING = "Joining"
    SYNCING = "Syncing"
    STABLE = "Stable"
    #: reconcile protocol: moving towards the published assignment (releasing or acquiring tasks)
    RECONCILING = "Reconciling"


VALID_PREVIOUS: dict[WorkerState, frozenset[WorkerState]] = {
    # (from Reconciling: the group went back to a join round, a member without reconcile joined)
    WorkerState.PREPARING_JOIN: frozenset(
        {WorkerState.DOWN, WorkerState.JOINING, WorkerState.SYNCING, WorkerState.STABLE, WorkerState.RECONCILING}
    ),
    WorkerState.JOINING: frozenset({WorkerState.PREPARING_JOIN}),
    WorkerState.SYNCING: frozenset({WorkerState.JOINING}),
    # Joining -> Stable: a static member that returns inside the delay gets its tasks without a sync;
    # Reconciling -> Stable: it runs exactly its published assignment.
    WorkerState.STABLE: frozenset({WorkerState.SYNCING, WorkerState.JOINING, WorkerState.RECONCILING}),
    # reconcile: any assignment the coordinator publishes (from a join round it ended, or a change)
    WorkerState.RECONCILING: frozenset(
        {WorkerState.PREPARING_JOIN, WorkerState.JOINING, WorkerState.SYNCING, WorkerState.STABLE}
    ),
    WorkerState.DOWN: frozenset(
        {
            WorkerState.PREPARING_JOIN,
            WorkerState.JOINING,
            WorkerState.SYNCING,
            WorkerState.STABLE,
            WorkerState.RECONCILING,
        }
    ),
}


class IllegalWorkerTransition(InternalError, RuntimeError):
    """A worker state change the diagram does not allow: a bug, never swallowed."""


# ---- actions --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WriteJoin:
    request: JoinRequest


@dataclass(frozen=True)
class ReadJoinResult:
    """The leader must read this generation's join result and feed it to ``on_join_result``."""

    generation: int


@dataclass(frozen=True)
class WriteProposal:
    proposal: SyncProposal


@dataclass(frozen=True)
class SetDesired:
    """Run exactly these tasks (stop the others first; start these once their owner znode is free)."""

    tasks: frozenset[str]


@dataclass(frozen=True)
class Exit:
    """Controlled shutdown finished: the member owns nothing, the worker may leave."""


Action = WriteJoin | ReadJoinResult | WriteProposal | SetDesired | Exit
AssignFn = Callable[[JoinResult], dict[str, tuple[str, ...]]]


@dataclass
class Member:
    """One worker's view of its group. ``assign`` runs the named assignor (used when this member leads)."""

    member_id: str
    assign: Callable[[str, JoinResult], dict[str, tuple[str, ...]]]
    protocols: tuple[str, ...] = (COOPERATIVE, EAGER)
    assignors: tuple[str, ...] = ("sticky",)
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None

    state: WorkerState = WorkerState.DOWN
    generation: int = -1
    join_generation: int = -1
    epoch_seen: int = -1
    group: GroupStateInfo | None = None
    owned: frozenset[str] = frozenset()
    desired: frozenset[str] = frozenset()
    pending_revocation: frozenset[str] = frozenset()
    pending_join: int | None = None
    proposed: int = -1  # the generation this member (as leader) last proposed an assignment for
    follow_up: int = -1  # a generation whose proposal (ours, as leader) revoked tasks: they move in the next one
    rejoin_when_released: bool = False  # applied that generation: rejoin once our own revocations are let go
    leaving: bool = False
    #: reconcile: the group's coordinator places tasks; we report (rewrite our request) after releases
    reconcile_mode: bool = False
    #: this life of the member (a restart is a new one): a reconcile assignment names the life it is for
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    #: what our request znode last listed as owned (the coordinator counts it as ours until we say otherwise)
    reported: frozenset[str] = frozenset()
    #: tasks whose owner znode the worker holds now (``owned`` also counts those it may hold any moment)
    holding: frozenset[str] = frozenset()
    #: of those, the tasks whose start has not finished (held, not running yet): reported, so the coordinator
    #: does not call the group Stable before they run
    starting: frozenset[str] = frozenset()
    #: the last report built to be written (``on_released`` tells whether a release's report is still the last)
    last_report: JoinRequest | None = None
    last_error: ProtocolError | None = None
    transitions: list[tuple[WorkerState, WorkerState]] = field(default_factory=list)

    # ---- state ------------------------------------------------------------------------------------
    def _transition(self, target: WorkerState) -> None:
        if self.state is target:
            return
        if self.state not in VALID_PREVIOUS[target]:
            raise IllegalWorkerTransition(
                f"worker {self.member_id} cannot go from {self.state.value} to {target.value}"
            )
        self.transitions.append((self.state, target))
        self.state = target

    @property
    def follows_assignment_alone(self) -> bool:
        """Under reconcile, with its place in the group settled, a member learns all it needs from its own
        assignment: the group state's changes (Reconciling <-> Stable at every step) tell it nothing, and a
        read of it by every member at every step cost more than the step's own moves. When the group leaves
        reconcile, the coordinator says so in each member's assignment (REBALANCE_IN_PROGRESS)."""
        return self.reconcile_mode and self.state in (WorkerState.RECONCILING, WorkerState.STABLE)

    def _revokes_all_on_join(self) -> bool:
        """Eager behaviour unless both this member and the group's current protocol are cooperative."""
        group_protocol = self.group.protocol if self.group and self.group.protocol else None
        if COOPERATIVE not in self.protocols:
            return True
        return group_protocol == EAGER

    def _request(self, join_generation: int) -> JoinRequest:
        """``owned`` lists what we hold *and* what we were given but may still be acquiring (Kafka's
        owned partitions): the leader must not hand either to someone else before we let go."""
        self.reported = self.owned | self.desired
        self.last_report = self._build_request(join_generation, self.reported)
        return self.last_report

    def _build_request(
        self, join_generation: int, owned: frozenset[str], releasing: frozenset[str] = frozenset()
    ) -> JoinRequest:
        """``releasing``: owner znodes let go by the very write that carries this request (a task revoked, then
        given back before its stop was over, is not held once that write lands: it is pending again)."""
        holding = self.holding - releasing
        return JoinRequest(
            member_id=self.member_id,
            join_generation=join_generation,
            generation=self.generation,
            protocols=self.protocols,
            assignors=self.assignors,
            owned=tuple(sorted(owned)),
            capacity=self.capacity,
            rack=self.rack,
            instance_id=self.instance_id,
            leaving=self.leaving,
            incarnation=self.incarnation,
            pending=tuple(sorted(self.desired - holding)),
            acknowledges=True,
            starting=tuple(sorted(self.starting & holding & owned)),
        )

    # ---- inputs -----------------------------------------------------------------------------------
    def start(self, group: GroupStateInfo | None) -> list[Action]:
        """Connected and registered: prepare to join the group's next generation."""
        self._transition(WorkerState.PREPARING_JOIN)
        if group is not None and group.controller_epoch >= self.epoch_seen:
            self.group = group
            self.epoch_seen = group.controller_epoch
        target = (self.group.generation + 1) if self.group else 1
        if self.group and self.group.state == "PreparingRebalance":
            target = self.group.join_generation
        return self._rejoin(target, None)

    def stop(self) -> list[Action]:
        """Session lost or worker stopping: Down, running nothing."""
        self._transition(WorkerState.DOWN)
        self.reconcile_mode = False
        self.desired = frozenset()
        self.pending_join = None
        return [SetDesired(frozenset())]

    def on_group_state(self, info: GroupStateInfo) -> list[Action]:
        if info.controller_epoch < self.epoch_seen:
            log.debug(
                "%s: ignoring group state from stale controller epoch %d (NOT_COORDINATOR)",
                self.member_id,
                info.controller_epoch,
            )
            return []
        self.epoch_seen = info.controller_epoch
        self.group = info
        if self.state is WorkerState.DOWN:
            return []
        if info.protocol == RECONCILE and info.state in ("Reconciling", "Stable"):
            # no barrier: our assignment comes on its own when the coordinator places tasks with us
            if (
                self.reconcile_mode
                or self.member_id in info.members
                or self.state in (WorkerState.JOINING, WorkerState.PREPARING_JOIN)
            ):
                return []
            return self._rejoin(info.generation + 1, ProtocolError.UNKNOWN_MEMBER_ID)
        if info.state == "PreparingRebalance":
            if (
                self.state in (WorkerState.JOINING, WorkerState.SYNCING)
                and self.join_generation == info.join_generation
            ):
                return []  # already joined this round
            if self.state is WorkerState.PREPARING_JOIN and self.pending_join == info.join_generation:
                return []  # joining as soon as our revocations finish
            if (
                self.state is WorkerState.PREPARING_JOIN
                and self.last_error is not None
                and not self.last_error.retriable
            ):
                self.last_error = None  # the group changed: try again
            return self._rejoin(info.join_generation, ProtocolError.REBALANCE_IN_PROGRESS)
        if info.state == "AwaitingSync":
            if self.join_generation == info.generation and self.member_id in info.members:
                if self.state is WorkerState.JOINING:
                    self._transition(WorkerState.SYNCING)
                if (
                    info.leader == self.member_id
                    and self.state is WorkerState.SYNCING
                    and self.proposed != info.generation
                ):  # (the join result may have come first)
                    return [ReadJoinResult(info.generation)]
            return []  # excluded members learn why from their assignment (error code)
        if info.state in ("Stable", "Empty"):
            if self.member_id in info.members:
                return []  # our assignment for this generation arrives (or arrived) on its own
            if self.state is WorkerState.STABLE and self.generation == info.generation:
                return []
            if self.pending_join is not None or (
                self.state is WorkerState.JOINING and self.join_generation > info.generation
            ):
                return []  # our join is in flight; the coordinator will rebalance for it
            if self.last_error is not None and not self.last_error.retriable:
                return []
            return self._rejoin(info.generation + 1, ProtocolError.UNKNOWN_MEMBER_ID)
        return []

    def on_assignment(self, a: Assignment) -> list[Action]:
        if a.controller_epoch < self.epoch_seen or self.state is WorkerState.DOWN:
            return []
        if a.protocol == RECONCILE:
            return self._on_target(a)
        static_return = (
            self.state is WorkerState.JOINING
            and self.group is not None
            and self.group.state == "Stable"
            and a.generation == self.group.generation == self.join_generation - 1
        )
        if (
            a.error == ProtocolError.INVALID_REPORT.name
            and self.generation <= a.generation < self.join_generation
            and self.state in (WorkerState.JOINING, WorkerState.SYNCING)
        ):
            # our request was refused as the coordinator read it, answered at the generation of the last good
            # one it took: the request we wrote since (a rejoin) may never have reached it (overwritten in our
            # znode before it was read), so we write it again; a stale answer costs one identical rewrite
            self.last_error = ProtocolError.INVALID_REPORT
            return [WriteJoin(self._request(self.join_generation))]
        if a.generation < self.generation or (a.generation != self.join_generation and not static_return):
            return []  # stale (ILLEGAL_GENERATION) or not ours yet
        if a.error is not None:
            err = ProtocolError.parse(a.error) or ProtocolError.UNKNOWN_MEMBER_ID
            if a.generation != self.join_generation:
                return []
            return self._on_error(err)
        # planned moves handed to us in the round that revokes them: taken once their owner lets go (the owner
        # znode is the lock), listed as owned in our next request; a leaving member takes nothing new
        handoff = frozenset(a.handoff) if a.protocol == COOPERATIVE and not self.leaving else frozenset()
        if (
            a.generation == self.generation
            and self.state is WorkerState.STABLE
            and frozenset(a.assigned) | handoff == self.desired
        ):
            return []  # already applied
        self.epoch_seen = max(self.epoch_seen, a.controller_epoch)
        self.generation = a.generation
        self.last_error = None
        self._transition(WorkerState.STABLE)
        self.pending_join = None
        self.desired = frozenset(a.assigned) | handoff
        # any revocation means a second round must assign what moved; rejoin once it is all let go
        self.pending_revocation = frozenset(a.revoked)
        # our proposal revoked tasks (ours or others'): the next generation assigns them, and will be
        # started by their owners' rejoins; we start it as soon as our own revocations are let go (Kafka
        # Streams' leader schedules such a follow-up rebalance for every member likewise)
        follow = a.follow_up if a.follow_up is not None else a.generation == self.follow_up
        self.rejoin_when_released = follow and not self.leaving
        actions: list[Action] = [SetDesired(self.desired)]
        actions += self._after_owned_change()
        return actions

    def on_join_result(self, result: JoinResult) -> list[Action]:
        """As leader: run the assignor, then the cooperative adjustment, and propose.

        A member that led the last generation watches the join result of the one it joins, so the result
        can arrive before the group state that announces it (AwaitingSync, written in the same multi):
        naming us the leader of the generation we joined, it takes us from Joining to Syncing."""
        if (
            self.state not in (WorkerState.JOINING, WorkerState.SYNCING)
            or result.generation != self.join_generation
            or result.leader != self.member_id
            or result.controller_epoch < self.epoch_seen
        ):
            return []
        if self.state is WorkerState.JOINING:
            self._transition(WorkerState.SYNCING)
        target = self.assign(result.assignor, result)
        owned = {m.member_id: m.owned for m in result.members}
        assigned, revoked = cooperative_adjust(target, owned)
        for m in result.members:
            assigned.setdefault(m.member_id, ())
        proposal = SyncProposal(generation=result.generation, leader=self.member_id, assigned=assigned, revoked=revoked)
        self.proposed = result.generation
        if result.protocol == COOPERATIVE and any(revoked.values()):
            self.follow_up = result.generation
        return [WriteProposal(proposal)]

    def proposal_not_written(self, generation: int) -> None:
        """The worker could not write our proposal (e.g. the connection dropped): propose again when the
        group state next says AwaitingSync for this generation."""
        if self.proposed == generation:
            self.proposed = -1

    def on_owned(
        self, owned: frozenset[str], holding: frozenset[str] | None = None, starting: frozenset[str] | None = None
    ) -> list[Action]:
        """The worker reports which tasks it holds or may hold any moment (``owned``), of those whose owner
        znode it holds now (``holding``; by default all of them), and of those whose start has not finished
        (``starting``; by default none), after starts/stops complete."""
        self.owned = frozenset(owned)
        self.holding = self.owned if holding is None else frozenset(holding)
        self.starting = frozenset(starting or ()) & self.holding
        return self._after_owned_change()

    def release_report(self, releasing: frozenset[str], held: frozenset[str]) -> JoinRequest | None:
        """Reconcile: the report to write in the very multi that lets go of ``releasing`` (``held``: what the
        worker holds or may hold, those included), so the coordinator learns of the release from the write
        that makes it, without a round trip of its own after it (one of three a broker giving a task up
        spent). None when we are not reconciling: a join round's request has its own time. Nothing changes
        here until the worker says the multi succeeded (``on_released``); if it fails, the report is
        written the usual way once the release is done."""
        if not self.follows_assignment_alone:
            return None
        self.last_report = self._build_request(self.join_generation, (held - releasing) | self.desired, releasing)
        return self.last_report

    def on_released(
        self,
        owned: frozenset[str],
        request: JoinRequest,
        holding: frozenset[str] | None = None,
        starting: frozenset[str] | None = None,
    ) -> list[Action]:
        """The release multi carrying ``request`` (from ``release_report``) succeeded; ``owned`` is what the
        worker holds now. The request znode lists what it says, unless a later report was written since
        (requests from one session apply in order): then that one stands. A report of an older epoch than
        ours now confirms nothing revoked since, so it does not count as our report of those."""
        if self.last_report is request and request.join_generation == self.join_generation:
            self.reported = frozenset(request.owned)
            self.pending_revocation = self.pending_revocation & self.reported
        return self.on_owned(owned, holding, starting)

    def on_coordinator(self, available: bool) -> list[Action]:
        """No active controller (COORDINATOR_NOT_AVAILABLE): keep running; rejoin when one writes state."""
        if not available and self.state is not WorkerState.DOWN:
            self.last_error = ProtocolError.COORDINATOR_NOT_AVAILABLE
        return []

    def request_shutdown(self) -> list[Action]:
        """Controlled shutdown: announce leaving, hand everything back, exit when owning nothing."""
        if self.leaving or self.state is WorkerState.DOWN:
            return []
        self.leaving = True
        if self.reconcile_mode:  # no round to join: the request says it, the coordinator re-targets
            return [WriteJoin(self._request(self.join_generation))] + self._after_owned_change()
        target = (self.group.generation + 1) if self.group else self.join_generation + 1
        if self.group and self.group.state == "PreparingRebalance":
            target = self.group.join_generation
        return self._rejoin(target, None)

    # ---- internals --------------------------------------------------------------------------------
    def _on_target(self, a: Assignment) -> list[Action]:
        """Reconcile: the coordinator published what we may run now (a member epoch newer than any we have).
        Tasks it no longer names are revoked: once they are let go we report, and only then may the
        coordinator hand them on."""
        refused = a.error == ProtocolError.INVALID_REPORT.name and a.incarnation is None  # (it could not read ours)
        if (
            a.generation <= self.generation
            or (a.incarnation != self.incarnation and not refused)
            or RECONCILE not in self.protocols
        ):
            return []  # stale, for a previous life of ours (a restart), or not for a member like us
        if a.error is not None:
            err = ProtocolError.parse(a.error) or ProtocolError.UNKNOWN_MEMBER_ID
            if err is ProtocolError.REBALANCE_IN_PROGRESS:
                # the group leaves reconcile for a join round (a member that cannot reconcile): join it, at
                # the round's generation, which the notice carries (we stopped reading the group state)
                if not self.follows_assignment_alone:
                    return []  # we read the group state again already: it told us
                self.epoch_seen = max(self.epoch_seen, a.controller_epoch)
                return self._rejoin(a.generation, err)
            return self._on_error(err)
        self.epoch_seen = max(self.epoch_seen, a.controller_epoch)
        self.generation = a.generation
        self.join_generation = max(self.join_generation, a.generation)
        self.last_error = None
        self.pending_join = None
        self.rejoin_when_released = False
        self.reconcile_mode = True
        before = self.desired
        self.desired = frozenset(a.assigned)
        # a task given back that we still hold from its revocation may be stopping (it then stops, is let go and
        # is taken again): not running for good until the worker says so (it tells us after every SetDesired)
        self.starting = self.starting | ((self.owned - before) & self.desired)
        # what we were told to run may be held already (an acquisition in flight) until the worker says not
        self.owned = self.owned | (before - self.desired)
        self.pending_revocation = (
            self.pending_revocation | (before - self.desired) | frozenset(a.revoked)
        ) - self.desired
        self._transition(WorkerState.RECONCILING)
        return [SetDesired(self.desired)] + self._after_owned_change()

    def _after_reconcile_change(self) -> list[Action]:
        """Reconcile: report whenever revoked tasks were let go (or anything we reported is gone); Stable when
        we run exactly our assignment."""
        actions: list[Action] = []
        # report as releases happen, not once the last is done: a broker letting go of many tasks hands each
        # on as soon as it is free (a report names only what we still hold, so it confirms exactly those)
        released = self.pending_revocation - self.owned
        reported = False
        if released or self.reported - self.owned - self.desired:
            self.pending_revocation = self.pending_revocation & self.owned
            actions.append(WriteJoin(self._request(self.join_generation)))
            reported = True
        if self.state is WorkerState.RECONCILING and self.owned == self.desired and not self.pending_revocation:
            self._transition(WorkerState.STABLE)
        last = self.last_report
        taken = self.desired & self.holding
        if (
            not reported
            and self.reconcile_mode
            and (
                # the acknowledgement: we hold every owner znode of our assignment of this member epoch; until it is
                # written the coordinator does not count the group Stable
                (
                    self.state is WorkerState.STABLE
                    and self.desired <= self.holding
                    and (
                        last is None
                        or last.generation != self.generation
                        or last.pending
                        or self.reported != self.owned
                        # every start reported as under way has finished: the report that says so
                        or (bool(last.starting) and not self.starting & self.desired)
                    )
                )
                # or progress: tasks taken since our last report (one stuck acquisition must not hide the others,
                # which the coordinator would otherwise fence us from once the rebalance timeout is over)
                or (last is not None and taken - (set(last.owned) - set(last.pending)))
                or (last is not None and self._starting_again(last, taken))
            )
        ):
            actions.append(WriteJoin(self._request(self.join_generation)))
        if self.leaving and not self.desired and not self.owned and not self.pending_revocation:
            actions.append(Exit())
        return actions

    def _starting_again(self, last: JoinRequest, taken: frozenset[str]) -> frozenset[str]:
        """Tasks we hold that start over although our last report did not say so (our fence stopped them and
        lifted, the session alive): until they run again the coordinator must not count the group Stable."""
        return (self.starting & taken & self.owned) - set(last.starting)

    def _on_error(self, err: ProtocolError) -> list[Action]:
        self.last_error = err
        log.info("%s: %s (%s)", self.member_id, err.name, err.doc)
        if err.reset_generation:
            self.generation = -1
        if not err.rejoin:
            return []
        if not err.retriable:
            # e.g. INCONSISTENT_PROTOCOL: stop our tasks and wait for the group to change, without a storm
            self._transition(WorkerState.PREPARING_JOIN)
            self.desired = frozenset()
            return [SetDesired(frozenset())]
        target = (self.group.generation + 1) if self.group else self.join_generation + 1
        if self.group and self.group.state == "PreparingRebalance":
            target = self.group.join_generation
        if err.reset_generation:
            # lost our membership: our tasks may already be someone else's; stop them before rejoining
            self.desired = frozenset()
            self._transition(WorkerState.PREPARING_JOIN)
            self.pending_join = target
            return [SetDesired(frozenset())] + self._after_owned_change()
        return self._rejoin(target, err)

    def _rejoin(self, target: int, err: ProtocolError | None) -> list[Action]:
        if err is not None:
            self.last_error = err
        self.reconcile_mode = False  # a join round: the group left reconcile (or we are new to it)
        self._transition(WorkerState.PREPARING_JOIN)
        actions: list[Action] = []
        if self._revokes_all_on_join() and self.desired:
            self.desired = frozenset()  # eager: revoke everything before joining
            actions.append(SetDesired(frozenset()))
        self.pending_join = target
        return actions + self._after_owned_change()

    def _after_owned_change(self) -> list[Action]:
        if self.reconcile_mode and self.state in (WorkerState.RECONCILING, WorkerState.STABLE):
            return self._after_reconcile_change()
        actions: list[Action] = []
        if self.pending_join is not None and self.state is WorkerState.PREPARING_JOIN:
            # eager, or a member that lost its membership (generation reset): let go of everything first
            eager = self._revokes_all_on_join() or self.generation < 0
            # cooperative: join once what was revoked is let go (Kafka revokes before JoinGroup); a join
            # that still listed revoked tasks as owned would only force another generation
            ready = not self.owned if eager else not (self.pending_revocation & self.owned)
            if ready:
                target = self.pending_join
                self.pending_join = None
                self.pending_revocation = frozenset()
                self.rejoin_when_released = False
                self.join_generation = target
                self._transition(WorkerState.JOINING)
                actions.append(WriteJoin(self._request(target)))
        elif (self.pending_revocation or self.rejoin_when_released) and not (self.pending_revocation & self.owned):
            # cooperative: what moved is stopped (or, as the leader that moved tasks, nothing of ours had
            # to stop); rejoin so the next generation can assign it
            self.pending_revocation = frozenset()
            self.rejoin_when_released = False
            if self.state is WorkerState.STABLE and self.group is not None and not self.leaving:
                target = max(self.generation, self.group.generation) + 1
                self._transition(WorkerState.PREPARING_JOIN)
                self.pending_join = None
                self.join_generation = target
                self._transition(WorkerState.JOINING)
                actions.append(WriteJoin(self._request(target)))
        if (
            self.leaving
            and self.state is WorkerState.STABLE
            and not self.desired
            and not self.owned
            and not self.pending_revocation
        ):
            actions.append(Exit())
        return actions
