"""The group coordinator's scheduled rebalance delay and static membership, sans-IO: a departed member's tasks
are held (not reassigned) until the delay ends or the member returns under the same instance id, and the
holds, kept in the group state, survive a controller failover. Helpers come from ``test_coordinator``."""

from __future__ import annotations

import pytest

from controller.protocol.clock import FakeClock
from controller.protocol.group.rules import COOPERATIVE
from controller.protocol.group.vocabulary import WriteGroupState, WriteJoinResult
from controller.protocol.records.group_messages import Assignment
from tests.unit.protocol.group.test_coordinator import (
    EPOCH,
    S,
    coordinator,
    only,
    proposal_for,
    published,
    rejoin_all,
    req,
    stable_group,
    states,
    sync,
    tasks,
)

# --------------------------------------------------------------------------------------------------
# scheduled rebalance delay, static membership
# --------------------------------------------------------------------------------------------------


def test_delay_holds_a_departed_members_tasks_until_the_deadline():
    c, clock, snap = stable_group(delay=20)
    del snap["b"]
    decisions = c.on_members(dict(snap))  # no rebalance: b's tasks wait for it, and ZooKeeper keeps the hold
    assert states(decisions) == ["Stable"]
    (written,) = [d.info for d in decisions if isinstance(d, WriteGroupState)]
    assert [(h.instance, h.tasks) for h in written.held] == [("b", ("t2", "t4"))]
    assert c.state is S.STABLE and c.holds.tasks() == {"t2", "t4"}
    assert c.next_deadline() == pytest.approx(clock.now() + 20)
    clock.advance(19.9)
    assert c.on_tick() == []
    clock.advance(0.1)
    decisions = c.on_tick()
    assert states(decisions) == ["PreparingRebalance"] and c.reason == "scheduled rebalance delay expired"
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert join.held == ()
    assert published(sync(c))["a"].assigned == ("t1", "t2", "t3", "t4")


def test_held_tasks_are_kept_out_of_a_rebalance_during_the_delay():
    c, clock, snap = stable_group(delay=20)
    del snap["b"]
    c.on_members(dict(snap))
    c.on_tasks(tasks("t1", "t2", "t3", "t4", "t5"))
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert join.held == ("t2", "t4")
    # a proposal that takes the held tasks is refused; one that leaves them is published
    greedy = proposal_for(join, target={"a": ("t1", "t2", "t3", "t4", "t5")})
    assert c.on_proposal(greedy)[0].info.state == "PreparingRebalance"
    assert "held for a departed member" in c.reason
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert published(sync(c))["a"].assigned == ("t1", "t3", "t5")


def test_hold_expiring_while_awaiting_sync_rebalances_again():
    """Regression: the proposal in flight left the held tasks out; nothing else would ever place them."""
    c, clock, snap = stable_group(delay=5)
    del snap["b"]
    c.on_members(dict(snap))
    clock.advance(4)
    c.on_tasks(tasks("t1", "t2", "t3", "t4", "t5"))
    rejoin_all(c, snap)
    assert c.state is S.AWAITING_SYNC and c.join_result.held == ("t2", "t4")
    clock.advance(1)
    decisions = c.on_tick()
    assert states(decisions) == ["PreparingRebalance"]
    rejoin_all(c, snap)
    assert c.join_result.held == ()
    assert published(sync(c))["a"].assigned == ("t1", "t2", "t3", "t4", "t5")


def test_a_member_leaving_with_revocations_pending_is_not_held_silently():
    """Regression: tasks revoked from b (moving to c next round) wait for b's rejoin; if b dies first,
    holding b's kept tasks must not leave the revoked ones unplaced forever."""
    c, clock, snap = stable_group(delay=20)
    snap["c"] = req("c", 2)
    c.on_members(dict(snap))
    rejoin_all(c, snap)
    decisions = sync(c, target={"a": ("t1", "t3"), "b": ("t2",), "c": ("t4",)})
    assert published(decisions)["b"].revoked == ("t4",) and published(decisions)["c"].assigned == ()
    del snap["b"]  # b dies before it lets go of t4 and rejoins
    decisions = c.on_members(dict(snap))
    assert states(decisions) == ["PreparingRebalance"] and c.reason == "unplaced tasks after a departure"
    assert c.holds.tasks() == {"t2"}  # b's kept task still waits for it
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert join.held == ("t2",)
    assert published(sync(c, target={"a": ("t1", "t3"), "c": ("t4",)}))["c"].assigned == ("t4",)


def test_a_member_that_finished_its_controlled_shutdown_leaves_nothing_held():
    c, _, snap = stable_group(delay=20)
    snap["b"] = req("b", 1, gen=1, owned=c.assignment["b"], leaving=True)
    c.on_members(dict(snap))  # (rebalance for the shutdown)
    rejoin_all(c, snap)
    assert published(sync(c))["b"].assigned == ()
    del snap["b"]
    c.on_members(dict(snap))
    assert c.holds.tasks() == set()


def test_static_member_returns_inside_the_delay_without_a_rebalance():
    c, clock, snap = stable_group(
        members=("a", "b", "c"), task_ids=("t1", "t2", "t3", "t4", "t5", "t6"), delay=20, instance_ids=True
    )
    before = dict(c.assignment)
    rebalances = c.rebalances
    del snap["b"]
    assert states(c.on_members(dict(snap))) == ["Stable"]  # the hold, written
    clock.advance(10)
    # the process restarts as a new member id with the same instance id
    snap["b-2"] = req("b-2", 2, instance_id="i-b")
    decisions = c.on_members(dict(snap))
    assert states(decisions) == ["Stable"]
    assert published(decisions) == {
        "b-2": Assignment(generation=1, controller_epoch=EPOCH, assigned=before["b"], protocol=COOPERATIVE, leader="a")
    }
    assert c.rebalances == rebalances and c.generation == 1
    assert c.assignment["a"] == before["a"] and c.assignment["c"] == before["c"]
    assert set(c.generation_members) == {"a", "b-2", "c"} and c.holds.held == {}
    clock.advance(20)
    assert c.on_tick() == []  # nothing expires: the hold is gone


def test_static_member_after_the_delay_is_a_plain_join():
    c, clock, snap = stable_group(delay=20, instance_ids=True)
    del snap["b"]
    c.on_members(dict(snap))
    clock.advance(20)
    assert states(c.on_tick()) == ["PreparingRebalance"]
    snap["b-2"] = req("b-2", 2, instance_id="i-b")
    c.on_members(dict(snap))
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert join.held == () and {m.member_id for m in join.members} == {"a", "b-2"}


def test_a_static_members_answered_request_does_not_count_as_rejoining():
    """Regression: after a static return the member's request (written before it got its tasks back,
    so listing none) already names the next generation. Counted as a rejoin, the leader would hand the
    member's running tasks to someone else. The join waits for the member to rewrite it."""
    c, clock, snap = stable_group(members=("a", "b"), delay=20, instance_ids=True)
    del snap["b"]
    c.on_members(dict(snap))
    snap["b-2"] = req("b-2", 2, instance_id="i-b")
    c.on_members(dict(snap))
    assert c.assignment["b-2"] == ("t2", "t4")
    snap["c"] = req("c", 2)
    c.on_members(dict(snap))
    assert c.state is S.PREPARING_REBALANCE and c.join_generation == 2
    snap["a"] = req("a", 2, gen=1, owned=c.assignment["a"])
    assert c.on_members(dict(snap)) == []  # b-2's old request names generation 2, but it answered nothing
    snap["b-2"] = req("b-2", 2, gen=1, owned=("t2", "t4"), instance_id="i-b")
    join = only(WriteJoinResult, c.on_members(dict(snap))).result
    assert {m.member_id: m.owned for m in join.members}["b-2"] == ("t2", "t4")


def test_load_does_not_count_a_static_members_answered_request():
    c, clock, snap = stable_group(members=("a", "b"), delay=20, instance_ids=True)
    del snap["b"]
    c.on_members(dict(snap))
    decisions = c.on_members({**snap, "b-2": req("b-2", 2, instance_id="i-b")})
    snap["b-2"] = req("b-2", 2, instance_id="i-b")
    zk_assignments = {"a": Assignment(generation=1, controller_epoch=EPOCH, assigned=c.assignment["a"])}
    zk_assignments.update(published(decisions))
    # failover: a new controller loads what ZooKeeper holds
    new, _ = coordinator()
    new.controller_epoch = EPOCH + 1
    decisions = new.load(c.info(), dict(snap), dict(c.tasks), zk_assignments)
    assert states(decisions) == ["PreparingRebalance"] and new.join_generation == 2
    snap["a"] = req("a", 2, gen=1, owned=zk_assignments["a"].assigned)
    assert new.on_members(dict(snap)) == []
    snap["b-2"] = req("b-2", 2, gen=1, owned=("t2", "t4"), instance_id="i-b")
    join = only(WriteJoinResult, new.on_members(dict(snap))).result
    assert {m.member_id: m.owned for m in join.members} == {"a": ("t1", "t3"), "b-2": ("t2", "t4")}


def test_holds_survive_a_controller_failover_with_their_deadlines():
    """The scheduled delay's holds are in the group state: a new controller keeps the tasks out of the
    assignment until the original deadline (carried over on wall-clock time), or gives them back to the member."""
    c, clock, snap = stable_group(
        members=("a", "b", "c"), task_ids=("t1", "t2", "t3", "t4", "t5", "t6"), delay=20, instance_ids=True
    )
    wall = FakeClock(1_000.0)
    c.wall = wall
    del snap["b"]
    written = [d.info for d in c.on_members(dict(snap)) if isinstance(d, WriteGroupState)][-1]
    held = c.holds.tasks()
    assert held and [(h.instance, set(h.tasks), h.until) for h in written.held] == [("i-b", held, 1_020.0)]
    zk_assignments = {
        m: Assignment(generation=c.generation, controller_epoch=EPOCH, assigned=ts) for m, ts in c.assignment.items()
    }
    at_failover = dict(snap)
    wall.advance(5)  # the failover takes 5 s
    new, new_clock = coordinator(delay=20)
    new.controller_epoch, new.wall = EPOCH + 1, wall
    decisions = new.load(written, dict(snap), dict(c.tasks), zk_assignments)
    assert states(decisions) == ["Stable"] and new.reason == "controller failover: resumed"  # no rebalance
    assert new.holds.tasks() == held and new.next_deadline() == pytest.approx(new_clock.now() + 15)
    new_clock.advance(14.9)
    assert new.on_tick() == []
    new_clock.advance(0.1)
    assert states(new.on_tick()) == ["PreparingRebalance"] and new.reason == "scheduled rebalance delay expired"
    join = only(WriteJoinResult, rejoin_all(new, snap)).result
    assert join.held == ()

    # or the member comes back inside the delay: its tasks again, no rebalance
    again, _ = coordinator(delay=20)
    again.controller_epoch, again.wall = EPOCH + 1, wall
    assert states(again.load(written, dict(at_failover), dict(c.tasks), zk_assignments)) == ["Stable"]
    decisions = again.on_members({**at_failover, "b-2": req("b-2", 2, instance_id="i-b")})
    assert set(published(decisions)["b-2"].assigned) == held and again.holds.held == {}


def test_a_restored_hold_drops_members_back_and_tasks_gone():
    c, clock, snap = stable_group(members=("a", "b"), delay=20, instance_ids=True)
    c.wall = FakeClock(0.0)
    del snap["b"]
    written = [d.info for d in c.on_members(dict(snap)) if isinstance(d, WriteGroupState)][-1]
    tasks = dict(c.tasks)
    gone = sorted(c.holds.tasks())[0]
    del tasks[gone]
    new, _ = coordinator(delay=20)
    new.wall = c.wall
    new.load(written, dict(snap), tasks, {})
    assert new.holds.tasks() == c.holds.tasks() - {gone}
    back, _ = coordinator(delay=20)
    back.wall = c.wall
    back.load(written, {**snap, "b-2": req("b-2", 1, instance_id="i-b")}, dict(c.tasks), {})
    assert back.holds.held == {}  # its member is back: nothing to hold for
