"""A planned move handed to its receiver in the round that revokes it (``Assignment.handoff``): the coordinator
names the receiver of a pinned move and lists the task for no member, the receiver takes it as its own (its
owner znode decides when) and claims it in its next join, which the next generation's validation accepts."""

from __future__ import annotations

import dataclasses

from controller.protocol.group.member import SetDesired, WorkerState
from controller.protocol.group.rules import COOPERATIVE, EAGER, cooperative_adjust, validate_proposal
from controller.protocol.group.state import GroupState
from controller.protocol.records.group_messages import Assignment, SyncProposal
from tests.unit.protocol.group.test_coordinator import published, rejoin_all, req, stable_group
from tests.unit.protocol.group.test_member import info, joins, stable_member

#: after the move of t1 from a to b (a had t1, t3; b had t2, t4)
TARGET = {"a": ("t3",), "b": ("t1", "t2", "t4")}


def _move_t1(pin: bool = True, protocols=(COOPERATIVE, EAGER), **config):
    """A Stable group of a and b; t1 moves from a to b, pinned there (a reassign, a roll's step) or not, and
    announced to b (a roll's warm-up)."""
    c, clock, snapshot = stable_group(protocols=protocols)
    c.operations.incoming = {"b": ("t1",)}
    if config:
        c.config = dataclasses.replace(c.config, **config)
    if pin:
        c.on_reassign("t1", "b")
    else:
        c.on_rebalance_request("operator")
    rejoin_all(c, snapshot)
    assert c.state is GroupState.AWAITING_SYNC and c.join_result is not None
    assigned, revoked = cooperative_adjust(TARGET, {m.member_id: m.owned for m in c.join_result.members})
    proposal = SyncProposal(generation=c.generation, leader=c.join_result.leader, assigned=assigned, revoked=revoked)
    return c, snapshot, published(c.on_proposal(proposal))


def test_a_pinned_move_is_handed_to_its_receiver_in_the_round_that_revokes_it():
    c, snapshot, out = _move_t1()
    assert out["a"].revoked == ("t1",) and out["a"].handoff == ()
    assert out["b"].handoff == ("t1",) and out["b"].incoming == ()  # (to run now, no longer to prepare)
    # listed for no member of this generation: the coordinator's placement has it nowhere
    assert all("t1" not in a.assigned for a in out.values())
    assert all("t1" not in ts for ts in c.assignment.values())


def test_the_next_generation_takes_the_receivers_claim():
    """b lists t1 as owned (a let go before rejoining): the proposal giving it to b is valid, and hands off
    nothing any more."""
    c, snapshot, out = _move_t1()
    g = c.generation
    # a rejoins once it let go of t1; b, which may still be acquiring t1, lists it as owned
    snapshot["a"] = req("a", g + 1, gen=g, owned=("t3",))
    c.on_members(dict(snapshot))
    assert c.state is GroupState.PREPARING_REBALANCE
    snapshot["b"] = req("b", g + 1, gen=g, owned=("t1", "t2", "t4"))
    c.on_members(dict(snapshot))
    assert c.state is GroupState.AWAITING_SYNC and c.join_result is not None
    owned = {m.member_id: m.owned for m in c.join_result.members}
    assert owned == {"a": ("t3",), "b": ("t1", "t2", "t4")}
    assigned, revoked = cooperative_adjust(TARGET, owned)
    proposal = SyncProposal(generation=c.generation, leader=c.join_result.leader, assigned=assigned, revoked=revoked)
    assert validate_proposal(c.join_result, proposal) == []
    out = published(c.on_proposal(proposal))
    assert out["b"].assigned == ("t1", "t2", "t4") and out["b"].handoff == () and out["a"].revoked == ()


def test_an_unplanned_move_waits_for_the_next_round():
    _, _, out = _move_t1(pin=False)
    assert out["a"].revoked == ("t1",) and all(a.handoff == () for a in out.values())
    assert out["b"].incoming == ("t1",)  # still announced: b prepares it for the next round


def test_no_handoff_when_the_group_turns_it_off():
    """Per-broker identities: the receiver's right to the task comes only with its assignment."""
    _, _, out = _move_t1(handoff=False)
    assert out["a"].revoked == ("t1",) and all(a.handoff == () for a in out.values())


def test_no_handoff_under_eager():
    """Eager members revoke everything before they join: nothing is owned when the round revokes."""
    c, _, out = _move_t1(protocols=(EAGER,))
    assert c.protocol == EAGER and all(a.handoff == () for a in out.values())


# ---- the receiving member -------------------------------------------------------------------------------
def _handed(m, handoff=("t9",), protocol=COOPERATIVE):
    """Generation 2's assignment keeps the member's tasks and hands it ``handoff``."""
    actions = m.on_group_state(info("PreparingRebalance", 1, 2, protocol=protocol))
    if protocol == EAGER:  # (it stops everything first, and joins once that is done)
        actions = m.on_owned(frozenset())
    assert joins(actions)
    m.on_group_state(info("AwaitingSync", 2, protocol=protocol))
    a = Assignment(
        generation=2,
        controller_epoch=4,
        assigned=("t1", "t2"),
        protocol=protocol,
        leader="m2",
        handoff=tuple(handoff),
    )
    return m.on_assignment(a)


def test_the_receiver_takes_a_handed_off_task_and_claims_it_in_its_next_join():
    m = stable_member()
    assert _handed(m) == [SetDesired(frozenset({"t1", "t2", "t9"}))]
    assert m.state is WorkerState.STABLE
    # its owner znode not taken yet: the next join lists it all the same (the leader must not hand it on)
    request = joins(m.on_group_state(info("PreparingRebalance", 2, 3)))[0]
    assert "t9" in request.owned
    # the same assignment read again is applied already
    again = Assignment(generation=2, controller_epoch=4, assigned=("t1", "t2"), leader="m2", handoff=("t9",))
    assert m.on_assignment(again) == []


def test_a_leaving_member_takes_nothing_handed_to_it():
    m = stable_member()
    m.leaving = True
    assert _handed(m) == [SetDesired(frozenset({"t1", "t2"}))]


def test_an_eager_assignment_hands_nothing_off():
    m = stable_member(protocol=EAGER)
    assert _handed(m, protocol=EAGER) == [SetDesired(frozenset({"t1", "t2"}))]
