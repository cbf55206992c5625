"""The group coordinator, sans-IO: its behaviour, driven with a FakeClock and hand-built join requests, reading
only the decisions it returns; it refuses every move its state machine does (the table itself: ``test_state``).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import product

import pytest

from controller.protocol.clock import FakeClock
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.rules import COOPERATIVE, EAGER, cooperative_adjust, run_assignor
from controller.protocol.group.state import GroupState, IllegalTransition
from controller.protocol.group.vocabulary import (
    DeleteGenerationsBelow,
    GroupConfig,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.records.group_messages import Assignment, JoinRequest, JoinResult, SyncProposal, TaskDescriptor
from tests.unit.protocol.group.test_state import LEGAL

S = GroupState
EPOCH = 3
BOTH = (COOPERATIVE, EAGER)


# --------------------------------------------------------------------------------------------------
# the state machine, as the coordinator enforces it
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("current, target", sorted(set(product(GroupState, GroupState)) - LEGAL), ids=lambda s: s.value)
def test_the_coordinator_refuses_illegal_moves_loudly(current, target):
    c, _ = coordinator()
    c.machine.restore(current)
    with pytest.raises(IllegalTransition):
        c.transition(target)
    assert c.state is current


# --------------------------------------------------------------------------------------------------
# helpers: hand-built requests, a leader that proposes, snapshots as ZooKeeper would hold them
# --------------------------------------------------------------------------------------------------


def coordinator(delay: float = 0.0, timeout: float = 30.0) -> tuple[GroupCoordinator, FakeClock]:
    clock = FakeClock(1000.0)
    config = GroupConfig(rebalance_timeout_s=timeout, scheduled_rebalance_delay_s=delay, default_assignor="sticky")
    return GroupCoordinator(group="g", controller_epoch=EPOCH, clock=clock, config=config), clock


def req(
    m: str,
    jg: int,
    gen: int = -1,
    owned: Iterable[str] = (),
    protocols=BOTH,
    assignors=("sticky",),
    instance_id: str | None = None,
    leaving: bool = False,
) -> JoinRequest:
    return JoinRequest(
        member_id=m,
        join_generation=jg,
        generation=gen,
        protocols=tuple(protocols),
        assignors=tuple(assignors),
        owned=tuple(sorted(owned)),
        instance_id=instance_id,
        leaving=leaving,
    )


def tasks(*ids: str) -> dict[str, TaskDescriptor]:
    return {t: TaskDescriptor(task_id=t) for t in ids}


def states(decisions) -> list[str]:
    return [d.info.state for d in decisions if isinstance(d, WriteGroupState)]


def only(kind, decisions):
    found = [d for d in decisions if isinstance(d, kind)]
    assert len(found) == 1, decisions
    return found[0]


def published(decisions) -> dict[str, Assignment]:
    return {m: a for d in decisions if isinstance(d, WriteAssignments) for m, a in d.assignments}


def round_robin(join: JoinResult) -> dict[str, tuple[str, ...]]:
    """A simple, known target: unheld tasks dealt to non-leaving members in name order."""
    eligible = sorted(m.member_id for m in join.members if not m.leaving)
    out: dict[str, list[str]] = {m.member_id: [] for m in join.members}
    for i, t in enumerate(sorted(t.task_id for t in join.tasks if t.task_id not in join.held)):
        out[eligible[i % len(eligible)]].append(t)
    return {m: tuple(ts) for m, ts in out.items()}


def proposal_for(join: JoinResult, target=None, leader: str | None = None, adjust: bool = True) -> SyncProposal:
    target = round_robin(join) if target is None else target
    if adjust:
        assigned, revoked = cooperative_adjust(target, {m.member_id: m.owned for m in join.members})
    else:
        assigned, revoked = dict(target), {}
    return SyncProposal(generation=join.generation, leader=leader or join.leader, assigned=assigned, revoked=revoked)


def sync(c: GroupCoordinator, target=None) -> list:
    assert c.state is S.AWAITING_SYNC and c.join_result is not None
    return c.on_proposal(proposal_for(c.join_result, target))


def rejoin_all(c: GroupCoordinator, snapshot: dict[str, JoinRequest], except_: Iterable[str] = ()) -> list:
    """Every member (but ``except_``) rewrites its request for the join generation, listing what it owns."""
    for m, r in list(snapshot.items()):
        if m in except_:
            continue
        snapshot[m] = req(
            m,
            c.join_generation,
            gen=c.generation,
            owned=c.assignment.get(m, ()),
            protocols=r.protocols,
            assignors=r.assignors,
            instance_id=r.instance_id,
            leaving=r.leaving,
        )
    return c.on_members(dict(snapshot))


def stable_group(
    members=("a", "b"), task_ids=("t1", "t2", "t3", "t4"), delay=0.0, timeout=30.0, instance_ids=False, protocols=BOTH
):
    """A group at generation 1, Stable, tasks dealt round-robin: a gets t1,t3; b gets t2,t4."""
    c, clock = coordinator(delay, timeout)
    assert c.on_tasks(tasks(*task_ids)) == []  # no members yet: nothing to do
    snapshot = {m: req(m, 1, protocols=protocols, instance_id=f"i-{m}" if instance_ids else None) for m in members}
    decisions = c.on_members(dict(snapshot))
    assert states(decisions) == ["PreparingRebalance", "AwaitingSync"]
    decisions = sync(c)
    assert c.state is S.STABLE and c.generation == 1
    for m in published(decisions):
        snapshot[m] = req(m, 1, gen=-1, protocols=protocols, instance_id=snapshot[m].instance_id)
    return c, clock, snapshot


# --------------------------------------------------------------------------------------------------
# join phase
# --------------------------------------------------------------------------------------------------


def test_the_join_round_reads_a_change_of_members_and_the_coordinator_alone_takes_it():
    """The join round returns what a departure means (who left, the rebalance it needs) and writes nothing of
    the coordinator's: its generation members and placement change only once the coordinator takes it."""
    c, _, snapshot = stable_group()
    before = (c.generation_members, dict(c.assignment), c.reason, c.state)
    old, c.members = dict(c.members), {"a": snapshot["a"]}  # (as ``on_members`` takes the snapshot)
    taken = c.join.take_members(old)
    assert taken.left == ("b",) and taken.need == "member b left" and taken.returned == ()
    assert (c.generation_members, c.assignment, c.reason, c.state) == before
    c.take_members(taken)
    assert c.generation_members == ("a",) and set(c.assignment) == {"a"}


def test_first_members_form_generation_one():
    c, _ = coordinator()
    c.on_tasks(tasks("t1", "t2"))
    decisions = c.on_members({"b": req("b", 1), "a": req("a", 1)})
    assert states(decisions) == ["PreparingRebalance", "AwaitingSync"]
    join = only(WriteJoinResult, decisions).result
    assert (join.generation, join.leader, join.protocol, join.assignor) == (1, "a", COOPERATIVE, "sticky")
    assert join.controller_epoch == EPOCH
    assert [m.member_id for m in join.members] == ["a", "b"]
    assert only(WatchSync, decisions).generation == 1
    assert c.rebalances == 1


def test_join_waits_for_every_live_member_then_bumps_the_generation():
    c, clock, snap = stable_group(members=("a", "b", "c"))
    assert states(c.on_tasks(tasks("t1", "t2", "t3", "t4", "t5"))) == ["PreparingRebalance"]
    assert (c.generation, c.join_generation) == (1, 2)
    snap["b"] = req("b", 2, gen=1, owned=c.assignment["b"])
    assert c.on_members(dict(snap)) == []  # a and c have not rejoined
    snap["c"] = req("c", 2, gen=1, owned=c.assignment["c"])
    assert c.on_members(dict(snap)) == []
    assert c.state is S.PREPARING_REBALANCE and c.generation == 1
    snap["a"] = req("a", 2, gen=1, owned=c.assignment["a"])
    decisions = c.on_members(dict(snap))
    join = only(WriteJoinResult, decisions).result
    assert c.state is S.AWAITING_SYNC and c.generation == join.generation == 2
    assert join.leader == "a"  # the previous leader stays leader when it rejoined
    assert {m.member_id: m.owned for m in join.members} == {"a": ("t1", "t4"), "b": ("t2",), "c": ("t3",)}
    assert join.previous == {"a": ("t1", "t4"), "b": ("t2",), "c": ("t3",)}
    assert [t.task_id for t in join.tasks] == ["t1", "t2", "t3", "t4", "t5"]


def test_leader_protocol_and_assignor_choice():
    c, _ = coordinator()
    c.on_tasks(tasks("t1"))
    decisions = c.on_members(
        {
            "b": req("b", 1, protocols=(EAGER, COOPERATIVE), assignors=("range", "sticky")),
            "c": req("c", 1, protocols=(EAGER, COOPERATIVE), assignors=("range",)),
            "a": req("a", 1, protocols=(COOPERATIVE, EAGER), assignors=("sticky", "range")),
        }
    )
    join = only(WriteJoinResult, decisions).result
    # two of three prefer eager, all list range
    assert (join.leader, join.protocol, join.assignor) == ("a", EAGER, "range")
    info = [d.info for d in decisions if isinstance(d, WriteGroupState)][-1]
    assert (info.state, info.protocol, info.assignor, info.leader, info.members) == (
        "AwaitingSync",
        EAGER,
        "range",
        "a",
        ("a", "b", "c"),
    )


def test_a_new_leader_is_picked_when_the_old_one_leaves_and_then_kept():
    c, _, snap = stable_group(members=("a", "b", "c"))
    del snap["a"]
    c.on_members(dict(snap))
    decisions = rejoin_all(c, snap)
    assert only(WriteJoinResult, decisions).result.leader == "b"
    sync(c)
    snap["a"] = req("a", 3)  # back: the lowest id, but b leads on
    c.on_members(dict(snap))
    assert only(WriteJoinResult, rejoin_all(c, snap)).result.leader == "b"


def test_a_join_in_awaiting_sync_sends_the_group_back_to_preparing_rebalance():
    c, _, snap = stable_group()
    c.on_rebalance_request("operator")
    rejoin_all(c, snap)
    assert c.state is S.AWAITING_SYNC and c.generation == 2
    stale_join = c.join_result
    snap["c"] = req("c", 3)
    decisions = c.on_members(dict(snap))
    assert states(decisions) == ["PreparingRebalance"]
    assert (c.generation, c.join_generation) == (2, 3)
    assert "member c joined" in c.reason
    # the leader's proposal for the abandoned generation arrives late: ignored
    assert c.on_proposal(proposal_for(stale_join)) == []
    assert c.state is S.PREPARING_REBALANCE


def test_rewriting_a_request_for_the_current_generation_in_awaiting_sync_is_no_rejoin():
    c, _, snap = stable_group()
    c.on_rebalance_request()
    rejoin_all(c, snap)
    snap["b"] = req("b", 2, gen=1, owned=("t2", "t4", "t9"))  # same join generation, new owned list
    assert c.on_members(dict(snap)) == []
    assert c.state is S.AWAITING_SYNC


def test_a_member_rejoining_for_a_later_generation_while_stable_triggers_a_rebalance():
    """Cooperative follow-up: a member that let go of revoked tasks rejoins; a second round places them."""
    c, _, snap = stable_group()
    snap["b"] = req("b", 2, gen=1, owned=("t2", "t4"))
    assert states(c.on_members(dict(snap))) == ["PreparingRebalance"]
    assert c.reason == "member b rejoined"


def test_unchanged_snapshot_changes_nothing():
    c, _, snap = stable_group()
    assert c.on_members(dict(snap)) == []
    assert c.on_tasks(dict(c.tasks)) == []
    assert c.state is S.STABLE and c.rebalances == 1


# --------------------------------------------------------------------------------------------------
# sync phase: proposals
# --------------------------------------------------------------------------------------------------


def test_a_valid_proposal_is_published_and_the_group_is_stable():
    c, _, snap = stable_group()
    c.on_tasks(tasks("t1", "t2", "t3", "t4", "t5"))
    rejoin_all(c, snap)
    decisions = sync(c)
    assert states(decisions) == ["Stable"]
    a = published(decisions)
    assert set(a) == {"a", "b"}
    assert a["a"] == Assignment(
        generation=2,
        controller_epoch=EPOCH,
        assigned=("t1", "t3", "t5"),
        protocol=COOPERATIVE,
        leader="a",
        follow_up=False,
    )  # nothing revoked
    assert only(DeleteGenerationsBelow, decisions).generation == 2
    assert c.join.sync_deadline is None and c.join_result is None


@pytest.mark.parametrize("when", ["stale generation", "not awaiting sync"])
def test_proposals_from_a_stale_generation_are_ignored(when):
    c, _, snap = stable_group()
    old_join_generation = 1
    if when == "stale generation":
        c.on_rebalance_request()
        rejoin_all(c, snap)
        assert c.state is S.AWAITING_SYNC and c.generation == 2
    before = (c.state, c.generation, dict(c.assignment))
    stale = SyncProposal(generation=old_join_generation, leader="a", assigned={"a": ("t1", "t2", "t3", "t4"), "b": ()})
    assert c.on_proposal(stale) == []  # ILLEGAL_GENERATION: no decision at all
    assert (c.state, c.generation, dict(c.assignment)) == before


def test_an_invalid_proposal_is_refused_and_triggers_a_new_rebalance():
    c, _, snap = stable_group()
    c.on_rebalance_request()
    rejoin_all(c, snap)
    join = c.join_result
    # a leader that skips the cooperative adjustment hands b's t2 to a while b still owns it
    bad = proposal_for(join, target={"a": ("t1", "t2", "t3"), "b": ("t4",)}, adjust=False)
    decisions = c.on_proposal(bad)
    assert states(decisions) == ["PreparingRebalance"]
    assert not published(decisions)
    assert c.reason.startswith("INVALID_ASSIGNMENT") and "still owns" in c.reason
    assert (c.generation, c.join_generation, c.rebalances) == (2, 3, 3)
    # the same proposal arriving again (now stale) is ignored
    assert c.on_proposal(bad) == []


def test_a_proposal_not_from_the_leader_is_refused():
    c, _, snap = stable_group()
    c.on_rebalance_request()
    rejoin_all(c, snap)
    decisions = c.on_proposal(proposal_for(c.join_result, leader="b"))
    assert states(decisions) == ["PreparingRebalance"] and "not the leader" in c.reason


def test_the_leader_not_syncing_in_time_restarts_the_rebalance():
    c, clock, snap = stable_group(timeout=10)
    c.on_rebalance_request()
    rejoin_all(c, snap)
    assert c.next_deadline() == pytest.approx(clock.now() + 10)
    clock.advance(9.9)
    assert c.on_tick() == []
    clock.advance(0.1)
    assert states(c.on_tick()) == ["PreparingRebalance"]
    assert c.reason == "REBALANCE_TIMEOUT: leader a did not sync"


# --------------------------------------------------------------------------------------------------
# join timeout, incompatible members
# --------------------------------------------------------------------------------------------------


def test_join_timeout_excludes_laggards_with_rebalance_timeout():
    c, clock, snap = stable_group(members=("a", "b", "c"), timeout=10)
    c.on_rebalance_request()
    assert c.next_deadline() == pytest.approx(clock.now() + 10)
    rejoin_all(c, snap, except_=("c",))
    assert c.state is S.PREPARING_REBALANCE
    clock.advance(9.99)
    assert c.on_tick() == []
    clock.advance(0.01)
    decisions = c.on_tick()
    join = only(WriteJoinResult, decisions).result
    assert [m.member_id for m in join.members] == ["a", "b"]
    errors = published(decisions)
    assert errors == {
        "c": Assignment(
            generation=2, controller_epoch=EPOCH, error="REBALANCE_TIMEOUT", protocol=COOPERATIVE, leader="a"
        )
    }
    assert c.generation_members == ("a", "b") and c.state is S.AWAITING_SYNC
    # the laggard's task goes to the others at once (its owner is no member of the generation)
    published_now = published(sync(c, target={"a": ("t1", "t3", "t4"), "b": ("t2",)}))
    assert set(published_now) == {"a", "b"}
    assert published_now["a"].assigned == ("t1", "t3", "t4")


def test_join_timeout_with_nobody_rejoined_waits_again():
    c, clock, snap = stable_group(timeout=10)
    c.on_rebalance_request()
    clock.advance(10)
    decisions = c.on_tick()
    assert states(decisions) == ["PreparingRebalance"] and not published(decisions)
    assert c.join.deadline == pytest.approx(clock.now() + 10)
    assert c.reason == "no member rejoined in time; waiting again"


def test_inconsistent_protocol_excludes_the_member_without_a_rebalance_storm():
    c, _ = coordinator()
    c.on_tasks(tasks("t1", "t2"))
    snap = {
        "a": req("a", 1, protocols=(COOPERATIVE,)),
        "b": req("b", 1, protocols=(COOPERATIVE,)),
        "x": req("x", 1, protocols=(EAGER,)),
    }
    decisions = c.on_members(dict(snap))
    join = only(WriteJoinResult, decisions).result
    assert join.protocol == COOPERATIVE and [m.member_id for m in join.members] == ["a", "b"]
    assert published(decisions)["x"].error == "INCONSISTENT_PROTOCOL"
    sync(c)
    assert c.state is S.STABLE and c.rebalances == 1
    # x rewrites the same incompatible request (say, retrying): answered already, no new rebalance
    snap["x"] = req("x", 2, gen=-1, protocols=(EAGER,))
    assert c.on_members(dict(snap)) == []
    snap["x"] = req("x", 3, gen=-1, protocols=(EAGER,))
    assert c.on_members(dict(snap)) == []
    assert c.state is S.STABLE and c.rebalances == 1
    # upgraded, it is welcome
    snap["x"] = req("x", 2, gen=-1, protocols=(COOPERATIVE, EAGER))
    assert states(c.on_members(dict(snap))) == ["PreparingRebalance"]


def test_eager_to_cooperative_upgrade():
    """Rolling upgrade: eager while any eager-only member is present, cooperative once all support it."""
    c, _, snap = stable_group(members=("a", "b", "c"), protocols=(EAGER,))
    assert c.protocol == EAGER
    upgraded = {}
    for m in ("a", "b", "c"):
        # member m restarts with the new software: leaves, comes back supporting both
        del snap[m]
        c.on_members(dict(snap))
        snap[m] = req(m, c.join_generation, protocols=(COOPERATIVE, EAGER))
        c.on_members(dict(snap))
        decisions = rejoin_all(c, snap)
        upgraded[m] = only(WriteJoinResult, decisions).result.protocol
        sync(c)
        assert c.info().protocol == upgraded[m]
        for mm in snap:  # requests as the members would leave them after their assignment
            snap[mm] = req(mm, c.generation, gen=c.generation, owned=c.assignment[mm], protocols=snap[mm].protocols)
    assert upgraded == {"a": EAGER, "b": EAGER, "c": COOPERATIVE}
    assert published(sync_after_rebalance(c, snap))["a"].protocol == COOPERATIVE


def sync_after_rebalance(c, snap):
    c.on_rebalance_request()
    rejoin_all(c, snap)
    return sync(c)


# --------------------------------------------------------------------------------------------------
# controlled shutdown, reassignment, manual rebalance
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["admin request", "member's own request"])
def test_controlled_shutdown(how):
    c, _, snap = stable_group(members=("a", "b", "c"), task_ids=("t1", "t2", "t3", "t4", "t5", "t6"))
    if how == "admin request":
        decisions = c.on_controlled_shutdown("b")
        assert c.on_controlled_shutdown("b") == []  # once is enough
    else:
        snap["b"] = req("b", 1, gen=1, owned=c.assignment["b"], leaving=True)
        decisions = c.on_members(dict(snap))
    assert states(decisions) == ["PreparingRebalance"] and c.reason == "controlled shutdown of b"
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert {m.member_id: m.leaving for m in join.members} == {"a": False, "b": True, "c": False}
    target = run_assignor(join.assignor, join)
    assert target["b"] == ()
    assert sorted(target["a"] + target["c"]) == ["t1", "t2", "t3", "t4", "t5", "t6"]
    a = published(c.on_proposal(proposal_for(join, target)))
    assert a["b"].assigned == () and set(a["b"].revoked) == {"t2", "t5"}
    # a proposal that keeps tasks on the leaving member would have been refused
    assert c.on_controlled_shutdown("zz") == []


def test_a_leaving_member_cannot_be_given_tasks():
    c, _, snap = stable_group()
    c.on_controlled_shutdown("b")
    rejoin_all(c, snap)
    decisions = c.on_proposal(proposal_for(c.join_result, target={"a": ("t1", "t3"), "b": ("t2", "t4")}))
    assert states(decisions) == ["PreparingRebalance"] and "leaving member 'b'" in c.reason


def test_reassign_pins_the_task_to_the_member_for_the_next_generation():
    c, _, snap = stable_group()
    assert c.on_reassign("t9", "a") == [] and c.on_reassign("t1", "zz") == []
    assert states(c.on_reassign("t1", "b")) == ["PreparingRebalance"]
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    t1 = next(t for t in join.tasks if t.task_id == "t1")
    assert (t1.pinned, t1.pin_mode) == (("b",), "required")


def test_manual_rebalance():
    c, _, snap = stable_group()
    assert states(c.on_rebalance_request("operator asked")) == ["PreparingRebalance"]
    assert c.reason == "operator asked"
    empty, _ = coordinator()
    assert empty.on_rebalance_request() == []


# --------------------------------------------------------------------------------------------------
# tasks, members leaving, Empty, Dead
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", ["created", "deleted", "paused (gone from the runnable set)", "reconfigured"])
def test_task_changes_trigger_a_rebalance(change):
    c, _, snap = stable_group()
    now = dict(c.tasks)
    if change == "created":
        now["t5"] = TaskDescriptor("t5")
    elif change == "reconfigured":
        now["t1"] = TaskDescriptor("t1", weight=5)
    else:
        del now["t2"]
    decisions = c.on_tasks(now)
    assert states(decisions) == ["PreparingRebalance"] and c.reason == "tasks changed"
    join = only(WriteJoinResult, rejoin_all(c, snap)).result
    assert {t.task_id: t for t in join.tasks} == now


def test_task_changes_with_no_members_are_only_recorded():
    c, _ = coordinator()
    assert c.on_tasks(tasks("t1")) == [] and c.state is S.EMPTY and set(c.tasks) == {"t1"}


@pytest.mark.parametrize("phase", ["Stable", "PreparingRebalance", "AwaitingSync"])
def test_all_members_leaving_empties_the_group(phase):
    c, _, snap = stable_group()
    if phase != "Stable":
        c.on_rebalance_request()
    if phase == "AwaitingSync":
        rejoin_all(c, snap)
    generation = c.generation
    decisions = c.on_members({})
    assert states(decisions)[-1] == "Empty"
    info = c.info()
    assert (info.state, info.members, info.leader) == ("Empty", (), None)
    assert c.generation >= generation and c.next_deadline() is None
    # a new member starts the next generation: generations never go back
    decisions = c.on_members({"z": req("z", c.generation + 1)})
    assert only(WriteJoinResult, decisions).result.generation == c.generation > generation


def test_shutdown_is_dead_and_decides_nothing_more():
    c, _, snap = stable_group()
    c.machine.end()
    assert c.state is S.DEAD
    assert c.on_rebalance_request() == []
    with pytest.raises(IllegalTransition):
        c.transition(S.PREPARING_REBALANCE)


# --------------------------------------------------------------------------------------------------
# a refused request, maintenance mode begun during a round
# --------------------------------------------------------------------------------------------------


def test_a_refused_request_in_a_join_round_is_answered_once_at_the_generation_its_member_joined():
    """The IO layer refused b's request (out of bounds) and kept its last good one: b is answered
    INVALID_REPORT at the generation it joined, the group is not disturbed (its assignment stands), the same
    refusal is not answered again, and once b's request is taken again a new refusal is answered."""
    c, _, snapshot = stable_group()
    before = dict(c.assignment)
    decisions = c.refuse_report("b", "capacity 0 is not within 1-1000000", snapshot["b"])
    answer = published(decisions)
    assert list(answer) == ["b"] and answer["b"].error == "INVALID_REPORT" and answer["b"].generation == 1
    assert not answer["b"].assigned and c.assignment == before and c.state is S.STABLE
    assert not [d for d in decisions if isinstance(d, WriteGroupState)]
    c.set_ignored({"b": "refused: capacity 0 is not within 1-1000000"})
    assert c.refuse_report("b", "capacity 0 is not within 1-1000000", snapshot["b"]) == []
    c.set_ignored({})  # b wrote a good request
    assert published(c.refuse_report("b", "capacity 0 is not within 1-1000000", snapshot["b"]))["b"].error
    assert c.refuse_report("ghost", "garbage", snapshot["b"]) == []  # no member the coordinator knows


@pytest.mark.parametrize("when", ["preparing", "awaiting sync"])
def test_maintenance_begun_during_a_round_holds_the_tasks_of_a_member_lost_in_it(when):
    """b leaves, and maintenance mode begins before the round its departure started is over: b's tasks wait
    for b (held without a deadline) instead of being deferred to the window's end, and when b comes back it gets
    them at once, nobody else disturbed. Begun once the join result is out (AwaitingSync), the round runs again
    without them."""
    c, _, snapshot = stable_group()
    b_tasks = c.assignment["b"]
    del snapshot["b"]
    c.on_members(dict(snapshot))
    assert c.state is S.PREPARING_REBALANCE
    if when == "awaiting sync":
        rejoin_all(c, snapshot)
        assert c.state is S.AWAITING_SYNC
    decisions = c.on_maintenance(True)
    assert [h.tasks for h in c.holds.info() if h.until is None] == [b_tasks]
    assert any(isinstance(d, WriteGroupState) and d.info.held for d in decisions)
    if when == "awaiting sync":
        assert c.state is S.PREPARING_REBALANCE, "the round runs again without b's tasks"
    rejoin_all(c, snapshot)
    assert c.join_result is not None and set(b_tasks) <= set(c.join_result.held)
    sync(c)
    assert c.state is S.STABLE and c.assignment == {"a": ("t1", "t3")} and not c.operations.deferred
    snapshot["b"] = req("b", c.generation + 1)
    back = published(c.on_members(dict(snapshot)))
    assert back["b"].assigned == b_tasks and back["b"].generation == c.generation and not c.holds.held
