"""The move throttle and maintenance mode, pure: ``plan_wave`` over generated proposals, and the group
coordinator's waves, holds and postponed rebalances (no ZooKeeper)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_sim.sim.checker import MoveRun, concurrent_moves
from controller.protocol.clock import FakeClock
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.rules import cooperative_adjust
from controller.protocol.group.state import GroupState
from controller.protocol.group.throttle import Move, broker_load, combine, plan_wave
from controller.protocol.group.vocabulary import FOREVER, GroupConfig, WatchMoves, WriteAssignments
from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import JoinRequest, SyncProposal, TaskDescriptor

MEMBERS = ("a", "b", "c", "d")


@st.composite
def proposals(draw):
    """A previous placement, a target the assignor might propose, moves already in flight and limits."""
    tasks = [f"t{i}" for i in range(draw(st.integers(0, 14)))]
    members = MEMBERS[: draw(st.integers(1, len(MEMBERS)))]
    had = {m: [] for m in members}
    for t in tasks:
        owner = draw(st.sampled_from((None, *members)))
        if owner is not None:
            had[owner].append(t)
    runnable = [t for t in tasks if draw(st.booleans()) or True]
    target = {m: [] for m in members}
    for t in runnable:
        to = draw(st.sampled_from((None, *members)))
        if to is not None:
            target[to].append(t)
    cooperative = draw(st.booleans())
    if cooperative:
        assigned, revoked = cooperative_adjust(target, had)
    else:
        assigned, revoked = {m: tuple(ts) for m, ts in target.items()}, {}
    moving = {}
    for t in draw(st.lists(st.sampled_from(tasks), unique=True, max_size=3)) if tasks else []:
        moving[t] = Move(t, draw(st.sampled_from((None, *members))), draw(st.sampled_from((None, *members))), 0.0)
    limits = MoveLimits(
        max_moves=draw(st.one_of(st.none(), st.integers(1, 6))),
        max_moves_per_broker=draw(st.one_of(st.none(), st.integers(1, 4))),
    )
    frozen = draw(st.booleans())
    room = draw(st.one_of(st.none(), st.integers(0, 5)))
    leaving = draw(st.lists(st.sampled_from(members), unique=True, max_size=1))
    return assigned, revoked, had, runnable, moving, limits, frozen, room, leaving


@settings(max_examples=800, deadline=None)
@given(proposals())
def test_a_wave_never_exceeds_its_limits_and_never_double_assigns(p):
    assigned, revoked, had, runnable, moving, limits, frozen, room, leaving = p
    wave = plan_wave(
        assigned, revoked, had, runnable, moving, limits, now=1.0, frozen=frozen, leaving=leaving, room=room
    )
    placed = [t for ts in wave.assigned.values() for t in ts]
    assert len(placed) == len(set(placed)), "a task assigned twice"
    for m, ts in wave.assigned.items():
        for t in ts:  # only where the assignor put it, or where it already ran
            assert t in assigned.get(m, ()) or t in had.get(m, ()), (m, t)
    for m, ts in wave.revoked.items():
        assert set(ts) <= set(revoked.get(m, ())) and not set(ts) & set(wave.assigned[m])
    # a move begun by this wave (at ``now``): one under way keeps its start, be it continued to its destination
    # or, revoked from the member it was going to, turned into a revocation
    new = {t: mv for t, mv in wave.moving.items() if mv.since == 1.0}
    already = len([t for t in moving if t in runnable])
    if frozen:
        assert not new, new
    if limits.max_moves is not None:
        assert len(new) <= max(0, limits.max_moves - already)
    if room is not None:
        assert len(new) <= room
    if limits.max_moves_per_broker is not None:
        before = broker_load({t: mv for t, mv in moving.items() if t in runnable})
        after = broker_load(wave.moving)
        for b, n in after.items():
            assert n <= max(limits.max_moves_per_broker, before.get(b, 0)), (b, n)
    # a move in flight goes where the wave sends its task: one whose destination does not get it is over (a
    # move that can never be done would hold the throttle's room until the move timeout)
    for t, mv in wave.moving.items():
        if mv.dest is not None:
            assert t in wave.assigned.get(mv.dest, ()), (t, mv, wave)
    # a stop (a revocation of a task that is no longer runnable) is never held back
    for m, ts in revoked.items():
        for t in ts:
            if t not in runnable:
                assert t in wave.revoked.get(m, ())
    # the same inputs, the same wave
    assert (
        plan_wave(assigned, revoked, had, runnable, moving, limits, now=1.0, frozen=frozen, leaving=leaving, room=room)
        == wave
    )


def test_eager_moves_beyond_the_limit_stay_with_their_previous_owner():
    had = {"a": ["t1", "t2", "t3", "t4"], "b": []}
    target = {"a": ("t1", "t2"), "b": ("t3", "t4")}
    wave = plan_wave(target, {}, had, ["t1", "t2", "t3", "t4"], {}, MoveLimits(max_moves=1), now=0.0)
    assert wave.assigned == {"a": ("t1", "t2", "t4"), "b": ("t3",)}
    assert wave.deferred == ("t4",) and set(wave.moving) == {"t3"}


def test_cooperative_revocations_beyond_the_limit_are_kept_by_their_owner():
    had = {"a": ["t1", "t2", "t3", "t4"], "b": []}
    assigned, revoked = cooperative_adjust({"a": ["t1", "t2"], "b": ["t3", "t4"]}, had)
    wave = plan_wave(assigned, revoked, had, ["t1", "t2", "t3", "t4"], {}, MoveLimits(max_moves=1), now=0.0)
    assert wave.revoked == {"a": ("t3",)} and wave.assigned["a"] == ("t1", "t2", "t4")
    assert wave.moving["t3"].dest is None
    # the second round assigns the revoked task without new room: the move is under way
    second = plan_wave(
        {"a": ("t1", "t2", "t4"), "b": ("t3",)},
        {},
        {"a": ["t1", "t2", "t4"], "b": []},
        ["t1", "t2", "t3", "t4"],
        wave.moving,
        MoveLimits(max_moves=1),
        now=1.0,
    )
    assert second.assigned["b"] == ("t3",) and second.moving["t3"].dest == "b" and not second.deferred


def test_a_move_whose_destination_no_longer_gets_its_task_stops_counting():
    """A new task sent to ``a`` (not running yet) that the next proposal revokes from ``a``, and then assigns
    to ``b`` with no room left: the move to ``a`` is over. Kept in flight, it would fill the throttle with moves
    nobody can finish and no later wave would go until the move timeout."""
    limits = MoveLimits(max_moves=1)
    first = plan_wave({"a": ("t1",), "b": ()}, {}, {"a": [], "b": []}, ["t1", "t2"], {}, limits, now=0.0)
    assert first.moving["t1"].dest == "a"
    # the next proposal moves t1 to b: cooperative, so this generation revokes it from a
    assigned, revoked = cooperative_adjust({"a": [], "b": ["t1", "t2"]}, {"a": ["t1"], "b": []})
    second = plan_wave(assigned, revoked, {"a": ["t1"], "b": []}, ["t1", "t2"], first.moving, limits, now=1.0)
    assert second.revoked == {"a": ("t1",)}
    assert second.moving["t1"].dest is None, second.moving  # counted once: now a revocation under way
    # a proposal that sends t1 elsewhere while the move to a is in flight, with no room: it waits, uncounted
    third = plan_wave({"a": (), "b": ("t1",)}, {}, {"a": [], "b": []}, ["t1", "t2"], first.moving, limits, now=1.0)
    assert third.deferred == ("t1",) and third.assigned["b"] == () and "t1" not in third.moving, third


def test_unplaced_tasks_go_first_and_maintenance_moves_nothing():
    had = {"a": ["t1"], "b": []}
    target = {"a": (), "b": ("t1", "t9")}  # t9: its owner left, nobody runs it
    wave = plan_wave(target, {}, had, ["t1", "t9"], {}, MoveLimits(max_moves=1), now=0.0)
    assert set(wave.moving) == {"t9"} and wave.assigned == {"a": ("t1",), "b": ("t9",)}
    frozen = plan_wave(target, {}, had, ["t1", "t9"], {}, MoveLimits(), now=0.0, frozen=True)
    assert frozen.assigned == {"a": ("t1",), "b": ()} and not frozen.moving and frozen.deferred == ("t1", "t9")


def test_limits_combine_to_the_tightest():
    assert combine(MoveLimits(5, None), MoveLimits(None, 2), None) == MoveLimits(5, 2)
    assert combine(MoveLimits(5, 3), MoveLimits(2, 4)) == MoveLimits(2, 3)
    assert combine() == MoveLimits()


def test_the_checker_counts_moves_in_flight_at_one_instant():
    moves = [MoveRun("t1", "b", "a", 0.0, 1.0), MoveRun("t2", "b", "a", 0.5, 1.5), MoveRun("t3", "c", None, 1.0, 2.0)]
    most, per = concurrent_moves(moves)
    assert most == 2 and per == {"b": 2, "c": 1}


# ---- the coordinator: waves, maintenance ----------------------------------------------------------
def _req(m: str, jg: int, g: int, owned: tuple[str, ...] = (), protocol: str = "eager") -> JoinRequest:
    return JoinRequest(
        member_id=m, join_generation=jg, generation=g, protocols=(protocol,), assignors=("sticky",), owned=owned
    )


def _coordinator(n_tasks: int, members: tuple[str, ...] = ("a",)) -> tuple[GroupCoordinator, FakeClock]:
    clock = FakeClock()
    c = GroupCoordinator(
        group="g", controller_epoch=1, clock=clock, wall=clock, config=GroupConfig(rebalance_timeout_s=5)
    )
    c.on_tasks({f"t{i}": TaskDescriptor(task_id=f"t{i}") for i in range(n_tasks)})
    c.on_members({m: _req(m, 1, 0) for m in members})
    return c, clock


def _sync(c: GroupCoordinator, assigned: dict[str, tuple[str, ...]]) -> list:
    return c.on_proposal(SyncProposal(generation=c.generation, leader=c.leader, assigned=assigned))


def _assigned(decisions: list) -> dict[str, tuple[str, ...]]:
    out = {}
    for d in decisions:
        if isinstance(d, WriteAssignments):
            out.update({m: a.assigned for m, a in d.assignments})
    return out


def test_the_coordinator_moves_in_waves_each_after_the_last_runs():
    c, clock = _coordinator(6)
    _sync(c, {"a": tuple(f"t{i}" for i in range(6))})
    c.operations.moving.clear()  # the first placement done
    c.operations.limits = MoveLimits(max_moves=2)
    c.on_members({"a": _req("a", 2, 1), "b": _req("b", 2, 1)})
    assert c.state is GroupState.AWAITING_SYNC
    d = _sync(c, {"a": ("t0", "t1", "t2"), "b": ("t3", "t4", "t5")})
    assert _assigned(d) == {"a": ("t0", "t1", "t2", "t5"), "b": ("t3", "t4")}
    assert WatchMoves(("t3", "t4")) in d and c.operations.deferred == ("t5",)
    assert c.on_move_done("t3", "a") == []  # not its destination
    c.on_move_done("t3", "b")
    assert c.state is GroupState.STABLE  # one move still in flight
    d = c.on_move_done("t4", "b")
    assert c.state is GroupState.PREPARING_REBALANCE and "next wave" in c.reason


def test_maintenance_holds_a_lost_members_tasks_and_postpones_joins():
    c, clock = _coordinator(4, ("a", "b"))
    _sync(c, {"a": ("t0", "t1"), "b": ("t2", "t3")})
    c.on_maintenance(True)
    c.on_members({"a": _req("a", 1, 1)})  # b lost
    assert c.state is GroupState.STABLE and c.holds.held["b"].deadline == FOREVER
    assert c.info().held[0].until is None
    c.on_members({"a": _req("a", 1, 1), "z": _req("z", 2, 0)})  # a new broker waits too
    assert c.state is GroupState.STABLE and c.operations.postponed
    c.on_members({"a": _req("a", 1, 1), "z": _req("z", 2, 0), "b": _req("b", 2, 0)})  # b is back: its tasks too
    assert c.assignment["b"] == ("t2", "t3") and not c.holds.held
    d = c.on_maintenance(False)
    assert c.state is GroupState.PREPARING_REBALANCE and "member z joined" in c.reason, d


def test_the_imbalance_check_rebalances_a_skewed_group_and_measures_a_balanced_one():
    c, clock = _coordinator(6, ("a", "b"))
    _sync(c, {"a": ("t0", "t1", "t2", "t3", "t4", "t5"), "b": ()})  # skewed: b runs nothing
    c.on_settings(c.operations.limits, preferred_check_s=10.0, max_imbalance=1)
    assert c.on_tick() == [] and c.state is GroupState.STABLE  # not yet time
    clock.advance(10.0)
    c.on_tick()
    assert c.operations.imbalance == 3 and c.state is GroupState.PREPARING_REBALANCE and "imbalance: 3" in c.reason
    c.on_members({"a": _req("a", 2, 1), "b": _req("b", 2, 1)})
    _sync(c, {"a": ("t0", "t1", "t2"), "b": ("t3", "t4", "t5")})
    clock.advance(10.0)
    c.on_tick()
    assert c.operations.imbalance == 0 and c.state is GroupState.STABLE and c.info().imbalance == 0
