"""The group member (worker side), sans-IO: every pair of worker states, and the member's reactions,
driven with hand-built group states, assignments and join results, reading only the actions it returns.

The legal transitions are written out here from the worker state diagram (docs/worker.md), not read
back from the module's table.
"""

from __future__ import annotations

from itertools import product

import pytest

from controller.protocol.errors import ProtocolError
from controller.protocol.group.member import (
    VALID_PREVIOUS,
    Exit,
    IllegalWorkerTransition,
    Member,
    ReadJoinResult,
    SetDesired,
    WorkerState,
    WriteJoin,
    WriteProposal,
)
from controller.protocol.group.rules import COOPERATIVE, EAGER
from controller.protocol.records.group_messages import (
    Assignment,
    GroupStateInfo,
    JoinResult,
    MemberMetadata,
    TaskDescriptor,
)

W = WorkerState
LEGAL = {
    (W.DOWN, W.PREPARING_JOIN),
    (W.JOINING, W.PREPARING_JOIN),
    (W.SYNCING, W.PREPARING_JOIN),
    (W.STABLE, W.PREPARING_JOIN),
    (W.PREPARING_JOIN, W.JOINING),
    (W.JOINING, W.SYNCING),
    (W.SYNCING, W.STABLE),
    (W.JOINING, W.STABLE),  # a static member back inside the delay gets its tasks without a sync
    (W.PREPARING_JOIN, W.DOWN),
    (W.JOINING, W.DOWN),
    (W.SYNCING, W.DOWN),
    (W.STABLE, W.DOWN),
    # reconcile: any published assignment starts reconciling; reached, Stable; a join round, PreparingJoin
    (W.PREPARING_JOIN, W.RECONCILING),
    (W.JOINING, W.RECONCILING),
    (W.SYNCING, W.RECONCILING),
    (W.STABLE, W.RECONCILING),
    (W.RECONCILING, W.STABLE),
    (W.RECONCILING, W.PREPARING_JOIN),
    (W.RECONCILING, W.DOWN),
}
EPOCH = 4
ME = "m1"


# --------------------------------------------------------------------------------------------------
# the state diagram
# --------------------------------------------------------------------------------------------------


def test_table_matches_the_diagram():
    assert {(p, t) for t, ps in VALID_PREVIOUS.items() for p in ps} == LEGAL
    assert set(VALID_PREVIOUS) == set(WorkerState)


@pytest.mark.parametrize("current, target", list(product(WorkerState, WorkerState)), ids=lambda s: s.value)
def test_every_transition(current: WorkerState, target: WorkerState):
    m = member()
    m.state = current
    if current is target:
        m._transition(target)  # staying put is no transition
        assert m.transitions == []
    elif (current, target) in LEGAL:
        m._transition(target)
        assert m.state is target and m.transitions == [(current, target)]
    else:
        with pytest.raises(IllegalWorkerTransition, match=f"from {current.value} to {target.value}"):
            m._transition(target)
        assert m.state is current and m.transitions == []


def test_the_happy_path_walks_the_diagram():
    m = stable_member()
    assert m.transitions == [
        (W.DOWN, W.PREPARING_JOIN),
        (W.PREPARING_JOIN, W.JOINING),
        (W.JOINING, W.SYNCING),
        (W.SYNCING, W.STABLE),
    ]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def no_assign(name, join):  # pragma: no cover - only leaders call it, and tests that need it pass their own
    raise AssertionError("this member is not the leader")


def member(protocols=(COOPERATIVE, EAGER), assign=no_assign, instance_id=None) -> Member:
    return Member(
        member_id=ME, assign=assign, protocols=tuple(protocols), assignors=("sticky",), instance_id=instance_id
    )


def info(
    state: str,
    generation: int,
    join_generation: int | None = None,
    epoch: int = EPOCH,
    protocol: str | None = COOPERATIVE,
    leader: str = "m2",
    members=(ME, "m2"),
) -> GroupStateInfo:
    jg = generation if join_generation is None else join_generation
    return GroupStateInfo(
        state=state,
        generation=generation,
        join_generation=jg,
        controller_epoch=epoch,
        protocol=protocol,
        assignor="sticky",
        leader=leader,
        members=tuple(members),
    )


def assignment(generation: int, assigned=(), revoked=(), error=None, epoch=EPOCH, protocol=COOPERATIVE) -> Assignment:
    return Assignment(
        generation=generation,
        controller_epoch=epoch,
        assigned=tuple(assigned),
        revoked=tuple(revoked),
        protocol=protocol,
        leader="m2",
        error=error,
    )


def joins(actions) -> list:
    return [a.request for a in actions if isinstance(a, WriteJoin)]


def stable_member(
    tasks=("t1", "t2"), protocols=(COOPERATIVE, EAGER), protocol=COOPERATIVE, generation=1, assign=no_assign
) -> Member:
    """A member that joined generation ``generation`` (from Down) and runs ``tasks``."""
    m = member(protocols, assign)
    actions = m.start(
        info("PreparingRebalance", generation - 1, generation, protocol=protocol) if generation > 1 else None
    )
    assert [r.join_generation for r in joins(actions)] == [generation]
    assert m.on_group_state(info("AwaitingSync", generation, protocol=protocol)) == []
    assert m.state is W.SYNCING
    assert m.on_assignment(assignment(generation, tasks, protocol=protocol)) == [SetDesired(frozenset(tasks))]
    assert m.on_owned(frozenset(tasks)) == []
    assert m.on_group_state(info("Stable", generation, protocol=protocol)) == []
    assert (m.state, m.generation, m.owned) == (W.STABLE, generation, frozenset(tasks))
    return m


# --------------------------------------------------------------------------------------------------
# start, stop, joining
# --------------------------------------------------------------------------------------------------


def test_start_joins_the_next_generation():
    m = member()
    [request] = joins(m.start(info("Stable", 6, epoch=EPOCH)))
    assert (request.join_generation, request.generation, request.owned) == (7, -1, ())
    assert m.state is W.JOINING and m.epoch_seen == EPOCH
    m = member()
    assert joins(m.start(info("PreparingRebalance", 6, 7)))[0].join_generation == 7
    m = member()
    assert joins(m.start(None))[0].join_generation == 1


def test_stop_goes_down_and_stops_everything():
    m = stable_member()
    assert m.stop() == [SetDesired(frozenset())]
    assert m.state is W.DOWN and m.desired == frozenset()
    assert m.on_group_state(info("PreparingRebalance", 1, 2)) == []
    assert m.on_assignment(assignment(2, ["t1"])) == []
    assert m.request_shutdown() == []


def test_eager_member_stops_everything_before_writing_its_join():
    m = stable_member(protocols=(EAGER,), protocol=EAGER)
    actions = m.on_group_state(info("PreparingRebalance", 1, 2, protocol=EAGER))
    assert actions == [SetDesired(frozenset())]  # revoke all first; no join yet
    assert m.state is W.PREPARING_JOIN
    assert m.on_owned(frozenset({"t2"})) == []  # t1 stopped, t2 still running
    # the same round announced again changes nothing
    assert m.on_group_state(info("PreparingRebalance", 1, 2, protocol=EAGER)) == []
    [request] = joins(m.on_owned(frozenset()))
    assert (request.join_generation, request.generation, request.owned) == (2, 1, ())
    assert m.state is W.JOINING


def test_a_cooperative_capable_member_in_an_eager_group_behaves_eagerly():
    m = stable_member(protocols=(COOPERATIVE, EAGER), protocol=EAGER)
    assert m.on_group_state(info("PreparingRebalance", 1, 2, protocol=EAGER)) == [SetDesired(frozenset())]
    assert m.state is W.PREPARING_JOIN


def test_cooperative_member_rejoins_at_once_listing_what_it_owns():
    m = stable_member(tasks=("t1", "t2"))
    m.on_owned(frozenset({"t1"}))  # t2 given but still being acquired: it counts as owned too
    actions = m.on_group_state(info("PreparingRebalance", 1, 2))
    assert not any(isinstance(a, SetDesired) for a in actions)
    [request] = joins(actions)
    assert (request.join_generation, request.generation, request.owned) == (2, 1, ("t1", "t2"))
    assert m.state is W.JOINING and m.desired == {"t1", "t2"}
    # already joined this round: the same announcement again is ignored
    assert m.on_group_state(info("PreparingRebalance", 1, 2)) == []


def test_a_member_left_out_of_the_generation_rejoins():
    m = stable_member()
    assert m.on_group_state(info("Stable", 1, members=(ME, "m2"))) == []
    actions = m.on_group_state(info("Stable", 2, members=("m2",)))
    assert joins(actions)[0].join_generation == 3
    assert m.last_error is ProtocolError.UNKNOWN_MEMBER_ID


def test_static_return_goes_from_joining_to_stable():
    m = member(instance_id="i-1")
    m.start(info("Stable", 5))
    assert m.join_generation == 6
    actions = m.on_assignment(assignment(5, ["t3"]))  # its old tasks back, no rebalance
    assert actions == [SetDesired(frozenset({"t3"}))]
    assert m.state is W.STABLE and m.generation == 5
    assert m.transitions[-1] == (W.JOINING, W.STABLE)


# --------------------------------------------------------------------------------------------------
# sync: the leader
# --------------------------------------------------------------------------------------------------


def join_result(generation: int, leader: str = ME) -> JoinResult:
    return JoinResult(
        generation=generation,
        leader=leader,
        protocol=COOPERATIVE,
        assignor="sticky",
        controller_epoch=EPOCH,
        members=(MemberMetadata(ME, owned=("t1", "t2")), MemberMetadata("m2", owned=("t3",)), MemberMetadata("m3")),
        tasks=tuple(TaskDescriptor(t) for t in ("t1", "t2", "t3", "t4")),
    )


def test_leader_reads_the_join_result_and_proposes_a_cooperative_adjusted_assignment():
    calls = []

    def assign(name, join):
        calls.append((name, join.generation))
        return {ME: ("t1", "t3"), "m2": ("t2",), "m3": ("t4",)}  # t2 and t3 swap owners

    m = stable_member(assign=assign)
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    assert m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3"))) == [ReadJoinResult(2)]
    assert m.state is W.SYNCING
    [action] = m.on_join_result(join_result(2))
    assert isinstance(action, WriteProposal) and calls == [("sticky", 2)]
    p = action.proposal
    assert (p.generation, p.leader) == (2, ME)
    # moving tasks are withheld from their new owner and revoked from the old one
    assert p.assigned == {ME: ("t1",), "m2": (), "m3": ("t4",)}
    assert p.revoked == {ME: ("t2",), "m2": ("t3",)}


def test_only_the_leader_of_this_generation_proposes():
    m = stable_member(assign=lambda name, join: {ME: ("t1",)})
    m.on_group_state(info("PreparingRebalance", 1, 2))
    assert m.on_group_state(info("AwaitingSync", 2, leader="m2")) == []  # a follower waits
    assert m.on_join_result(join_result(2, leader="m2")) == []
    m2 = stable_member(assign=lambda name, join: {ME: ("t1",)})
    m2.on_group_state(info("PreparingRebalance", 1, 2))
    m2.on_group_state(info("AwaitingSync", 2, leader=ME))
    assert m2.on_join_result(join_result(3)) == []  # not our generation
    assert m2.on_join_result(join_result(2)) != []


def test_awaiting_sync_without_us_is_no_sync():
    m = stable_member()
    m.on_group_state(info("PreparingRebalance", 1, 2))
    assert m.on_group_state(info("AwaitingSync", 2, leader=ME, members=("m2",))) == []
    assert m.state is W.JOINING  # it learns why from its assignment (an error code)


# --------------------------------------------------------------------------------------------------
# fencing: stale epochs and generations
# --------------------------------------------------------------------------------------------------


def test_stale_controller_epoch_is_ignored():
    m = stable_member()
    seen = m.group
    assert m.on_group_state(info("PreparingRebalance", 1, 2, epoch=EPOCH - 1)) == []
    assert m.group is seen and m.state is W.STABLE
    m.on_group_state(info("PreparingRebalance", 1, 2))
    m.on_group_state(info("AwaitingSync", 2))
    assert m.on_assignment(assignment(2, ["t9"], epoch=EPOCH - 1)) == []
    assert m.state is W.SYNCING and m.desired == {"t1", "t2"}
    # a newer controller is followed
    assert joins(m.on_group_state(info("PreparingRebalance", 2, 3, epoch=EPOCH + 1)))[0].join_generation == 3
    assert m.epoch_seen == EPOCH + 1


def test_stale_and_future_generations_are_ignored():
    m = stable_member(generation=3)
    assert m.on_assignment(assignment(2, ["t9"])) == []  # ILLEGAL_GENERATION: older than ours
    assert m.on_assignment(assignment(5, ["t9"])) == []  # not a generation we joined
    assert m.on_assignment(assignment(3, ["t1", "t2"])) == []  # already applied
    assert (m.generation, m.desired) == (3, {"t1", "t2"})
    assert m.on_assignment(assignment(2, error="REBALANCE_TIMEOUT")) == []  # a stale error too
    assert m.state is W.STABLE and m.last_error is None


# --------------------------------------------------------------------------------------------------
# protocol errors: the reaction follows the flags
# --------------------------------------------------------------------------------------------------


def syncing_member(protocols=(COOPERATIVE, EAGER), protocol=COOPERATIVE) -> Member:
    """Stable at generation 1 running t1, t2; joined generation 2 and waiting for its assignment."""
    m = stable_member(protocols=protocols, protocol=protocol)
    m.on_group_state(info("PreparingRebalance", 1, 2, protocol=protocol))
    if protocol == EAGER:
        m.on_owned(frozenset())  # eager: everything let go, then the join is written
    assert m.state is W.JOINING
    m.on_group_state(info("AwaitingSync", 2, protocol=protocol))
    assert m.state is W.SYNCING and m.join_generation == 2
    return m


@pytest.mark.parametrize("error", list(ProtocolError), ids=lambda e: e.name)
def test_each_error_code_reaction_follows_its_flags(error: ProtocolError):
    """Generation 2 answered with an error; the group (last seen AwaitingSync 2) is rejoined at 3."""
    m = syncing_member()
    actions = m.on_assignment(assignment(2, error=error.name))
    assert m.last_error is error
    assert m.generation == (-1 if error.reset_generation else 1)
    stops = SetDesired(frozenset()) in actions
    if not error.rejoin:
        assert actions == [] and m.state is W.SYNCING
    elif not error.retriable:
        # e.g. INCONSISTENT_PROTOCOL: stop, and wait for the group to change; no join, no storm
        assert stops and joins(actions) == [] and m.state is W.PREPARING_JOIN
        assert m.on_owned(frozenset()) == []
        assert m.on_group_state(info("Stable", 2, members=("m2",))) == []
        assert m.on_group_state(info("AwaitingSync", 3, members=("m2",))) == []
        [again] = joins(m.on_group_state(info("PreparingRebalance", 3, 4)))  # the group changed: try again
        assert again.join_generation == 4 and m.last_error is ProtocolError.REBALANCE_IN_PROGRESS
    elif error.reset_generation:
        # lost membership: stop our tasks (they may be someone else's by now), rejoin once they are stopped
        assert stops and joins(actions) == [] and m.state is W.PREPARING_JOIN
        assert m.on_owned(frozenset({"t1"})) == []
        [request] = joins(m.on_owned(frozenset()))
        assert (request.join_generation, request.generation, request.owned) == (3, -1, ())
        assert m.state is W.JOINING
    else:
        # retriable, membership kept: a cooperative member rejoins at once, keeping its tasks
        assert not stops and m.state is W.JOINING
        [request] = joins(actions)
        assert (request.join_generation, request.generation, request.owned) == (3, 1, ("t1", "t2"))


def test_an_unknown_error_code_is_treated_as_unknown_member():
    m = syncing_member()
    m.on_assignment(assignment(2, error="SOMETHING_NEW"))
    assert m.last_error is ProtocolError.UNKNOWN_MEMBER_ID and m.generation == -1


def test_an_eager_member_revokes_everything_every_round():
    m = syncing_member(protocols=(EAGER,), protocol=EAGER)
    m.on_assignment(assignment(2, ["t1"], protocol=EAGER))
    m.on_owned(frozenset({"t1"}))
    m.on_group_state(info("AwaitingSync", 2, protocol=EAGER))
    # a fresh round: the eager member revokes first, then joins
    actions = m.on_group_state(info("PreparingRebalance", 2, 3, protocol=EAGER))
    assert actions == [SetDesired(frozenset())]
    assert joins(m.on_owned(frozenset()))[0].join_generation == 3


def test_coordinator_unavailable_keeps_running():
    m = stable_member()
    assert m.on_coordinator(False) == []
    assert m.last_error is ProtocolError.COORDINATOR_NOT_AVAILABLE and m.desired == {"t1", "t2"}
    assert m.on_coordinator(True) == []
    # a new controller writes the group state: rejoin
    assert joins(m.on_group_state(info("PreparingRebalance", 1, 2, epoch=EPOCH + 1)))


# --------------------------------------------------------------------------------------------------
# cooperative revocation, controlled shutdown
# --------------------------------------------------------------------------------------------------


def test_revocation_rejoins_once_the_revoked_tasks_are_let_go():
    m = syncing_member()
    actions = m.on_assignment(assignment(2, ["t1"], revoked=["t2"]))
    assert actions == [SetDesired(frozenset({"t1"}))]  # no rejoin while t2 still runs
    assert m.state is W.STABLE and m.pending_revocation == {"t2"}
    assert m.on_owned(frozenset({"t1", "t2"})) == []
    [request] = joins(m.on_owned(frozenset({"t1"})))
    assert (request.join_generation, request.generation, request.owned) == (3, 2, ("t1",))
    assert m.state is W.JOINING and m.pending_revocation == frozenset()
    assert m.on_owned(frozenset({"t1"})) == []  # only once


def test_no_revocation_no_rejoin():
    m = syncing_member()
    assert m.on_assignment(assignment(2, ["t1", "t2", "t3"])) == [SetDesired(frozenset({"t1", "t2", "t3"}))]
    assert m.on_owned(frozenset({"t1", "t2", "t3"})) == []
    assert m.state is W.STABLE


def test_controlled_shutdown_exits_only_once_nothing_is_owned():
    m = stable_member()
    [request] = joins(m.request_shutdown())
    assert request.leaving and request.join_generation == 2 and request.owned == ("t1", "t2")
    assert m.request_shutdown() == []  # once
    m.on_group_state(info("PreparingRebalance", 1, 2))
    m.on_group_state(info("AwaitingSync", 2))
    actions = m.on_assignment(assignment(2, [], revoked=["t1", "t2"]))
    assert actions == [SetDesired(frozenset())]  # everything handed back; still running both
    assert m.on_owned(frozenset({"t2"})) == []
    assert m.on_owned(frozenset()) == [Exit()]  # and no rejoin for the revocation: it is leaving


def test_controlled_shutdown_of_a_member_with_nothing_waits_for_its_generation():
    m = stable_member(tasks=())
    joins(m.request_shutdown())
    assert m.on_owned(frozenset()) == []  # joining, not yet released by the coordinator
    m.on_group_state(info("AwaitingSync", 2))
    assert m.on_assignment(assignment(2, [])) == [SetDesired(frozenset()), Exit()]


def test_controlled_shutdown_waits_for_running_tasks_even_with_nothing_revoked():
    """Exit needs the owner locks released, not just an empty assignment (say, from a stale owned list)."""
    m = stable_member()
    m.request_shutdown()
    m.on_group_state(info("AwaitingSync", 2))
    assert m.on_assignment(assignment(2, [])) == [SetDesired(frozenset())]
    assert m.on_owned(frozenset({"t1"})) == []
    assert m.on_owned(frozenset()) == [Exit()]


# --------------------------------------------------------------------------------------------------
# the leader: proposing from the join result it watched, and starting the follow-up generation
# --------------------------------------------------------------------------------------------------


def test_the_leader_proposes_from_the_join_result_before_the_state_announces_it():
    m = stable_member(assign=lambda name, join: {ME: ("t1", "t2"), "m2": ("t3",), "m3": ("t4",)})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    assert m.state is W.JOINING
    [action] = m.on_join_result(join_result(2))  # the join result's watch fired first
    assert isinstance(action, WriteProposal) and action.proposal.generation == 2
    assert m.state is W.SYNCING and m.transitions[-1] == (W.JOINING, W.SYNCING)
    # the state written with it: no second read, no second proposal
    assert m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3"))) == []
    assert m.state is W.SYNCING


def test_a_proposal_the_worker_could_not_write_is_made_again_on_the_next_awaiting_sync():
    m = stable_member(assign=lambda name, join: {ME: ("t1", "t2"), "m2": ("t3",), "m3": ("t4",)})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    m.on_join_result(join_result(2))
    m.proposal_not_written(2)
    assert m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3"))) == [ReadJoinResult(2)]


def test_a_join_result_for_someone_else_another_generation_or_a_stale_epoch_changes_nothing():
    m = stable_member(assign=lambda name, join: {ME: ("t1",)})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    stale = JoinResult(**{**join_result(2).__dict__, "controller_epoch": EPOCH - 1})
    for result in (join_result(2, leader="m2"), join_result(3), stale):
        assert m.on_join_result(result) == []
        assert m.state is W.JOINING
    # and in Stable (not joining) a join result is no business of ours
    s = stable_member(assign=lambda name, join: {ME: ("t1",)})
    assert s.on_join_result(join_result(1)) == [] and s.state is W.STABLE


def test_the_leader_whose_proposal_moves_others_tasks_rejoins_as_soon_as_its_assignment_is_applied():
    """t3 moves from m2 to m3: m2 rejoins once it stopped t3, and the leader (nothing of its own revoked)
    starts the follow-up generation at once instead of waiting for m2's rejoin to announce it."""
    m = stable_member(assign=lambda name, join: {ME: ("t1", "t2"), "m2": (), "m3": ("t3", "t4")})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    [action] = m.on_join_result(join_result(2))
    assert action.proposal.revoked == {"m2": ("t3",)} and "m3" in action.proposal.assigned
    m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3")))
    actions = m.on_assignment(assignment(2, ["t1", "t2"]))
    assert actions[0] == SetDesired(frozenset({"t1", "t2"}))
    [request] = joins(actions)
    assert (request.join_generation, request.generation, request.owned) == (3, 2, ("t1", "t2"))
    assert m.state is W.JOINING
    assert m.on_owned(frozenset({"t1", "t2"})) == []  # once
    # the follow-up generation moves nothing more: its assignment starts no other
    m.on_group_state(info("AwaitingSync", 3, leader="m2", members=(ME, "m2", "m3")))
    assert joins(m.on_assignment(assignment(3, ["t1", "t2", "t3"]))) == []
    assert m.state is W.STABLE


def test_the_leader_with_revocations_of_its_own_rejoins_once_they_are_let_go():
    m = stable_member(assign=lambda name, join: {ME: ("t1", "t3"), "m2": ("t2",), "m3": ("t4",)})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    m.on_join_result(join_result(2))
    m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3")))
    assert m.on_assignment(assignment(2, ["t1"], revoked=["t2"])) == [SetDesired(frozenset({"t1"}))]
    assert m.on_owned(frozenset({"t1", "t2"})) == []
    [request] = joins(m.on_owned(frozenset({"t1"})))
    assert (request.join_generation, request.owned) == (3, ("t1",))


def test_a_leader_whose_proposal_moves_nothing_stays_stable():
    m = stable_member(assign=lambda name, join: {ME: ("t1", "t2"), "m2": ("t3",), "m3": ("t4",)})
    m.on_group_state(info("PreparingRebalance", 1, 2, leader=ME))
    [action] = m.on_join_result(join_result(2))
    assert action.proposal.revoked == {}
    m.on_group_state(info("AwaitingSync", 2, leader=ME, members=(ME, "m2", "m3")))
    assert m.on_assignment(assignment(2, ["t1", "t2"])) == [SetDesired(frozenset({"t1", "t2"}))]
    assert m.on_owned(frozenset({"t1", "t2"})) == [] and m.state is W.STABLE


def test_a_refusal_answered_at_the_generation_before_our_rejoin_makes_us_write_the_rejoin_again():
    """Our rejoin (for generation 3) was overwritten in our znode before the coordinator read it, by a request
    out of bounds: the coordinator answers INVALID_REPORT at the generation of the last good request it took
    (2). We write our rejoin again, else we would wait for a round the coordinator never heard of."""
    m = syncing_member()
    m.on_assignment(assignment(2, ["t1"], revoked=["t2"]))
    [rejoin] = joins(m.on_owned(frozenset({"t1"})))
    assert m.state is W.JOINING and rejoin.join_generation == 3
    [again] = joins(m.on_assignment(assignment(2, error=ProtocolError.INVALID_REPORT.name)))
    assert again.join_generation == 3 and again.owned == ("t1",) and m.state is W.JOINING
    assert m.last_error is ProtocolError.INVALID_REPORT
    # any other answer at that generation is stale
    assert m.on_assignment(assignment(2, error=ProtocolError.ILLEGAL_GENERATION.name)) == []
