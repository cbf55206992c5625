"""The reconcile protocol's coordinator, sans-IO: driven with a FakeClock and hand-built member requests
(the reports members write), reading only the decisions it returns. What it must never do: hand a task to a
member while another may still run it."""

from __future__ import annotations

import dataclasses

from controller.protocol.clock import FakeClock
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.reconcile import confirm_releases, holders
from controller.protocol.group.rules import COOPERATIVE, EAGER, RECONCILE
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import FOREVER, GroupConfig, WatchMoves, WriteAssignments, WriteGroupState
from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import Assignment, JoinRequest, TaskDescriptor

EPOCH = 5
RECONCILING = (RECONCILE, COOPERATIVE)


def req(
    m: str,
    generation: int = -1,
    owned: tuple[str, ...] = (),
    join_generation: int = 1,
    protocols: tuple[str, ...] = RECONCILING,
    leaving: bool = False,
    incarnation: str | None = None,
    instance_id: str | None = None,
    acknowledges: bool = True,
    starting: tuple[str, ...] = (),
) -> JoinRequest:
    return JoinRequest(
        member_id=m,
        join_generation=join_generation,
        generation=generation,
        protocols=protocols,
        assignors=("sticky",),
        owned=owned,
        leaving=leaving,
        incarnation=incarnation or f"{m}.1",
        instance_id=instance_id,
        acknowledges=acknowledges,
        starting=starting,
    )


def tasks(n: int) -> dict[str, TaskDescriptor]:
    return {f"t{i}": TaskDescriptor(task_id=f"t{i}") for i in range(n)}


def published(decisions) -> dict[str, Assignment]:
    out: dict[str, Assignment] = {}
    for d in decisions:
        if isinstance(d, WriteAssignments):
            out.update(dict(d.assignments))
    return out


def states(decisions) -> list[str]:
    return [d.info.state for d in decisions if isinstance(d, WriteGroupState)]


def coordinator(n_tasks: int = 6, **config) -> GroupCoordinator:
    config.setdefault("initial_delay_s", 0.0)  # (the forming window has a test of its own)
    c = GroupCoordinator(group="g", controller_epoch=EPOCH, clock=FakeClock(), config=GroupConfig(**config))
    c.on_tasks(tasks(n_tasks))
    return c


def report(c: GroupCoordinator, m: str, owned: tuple[str, ...] | None = None, **kw) -> list:
    """Member ``m`` reports at its current member epoch, owning what it was last published (or ``owned``)."""
    a = c.assignment[m]
    members = dict(c.members)
    members[m] = req(
        m,
        generation=c.reconcile.acks.epoch_of(m),
        owned=a if owned is None else owned,
        incarnation=c.members[m].incarnation,
        **kw,
    )
    return c.on_members(members)


def ack(c: GroupCoordinator) -> list:
    """Every member acknowledges its assignment: a report at its member epoch listing what it runs."""
    members = {
        m: req(m, generation=c.reconcile.acks.epoch_of(m), owned=c.assignment.get(m, ()), incarnation=r.incarnation)
        for m, r in c.members.items()
    }
    return c.on_members(members)


def one_member(n_tasks: int = 6) -> tuple[GroupCoordinator, list]:
    c = coordinator(n_tasks)
    c.on_members({"a": req("a")})
    return c, c.on_members({"a": req("a")})


def test_a_group_whose_members_all_offer_reconcile_enters_it_without_a_sync_phase():
    c = coordinator()
    decisions = c.on_members({"a": req("a")})
    a = published(decisions)["a"]
    assert a.protocol == RECONCILE and a.assigned == tuple(sorted(tasks(6))) and a.incarnation == "a.1"
    assert c.protocol == RECONCILE and c.leader is None and c.join_result is None
    # Stable means running: not before the member acknowledged its assignment
    assert c.state is GroupState.RECONCILING and states(decisions)[-1] == "Reconciling"
    assert c.info().unacked == ("a",)
    decisions = ack(c)
    assert c.state is GroupState.STABLE and states(decisions)[-1] == "Stable" and c.info().unacked == ()


def test_the_reconcile_part_returns_what_changed_and_the_coordinator_alone_takes_it():
    """A reconcile call works on a draft of the group's record and returns it: the coordinator's generation,
    placement, reason, state and count of rebalances stay as they were until the coordinator takes the
    result, and then are exactly what it says."""
    c = coordinator()
    c.on_members({"a": req("a")})
    ack(c)
    before = (c.generation, dict(c.assignment), c.reason, c.state, c.rebalances)
    c.members["b"] = req("b")  # (as ``on_members`` takes a joining member, before it asks for a target)
    r = c.reconcile.retarget("b joined")
    assert (c.generation, c.assignment, c.reason, c.state, c.rebalances) == before
    assert r.generation == before[0] + 1 and r.rebalances == 1 and r.reason == "b joined"
    assert r.assignment["b"] == () and r.states == (GroupState.RECONCILING,) and r.show_state
    decisions = c.take(r)
    assert c.generation == r.generation and c.assignment == dict(r.assignment) and c.reason == "b joined"
    assert c.state is GroupState.RECONCILING and c.rebalances == before[4] + 1
    assert states(decisions) == ["Reconciling"] and published(decisions)["a"].revoked


def test_a_member_added_gets_tasks_only_after_their_owner_reported_the_release():
    c = coordinator()
    c.on_members({"a": req("a")})
    ack(c)
    step1 = c.on_members({"a": c.members["a"], "b": req("b")})
    out = published(step1)
    assert out["a"].revoked and not set(out["a"].assigned) & set(out["a"].revoked)
    assert out["b"].assigned == (), "nothing handed to b while a may still run it"
    assert c.state is GroupState.RECONCILING
    moving = set(out["a"].revoked)
    # a stale report (older than the revocation's epoch) listing nothing confirms nothing
    stale = c.on_members({"a": req("a", generation=out["a"].generation - 1, owned=()), "b": req("b")})
    assert "b" not in published(stale)
    # a's report at the revocation's epoch, without the revoked tasks: they go to b, and a is not written again
    step2 = report(c, "a", owned=out["a"].assigned)
    out2 = published(step2)
    assert set(out2) == {"b"} and set(out2["b"].assigned) == moving
    assert out2["b"].generation > out["b"].generation
    assert c.state is GroupState.RECONCILING, "b has not taken them yet"
    report(c, "b")
    assert c.state is GroupState.STABLE


def test_a_report_that_still_lists_a_revoked_task_keeps_it_from_its_new_owner():
    c = coordinator()
    c.on_members({"a": req("a")})
    ack(c)
    out = published(c.on_members({"a": c.members["a"], "b": req("b")}))
    still = out["a"].revoked[0]
    step = report(c, "a", owned=out["a"].assigned + (still,))
    assert still not in published(step).get("b", Assignment(generation=0, controller_epoch=EPOCH)).assigned
    assert c.reconcile.unreleased["a"] == {still: out["a"].generation}


def test_member_epochs_only_grow_and_only_changed_members_are_written():
    c = coordinator(12)
    c.on_members({"a": req("a"), "b": req("b")})
    ack(c)
    epochs = {m: c.reconcile.acks.epoch_of(m) for m in "ab"}
    out = published(c.on_tasks(tasks(13)))  # one task more: one member gets it, the other is left alone
    assert len(out) == 1
    for m, a in out.items():
        assert a.generation > epochs[m]


def test_the_throttle_lets_moves_go_in_waves():
    c = coordinator(8)
    c.on_members({"a": req("a")})
    ack(c)
    c.on_settings(MoveLimits(max_moves=2), 0.0, 1)
    decisions = c.on_members({"a": c.members["a"], "b": req("b")})
    first = set(published(decisions)["a"].revoked)
    assert len(first) == 2 and len(c.operations.deferred) == 2, "two moves in flight at most; two wait"
    assert c.state is GroupState.RECONCILING
    step = report(c, "a")
    assert set(published(step)["b"].assigned) == first
    assert any(isinstance(d, WatchMoves) and set(d.tasks) == first for d in step)
    wave: list = []
    for t in sorted(first):
        assert not published(wave), "the next wave waits for every move of this one to run"
        wave = c.on_move_done(t, "b")
    second = set(published(wave)["a"].revoked)
    assert len(second) == 2 and not second & first
    report(c, "a")
    for t in sorted(second):
        c.on_move_done(t, "b")
    ack(c)
    assert len(c.assignment["a"]) == len(c.assignment["b"]) == 4 and c.state is GroupState.STABLE


def test_maintenance_mode_holds_a_departed_members_tasks_and_moves_nothing():
    c = coordinator(6)
    c.on_members({"a": req("a"), "b": req("b")})
    report(c, "a")
    report(c, "b")
    assert c.state is GroupState.STABLE
    b_tasks = c.assignment["b"]
    c.on_maintenance(True)
    decisions = c.on_members({"a": req("a", generation=c.reconcile.acks.epoch_of("a"), owned=c.assignment["a"])})
    assert "a" not in published(decisions), "nothing moves in maintenance mode"
    assert c.holds.held["b"].tasks == b_tasks and c.holds.held["b"].deadline == FOREVER
    decisions = c.on_maintenance(False)
    assert set(published(decisions)["a"].assigned) == set(tasks(6))


def test_a_controller_failover_keeps_unconfirmed_revocations():
    c = coordinator(6)
    c.on_members({"a": req("a")})
    ack(c)
    out = published(c.on_members({"a": c.members["a"], "b": req("b")}))
    members = dict(c.members)
    state = c.info()
    # the new controller: what ZooKeeper holds (the assignments as written, the members' requests)
    n = GroupCoordinator(group="g", controller_epoch=EPOCH + 1, clock=FakeClock(), config=GroupConfig())
    after = n.load(state, members, tasks(6), out)
    assert n.protocol == RECONCILE and n.join_result is None
    moved = set(out["a"].revoked)
    assert not moved & set(published(after).get("b", Assignment(0, EPOCH)).assigned), "revoked, not yet released"
    assert n.reconcile.unreleased["a"].keys() == moved
    step = report(n, "a", owned=out["a"].assigned)
    assert set(published(step)["b"].assigned) == moved


def test_a_member_without_reconcile_takes_the_group_back_to_a_join_round():
    c = coordinator()
    c.on_members({"a": req("a")})
    decisions = c.on_members({"a": req("a"), "old": req("old", protocols=(COOPERATIVE, EAGER))})
    assert c.state is GroupState.PREPARING_REBALANCE
    assert states(decisions)[-1] == "PreparingRebalance"
    assert not c.reconcile.unreleased and not c.reconcile.target
    # a reconciling member reads its own assignment only: the notice to join the round comes there
    notices = published(decisions)
    assert notices["a"].error == "REBALANCE_IN_PROGRESS" and notices["a"].generation == c.join_generation
    assert notices["a"].incarnation == "a.1" and notices["a"].assigned == () and notices["a"].protocol == RECONCILE


def test_a_reconciling_member_follows_its_assignment_alone_and_joins_the_round_it_is_told_of():
    from controller.protocol.group.member import Member, SetDesired, WorkerState, WriteJoin

    m = Member(member_id="a", assign=lambda *_: {}, protocols=RECONCILING, assignors=("sticky",), incarnation="a.1")
    m.start(None)
    assert not m.follows_assignment_alone, "joining: the group state says how"
    given = Assignment(
        generation=4, controller_epoch=EPOCH, assigned=("t1", "t2"), protocol=RECONCILE, incarnation="a.1"
    )
    assert SetDesired(frozenset({"t1", "t2"})) in m.on_assignment(given)
    m.on_owned(frozenset({"t1", "t2"}))
    assert m.state is WorkerState.STABLE and m.follows_assignment_alone
    # a notice for another life of ours, or an older one, changes nothing
    assert (
        m.on_assignment(
            Assignment(
                generation=9,
                controller_epoch=EPOCH,
                error="REBALANCE_IN_PROGRESS",
                protocol=RECONCILE,
                incarnation="a.0",
            )
        )
        == []
    )
    assert (
        m.on_assignment(
            Assignment(
                generation=3,
                controller_epoch=EPOCH,
                error="REBALANCE_IN_PROGRESS",
                protocol=RECONCILE,
                incarnation="a.1",
            )
        )
        == []
    )
    actions = m.on_assignment(
        Assignment(
            generation=9, controller_epoch=EPOCH, error="REBALANCE_IN_PROGRESS", protocol=RECONCILE, incarnation="a.1"
        )
    )
    [join] = [a for a in actions if isinstance(a, WriteJoin)]
    assert join.request.join_generation == 9 and set(join.request.owned) == {"t1", "t2"}, "cooperative: keeps them"
    assert not m.follows_assignment_alone and not m.reconcile_mode and m.desired == {"t1", "t2"}


def test_a_release_carries_the_report_that_confirms_it_unless_a_later_one_was_written():
    """The worker sends a reconciling member's release with its report in one multi (``release_report``):
    what it lists is what will be held once the multi is done. Nothing changes until the multi succeeded
    (``on_released``); then no separate report follows. A report built later (a newer assignment applied
    meanwhile) is the one that stands: then the member reports again, at its epoch."""
    from controller.protocol.group.member import Member, WorkerState, WriteJoin

    def stable_member() -> Member:
        m = Member(member_id="a", assign=lambda *_: {}, protocols=RECONCILING, assignors=("sticky",), incarnation="a.1")
        m.start(None)
        m.on_assignment(
            Assignment(
                generation=4, controller_epoch=EPOCH, assigned=("t1", "t2", "t3"), protocol=RECONCILE, incarnation="a.1"
            )
        )
        m.on_owned(frozenset({"t1", "t2", "t3"}))
        assert m.state is WorkerState.STABLE
        return m

    m = stable_member()
    m.on_assignment(
        Assignment(generation=6, controller_epoch=EPOCH, assigned=("t1", "t2"), protocol=RECONCILE, incarnation="a.1")
    )
    held = frozenset({"t1", "t2", "t3"})  # t3 is stopping: busy, so still counted as held
    request = m.release_report(frozenset({"t3"}), held)
    assert request is not None and request.owned == ("t1", "t2") and request.join_generation == 6
    assert m.pending_revocation == {"t3"} and m.reported != {"t1", "t2"}, "nothing counts until the multi succeeded"
    actions = m.on_released(frozenset({"t1", "t2"}), request)
    assert not [a for a in actions if isinstance(a, WriteJoin)], "the release carried the report"
    assert m.reported == {"t1", "t2"} and not m.pending_revocation and m.state is WorkerState.STABLE

    m = stable_member()
    m.on_assignment(
        Assignment(generation=6, controller_epoch=EPOCH, assigned=("t1", "t2"), protocol=RECONCILE, incarnation="a.1")
    )
    request = m.release_report(frozenset({"t3"}), frozenset({"t1", "t2", "t3"}))
    m.on_assignment(
        Assignment(generation=7, controller_epoch=EPOCH, assigned=("t1",), protocol=RECONCILE, incarnation="a.1")
    )  # applied while the multi was in flight
    actions = m.on_released(frozenset({"t1", "t2"}), request)
    [join] = [a for a in actions if isinstance(a, WriteJoin)]
    assert join.request.join_generation == 7 and set(join.request.owned) == {"t1", "t2"}, "t2 is still held"

    joining = Member(member_id="b", assign=lambda *_: {}, protocols=RECONCILING, assignors=("sticky",))
    joining.start(None)
    assert joining.release_report(frozenset({"t1"}), frozenset({"t1"})) is None, "a join round writes its own request"


def test_a_group_left_by_everyone_while_a_target_was_put_off_keeps_no_deadline():
    """A forming reconcile group has a target due; if every member leaves first, the group is Empty and that
    deadline is void (kept, it would come due at every tick of a group that no longer reconciles)."""
    c = coordinator(4, initial_delay_s=1.0)
    c.on_members({"a": req("a")})
    assert c.reconcile.retarget_due is not None
    c.on_members({})
    assert c.state is GroupState.EMPTY and c.next_deadline() is None


def test_a_restart_is_a_new_member_and_its_previous_lifes_assignment_is_not_reused():
    c = coordinator()
    c.on_members({"a": req("a"), "b": req("b")})
    report(c, "a")
    report(c, "b")
    before = c.reconcile.acks.epoch_of("b")
    decisions = c.on_members(
        {
            "a": req("a", generation=c.reconcile.acks.epoch_of("a"), owned=c.assignment["a"]),
            "b": req("b", incarnation="b.2"),
        }
    )
    out = published(decisions)
    assert out["b"].incarnation == "b.2" and out["b"].generation > before


def test_controlled_shutdown_drains_the_member_then_it_owns_nothing():
    c = coordinator()
    c.on_members({"a": req("a"), "b": req("b")})
    report(c, "a")
    report(c, "b")
    out = published(c.on_controlled_shutdown("b"))
    assert out["b"].assigned == () and out["b"].revoked
    step = report(c, "b", owned=())
    assert set(published(step)["a"].assigned) == set(tasks(6))


def test_the_end_of_a_controlled_shutdown_needs_no_new_target():
    """The drained member leaves (its session ends, often right behind its last report, before the
    coordinator has read that). Its tasks were re-targeted away already: the group settles at once, the
    state written without it. Asking for a target then, inside the retarget interval, held the group
    Reconciling until that interval was over (half a second more on every controlled shutdown)."""
    c = coordinator(retarget_interval_s=30.0)
    c.on_members({"a": req("a"), "b": req("b"), "x": req("x")})
    for m in ("a", "b", "x"):
        report(c, m)
    assert c.state is GroupState.STABLE
    published(c.on_controlled_shutdown("x"))
    retargets = c.rebalances
    members = {m: r for m, r in c.members.items() if m != "x"}  # x left before its report was read
    out = c.on_members(members)
    assert c.rebalances == retargets and c.reconcile.retarget_due is None
    given = published(out)
    assert set(given["a"].assigned) | set(given["b"].assigned) == set(tasks(6))
    assert c.state is GroupState.RECONCILING and states(out) == ["Reconciling"], "until a and b run them"
    assert states(ack(c)) == ["Stable"] and c.rebalances == retargets
    assert [d.info.members for d in out if isinstance(d, WriteGroupState)] == [("a", "b")]
    # a member that still had a share leaving is another matter: a new target, at once (the group was Stable)
    out = c.on_members({"a": c.members["a"]})
    assert c.rebalances == retargets + 1 and set(published(out)["a"].assigned) == set(tasks(6))


def test_a_forming_group_waits_for_the_brokers_starting_with_it_then_places_them_in_one_go():
    """Nothing runs yet: the first target waits ``initial_delay_s`` after each join (at most the rebalance
    timeout after the first), so ten brokers starting together are placed once, with no task moving twice."""
    c = coordinator(20, initial_delay_s=1.0, rebalance_timeout_s=5.0)
    clock = c.clock
    first = c.on_members({"m0": req("m0")})
    assert published(first)["m0"].assigned == () and c.state is GroupState.RECONCILING
    assert "forming" in c.reason
    members = {"m0": req("m0")}
    for i in range(1, 10):
        clock.advance(0.4)
        members[f"m{i}"] = req(f"m{i}")
        assert not any(a.assigned for a in published(c.on_members(dict(members))).values())
        assert not any(a.assigned for a in published(c.on_tick()).values())
    clock.advance(1.0)
    out = published(c.on_tick())
    assert sorted(len(a.assigned) for a in out.values()) == [2] * 10, "one target for all ten"
    ack(c)
    assert not c.reconcile.unreleased and c.state is GroupState.STABLE
    assert c.rebalances == 2, "the join round that formed the group, then one target"
    # and the wait is bounded: a steady stream of joins cannot hold the first target back for ever
    c2 = coordinator(20, initial_delay_s=1.0, rebalance_timeout_s=2.0)
    c2.on_members({"a": req("a")})
    placed = False
    members = {"a": req("a")}
    for i in range(10):
        c2.clock.advance(0.5)
        members[f"b{i}"] = req(f"b{i}")
        placed = placed or any(a.assigned for a in published(c2.on_members(dict(members)) + c2.on_tick()).values())
    assert placed


def test_the_pure_parts():
    assert holders({"a": ("t1",)}, {"a": {"t2": 3}}, {"a": req("a", owned=("t3",)), "b": req("b")}) == {
        "a": {"t1", "t2", "t3"},
        "b": set(),
    }
    pending = {"t1": 4, "t2": 6}
    assert confirm_releases(pending, req("a", generation=5, owned=())) == {"t2": 6}
    assert confirm_releases(pending, req("a", generation=6, owned=("t1",))) == {"t1": 4}


# ---- the coordinator trusts ZooKeeper, not members' words ----------------------------------------------------
def test_a_claim_in_a_report_never_takes_a_task_published_to_another_member():
    """A report narrows what a member holds; it cannot claim a task the coordinator placed with another (a
    ghost's or a stale report's ``owned``): the owner of record keeps it, nothing is revoked from it."""
    c = coordinator(6)
    c.on_members({"a": req("a"), "b": req("b")})
    ack(c)
    b_tasks = c.assignment["b"]
    members = dict(c.members)
    members["a"] = req("a", generation=c.reconcile.acks.epoch_of("a"), owned=c.assignment["a"] + b_tasks)
    out = published(c.on_members(members))
    assert "b" not in out and c.assignment["b"] == b_tasks
    held = holders(c.assignment, {}, c.members)
    assert held["a"] == set(c.assignment["a"]) and held["b"] == set(b_tasks)
    # a claim of a task nobody was given still counts (it may really hold it: its owner znode says so)
    lone = holders({"a": ("t0",)}, {}, {"a": req("a", owned=("t0", "t9"))})
    assert lone["a"] == {"t0", "t9"}


def test_a_report_out_of_bounds_is_answered_and_the_member_keeps_its_tasks():
    c = coordinator(6)
    c.on_members({"a": req("a"), "b": req("b")})
    ack(c)
    a_tasks, gen = c.assignment["a"], c.generation
    members = dict(c.members)
    members["a"] = req("a", generation=2**60, owned=a_tasks)  # a member epoch never published
    decisions = c.on_members(members)
    answer = published(decisions)["a"]
    assert answer.error == "INVALID_REPORT" and answer.generation > gen and answer.incarnation == "a.1"
    assert c.assignment["a"] == a_tasks and "b" not in published(decisions), "nothing handed on"
    assert c.state is GroupState.RECONCILING and [i.member for i in c.info().ignored] == ["a"]
    assert not published(c.on_members(dict(members))), "one answer per refused request"
    # the member rewrites a good request: its assignment is published again, it acknowledges, Stable
    members["a"] = req("a", generation=c.reconcile.acks.epoch_of("a"), owned=a_tasks)
    again = published(c.on_members(members))
    assert again["a"].error is None and again["a"].assigned == a_tasks
    ack(c)
    assert c.state is GroupState.STABLE and c.info().ignored == ()


def test_a_task_not_taken_within_the_rebalance_timeout_is_fenced_and_retargeted():
    c = coordinator(6, rebalance_timeout_s=10.0)
    c.on_members({"a": req("a"), "b": req("b")})
    ack(c)
    stuck = c.assignment["b"][0]
    c.on_tasks({**tasks(6), "t6": TaskDescriptor(task_id="t6")})
    new_owner = next(m for m, ts in c.assignment.items() if "t6" in ts)
    other = "a" if new_owner == "b" else "b"
    # the member reports without the new task: its owner znode is not held yet (pending)
    members = dict(c.members)
    mine = c.assignment[new_owner]
    members[new_owner] = req(
        new_owner, generation=c.reconcile.acks.epoch_of(new_owner), owned=mine, incarnation=f"{new_owner}.1"
    )
    members[new_owner] = dataclasses.replace(members[new_owner], pending=("t6",))
    c.on_members(members)
    assert c.state is GroupState.RECONCILING and c.info().unacked == (new_owner,), "Stable means running"
    assert c.next_deadline() is not None and c.next_deadline() <= c.clock.now() + 10.0
    c.clock.advance(10.5)
    decisions = c.on_tick()
    out = published(decisions)
    assert "t6" not in c.assignment[new_owner] and "t6" in c.assignment[other]
    assert "t6" not in c.reconcile.unreleased.get(new_owner, {}), "no confirmation waited for: it never took it"
    assert "not taken within the rebalance timeout" in c.reason and new_owner in c.reason
    assert any("not taken" in d.info.reason for d in decisions if isinstance(d, WriteGroupState))
    assert "t6" in out[other].assigned and c.reconcile.acks.fenced_total == 1
    assert stuck in c.assignment["b"]
    ack(c)
    assert c.state is GroupState.STABLE and not c.reconcile.acks.barred


def test_a_member_acknowledges_only_once_it_holds_every_owner_znode_and_rejoins_when_refused():
    from controller.protocol.group.member import Member, WorkerState, WriteJoin

    m = Member(member_id="a", assign=lambda name, jr: {}, protocols=RECONCILING, incarnation="a.1")
    m.start(None)
    m.on_owned(frozenset())
    a = Assignment(generation=3, controller_epoch=EPOCH, assigned=("t0", "t1"), protocol=RECONCILE, incarnation="a.1")
    m.on_assignment(a)
    # both acquisitions under way (may hold any moment), one owner znode held: progress, no acknowledgement
    progress = [x for x in m.on_owned(frozenset({"t0", "t1"}), frozenset({"t0"})) if isinstance(x, WriteJoin)]
    assert len(progress) == 1 and progress[0].request.pending == ("t1",)
    assert not m.on_owned(frozenset({"t0", "t1"}), frozenset({"t0"})), "nothing new taken: no report"
    acks = [x for x in m.on_owned(frozenset({"t0", "t1"}), frozenset({"t0", "t1"})) if isinstance(x, WriteJoin)]
    assert len(acks) == 1 and acks[0].request.generation == 3 and acks[0].request.pending == ()
    assert acks[0].request.owned == ("t0", "t1") and m.state is WorkerState.STABLE
    assert not m.on_owned(frozenset({"t0", "t1"}), frozenset({"t0", "t1"})), "acknowledged once"
    # refused (its report could not be read: no incarnation in the answer): it writes its request again
    refused = Assignment(generation=4, controller_epoch=EPOCH, error="INVALID_REPORT", protocol=RECONCILE)
    again = [x for x in m.on_assignment(refused) if isinstance(x, WriteJoin)]
    assert len(again) == 1 and again[0].request.owned == ("t0", "t1") and m.desired == {"t0", "t1"}


def test_a_join_rounds_owned_claims_of_another_members_tasks_are_left_out_of_the_join_result():
    """The same rule in the cooperative join round: a member's join metadata narrows what it holds, it cannot
    claim what the last generation gave another member (the leader would otherwise revoke it from its owner)."""
    from controller.protocol.group.vocabulary import WriteJoinResult

    c = GroupCoordinator(group="g", controller_epoch=EPOCH, clock=FakeClock(), config=GroupConfig())
    c.on_tasks(tasks(4))
    c.assignment = {"a": ("t0", "t1"), "b": ("t2", "t3")}
    coop = (COOPERATIVE,)
    decisions = c.on_members(
        {
            "a": req("a", owned=("t0", "t1", "t2"), protocols=coop),
            "b": req("b", owned=("t2", "t3"), protocols=coop),
        }
    )
    results = [d.result for d in decisions if isinstance(d, WriteJoinResult)]
    assert results, decisions
    owned = {mm.member_id: mm.owned for mm in results[-1].members}
    assert owned == {"a": ("t0", "t1"), "b": ("t2", "t3")}


def test_a_broker_of_a_release_before_acknowledgements_is_trusted_as_then_and_a_downgrade_is_refused():
    """Controllers upgraded before brokers: an older broker writes no ``acknowledges`` and never reports what it
    took. What it is published counts as taken (the behaviour of its release): the group is Stable without its
    report and it is never fenced from its tasks. A newer broker's request rewritten to stop acknowledging within
    the same life (to have its assignments trusted unchecked) is refused, and its last good request stands."""
    c = coordinator(6, rebalance_timeout_s=10.0)
    c.on_members({"old": req("old", acknowledges=False), "new": req("new")})
    members = dict(c.members)
    members["new"] = req(
        "new", generation=c.reconcile.acks.epoch_of("new"), owned=c.assignment["new"], incarnation="new.1"
    )
    c.on_members(members)  # only the newer broker reports
    assert c.assignment["old"] and c.state is GroupState.STABLE and c.info().unacked == ()
    c.clock.advance(30.0)
    assert not published(c.on_tick()) and c.reconcile.acks.fenced_total == 0 and c.state is GroupState.STABLE
    # the newer broker's request rewritten: acknowledges dropped, same life, its tasks "taken"
    good = c.members["new"]
    members = dict(c.members)
    members["new"] = dataclasses.replace(good, acknowledges=False)
    answer = published(c.on_members(members))
    assert answer["new"].error == "INVALID_REPORT" and c.members["new"] == good
    assert "new" in {m for m, _ in c.reconcile.refused.items()}


def test_a_failover_in_maintenance_mode_holds_the_tasks_of_a_member_gone_meanwhile():
    """b's session ended while no controller was active, in maintenance mode: the new controller holds b's
    tasks for it instead of moving them to a (nothing moves in the window), and they move once it ends."""
    c = coordinator(6)
    c.on_members({"a": req("a"), "b": req("b")})
    report(c, "a")
    report(c, "b")
    assert c.state is GroupState.STABLE
    state, members = c.info(), dict(c.members)
    assignments = {
        m: Assignment(c.reconcile.acks.epoch_of(m), EPOCH, assigned=ts, protocol=RECONCILE, incarnation=f"{m}.1")
        for m, ts in c.assignment.items()
    }
    b_tasks = c.assignment["b"]
    del members["b"]
    n = GroupCoordinator(group="g", controller_epoch=EPOCH + 1, clock=FakeClock(), config=GroupConfig())
    n.operations.maintenance = True
    after = n.load(state, members, tasks(6), assignments)
    assert "a" not in published(after) or set(published(after)["a"].assigned) == set(c.assignment["a"])
    assert n.holds.held["b"].tasks == b_tasks and n.holds.held["b"].deadline == FOREVER
    assert n.reconcile.target["a"] == c.assignment["a"], "nothing moves in maintenance mode"
    assert set(published(n.on_maintenance(False))["a"].assigned) == set(tasks(6))


def test_stable_means_running_a_group_is_not_stable_while_a_members_tasks_are_starting():
    """a acknowledged its assignment (it holds every owner znode) but reports two tasks still starting: the
    group stays Reconciling, the state names a as starting (written when that changes), and the report that
    says the starts are over makes it Stable."""
    c, _ = one_member(4)
    a = c.assignment["a"]
    decisions = report(c, "a", starting=a[:2])
    assert c.state is GroupState.RECONCILING and c.info().unacked == () and c.info().starting == ("a",)
    assert [d.info.starting for d in decisions if isinstance(d, WriteGroupState)] == [("a",)]
    decisions = report(c, "a", starting=a[:1])
    assert c.state is GroupState.RECONCILING and not [d for d in decisions if isinstance(d, WriteGroupState)]
    decisions = report(c, "a")
    assert c.state is GroupState.STABLE and states(decisions) == ["Stable"] and c.info().starting == ()


def test_a_report_of_starting_tasks_it_does_not_own_is_out_of_bounds():
    from controller.protocol.group.reports import request_problem

    assert request_problem(dataclasses.replace(req("a", owned=("t1",)), starting=("t1",))) == ""
    assert "starting" in request_problem(dataclasses.replace(req("a", owned=("t1",)), starting=("t2",)))
    pending = dataclasses.replace(req("a", owned=("t1",)), pending=("t1",), starting=("t1",))
    assert "starting" in request_problem(pending)


def test_a_member_reports_once_more_when_its_last_start_is_over():
    from controller.protocol.group.member import Member, WorkerState, WriteJoin

    m = Member(member_id="a", assign=lambda *_: {}, protocols=RECONCILING, assignors=("sticky",), incarnation="a.1")
    m.start(None)
    given = Assignment(
        generation=4, controller_epoch=EPOCH, assigned=("t1", "t2"), protocol=RECONCILE, incarnation="a.1"
    )
    m.on_assignment(given)
    both = frozenset({"t1", "t2"})
    writes = [x for x in m.on_owned(both, both, both) if isinstance(x, WriteJoin)]
    assert m.state is WorkerState.STABLE and len(writes) == 1
    assert writes[0].request.starting == ("t1", "t2") and not writes[0].request.pending
    assert not [x for x in m.on_owned(both, both, frozenset({"t2"})) if isinstance(x, WriteJoin)], "one left"
    writes = [x for x in m.on_owned(both, both, frozenset()) if isinstance(x, WriteJoin)]
    assert len(writes) == 1 and writes[0].request.starting == () and writes[0].request.generation == 4
    assert not [x for x in m.on_owned(both, both, frozenset()) if isinstance(x, WriteJoin)], "said once"


def test_a_member_reports_tasks_starting_over_after_its_fence_and_once_more_when_they_run():
    """Its fence stopped tasks it had reported running; the fence lifted and they start again (the worker tells
    the member): it reports them starting, so the coordinator does not count the group Stable until they run
    again, then once more when they do. A task restarting while the others run is reported alone."""
    from controller.protocol.group.member import Member, WriteJoin

    m = Member(member_id="a", assign=lambda *_: {}, protocols=RECONCILING, assignors=("sticky",), incarnation="a.1")
    m.start(None)
    m.on_assignment(
        Assignment(generation=4, controller_epoch=EPOCH, assigned=("t1", "t2"), protocol=RECONCILE, incarnation="a.1")
    )
    both = frozenset({"t1", "t2"})
    m.on_owned(both, both, both)
    assert [x for x in m.on_owned(both, both, frozenset()) if isinstance(x, WriteJoin)], "running: reported"
    writes = [x for x in m.on_owned(both, both, both) if isinstance(x, WriteJoin)]  # the fence lifted
    assert len(writes) == 1 and writes[0].request.starting == ("t1", "t2") and writes[0].request.generation == 4
    assert not [x for x in m.on_owned(both, both, both) if isinstance(x, WriteJoin)], "said once"
    writes = [x for x in m.on_owned(both, both, frozenset()) if isinstance(x, WriteJoin)]
    assert len(writes) == 1 and writes[0].request.starting == ()
    writes = [x for x in m.on_owned(both, both, frozenset({"t2"})) if isinstance(x, WriteJoin)]
    assert len(writes) == 1 and writes[0].request.starting == ("t2",)
