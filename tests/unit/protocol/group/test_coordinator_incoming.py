"""The coordinator publishing the roll's announcement: to the receiver alone, withdrawn when the roll ends, and
carried by a join round's assignment."""

from __future__ import annotations

from controller.protocol.group.rules import COOPERATIVE
from controller.protocol.group.state import GroupState
from controller.protocol.records.group_messages import Assignment
from tests.unit.protocol.group.test_reconcile import ack, coordinator, published, report, req


def _stable_pair():
    """A reconciling group of two members, 4 tasks, Stable."""
    c = coordinator(4)
    c.on_members({"a": req("a")})
    ack(c)
    c.on_members({"a": c.members["a"], "b": req("b")})
    _settle(c)
    return c


def _settle(c, limit: int = 10) -> dict[str, Assignment]:
    """Every member reports what it was last published until the group is Stable; the assignments published
    on the way (the last one per member)."""
    out: dict[str, Assignment] = {}
    for _ in range(limit):
        if c.state is GroupState.STABLE:
            return out
        for m in sorted(c.members):
            out.update(published(report(c, m)))
    assert c.state is GroupState.STABLE
    return out


def test_reconcile_publishes_the_announcement_to_the_receiver_alone():
    c = _stable_pair()
    moving = c.assignment["b"][:1]
    out = published(c.on_roll_incoming({"a": moving}))
    assert set(out) == {"a"} and out["a"].incoming == moving and out["a"].assigned == c.assignment["a"]
    report(c, "a")
    assert c.state is GroupState.STABLE
    assert published(c.on_roll_incoming({"a": moving})) == {}  # nothing new: nobody written to
    # the task moves: once it is assigned to the receiver, it is no longer announced
    c.on_roll_placement({moving[0]: "a"}, "roll")
    out = _settle(c)
    assert moving[0] in c.assignment["a"] and out["a"].incoming == ()


def test_reconcile_withdraws_an_announcement_when_the_roll_ends():
    c = _stable_pair()
    moving = c.assignment["b"][:2]
    assert published(c.on_roll_incoming({"a": moving}))["a"].incoming == moving
    report(c, "a")
    out = published(c.end_roll())
    assert set(out) == {"a"} and out["a"].incoming == () and out["a"].assigned == c.assignment["a"]
    assert c.end_roll() == []  # (nothing announced any more)


def test_a_join_round_assignment_carries_the_announcement():
    from controller.protocol.records.group_messages import SyncProposal
    from tests.unit.protocol.group.test_reconcile import req as _req

    c = coordinator(4)
    c.on_tasks(c.tasks)
    r = {m: _req(m, protocols=(COOPERATIVE,)) for m in ("a", "b")}
    c.on_members(r)
    c.operations.incoming = {"a": ("t3",)}
    gen = c.generation
    proposal = SyncProposal(generation=gen, leader=c.leader or "a", assigned={"a": ("t0", "t1"), "b": ("t2", "t3")})
    out = published(c.on_proposal(proposal))
    assert out["a"].incoming == ("t3",) and out["b"].incoming == ()
