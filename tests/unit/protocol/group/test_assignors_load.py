"""The load-balanced assignor: evens out measured load within its tolerance, moves each task at most once and
never more than its limit, leaves a recently moved task where it is, and places a new task by its weight."""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.assignors_load import MIN_GAP, LoadBalancedAssignor, plan, task_costs
from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor
from controller.protocol.tasks.load import MAX_LOAD_SHARE

M = MemberMetadata
T = TaskDescriptor


def _skewed() -> tuple[list[MemberMetadata], list[TaskDescriptor], dict[str, tuple[str, ...]]]:
    """Three brokers with equal counts; the three heavy pipelines all on ``a``."""
    tasks = [T("h1", load=0.9), T("h2", load=0.9), T("h3", load=0.8)] + [T(f"l{i}", load=0.05) for i in range(9)]
    previous = {"a": ("h1", "h2", "h3", "l0"), "b": ("l1", "l2", "l3", "l4"), "c": ("l5", "l6", "l7", "l8")}
    return [M("a"), M("b"), M("c")], tasks, previous


def _loads(result: dict[str, tuple[str, ...]], tasks: list[TaskDescriptor]) -> dict[str, float]:
    cost = task_costs(tasks)
    return {m: sum(cost[t] for t in ts) for m, ts in result.items()}


def test_the_heavy_pipelines_are_spread_and_the_rest_stays() -> None:
    members, tasks, previous = _skewed()
    result = get_assignor("load-balanced").assign(members, tasks, previous)
    loads = _loads(result, tasks)
    mean = sum(loads.values()) / 3
    assert max(loads.values()) <= mean + max(0.2 * mean, MIN_GAP)
    assert sorted(Counter(t for ts in result.values() for t in ts if t.startswith("h")).values()) == [1, 1, 1]
    moved = {t for m, ts in result.items() for t in ts if t not in previous[m]}
    assert len(moved) == 2 and moved <= {"h1", "h2", "h3"}  # the fewest moves: two heavy ones, no light one


def test_the_explanation_says_who_is_over_and_what_moves() -> None:
    members, tasks, previous = _skewed()
    text = "\n".join(plan(members, tasks, previous).explain())
    assert "a is over: load 2.65" in text and "move h1" in text and "stopped: balanced" in text


def test_a_balanced_group_moves_nothing() -> None:
    tasks = [T(f"t{i}", load=0.3) for i in range(6)]
    previous = {"a": ("t0", "t1", "t2"), "b": ("t3", "t4", "t5")}
    p = plan([M("a"), M("b")], tasks, previous)
    assert p.moves == () and "nothing moves" in "\n".join(p.explain())


def test_a_recently_moved_task_stays_put() -> None:
    members, tasks, previous = _skewed()
    tasks = [T(t.task_id, load=t.load, moved_recently=t.task_id.startswith("h")) for t in tasks]
    p = plan(members, tasks, previous)
    assert p.moves == () or all(not mv.task.startswith("h") for mv in p.moves)
    assert all(p.placement[h] == "a" for h in ("h1", "h2", "h3"))


def test_the_move_limit_holds() -> None:
    members, tasks, previous = _skewed()
    p = plan(members, tasks, previous, max_moves=1)
    assert len(p.moves) == 1 and p.stopped == "move limit"


def test_a_new_task_is_placed_by_its_weight() -> None:
    # measured: 0.2 per unit of weight; the new task weighs 5, so it costs 1.0 and goes to the idle member
    tasks = [T("m1", load=0.2), T("m2", load=0.2), T("new", weight=5)]
    assert task_costs(tasks)["new"] == pytest.approx(1.0)
    result = get_assignor("load-balanced").assign([M("a"), M("b")], tasks, {"a": ("m1", "m2")})
    assert result["b"] == ("new",)
    # nothing measured yet: a weight counts as a load of 1 per unit
    assert task_costs([T("x", weight=3)])["x"] == 3.0


def test_capacity_scales_a_member_s_share() -> None:
    tasks = [T(f"t{i}", load=1.0) for i in range(6)]
    result = get_assignor("load-balanced").assign([M("big", capacity=2), M("small")], tasks, {})
    assert (len(result["big"]), len(result["small"])) == (4, 2)


def test_a_leaving_member_keeps_nothing() -> None:
    members, tasks, previous = _skewed()
    members = [M("a", leaving=True), M("b"), M("c")]
    result = get_assignor("load-balanced").assign(members, tasks, previous)
    assert result["a"] == () and sum(len(ts) for ts in result.values()) == len(tasks)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        LoadBalancedAssignor(tolerance=-1)
    with pytest.raises(ValueError):
        LoadBalancedAssignor(max_moves=-1)


_loads_st = st.one_of(st.none(), st.floats(min_value=0, max_value=MAX_LOAD_SHARE))


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[MemberMetadata], list[TaskDescriptor], dict[str, tuple[str, ...]]]:
    n_members = draw(st.integers(1, 5))
    members = [
        M(f"m{i}", capacity=draw(st.integers(1, 3)), leaving=draw(st.booleans()) and i > 0) for i in range(n_members)
    ]
    n_tasks = draw(st.integers(0, 25))
    tasks = [
        T(f"t{i:02d}", weight=draw(st.integers(0, 5)), load=draw(_loads_st), moved_recently=draw(st.booleans()))
        for i in range(n_tasks)
    ]
    previous: dict[str, list[str]] = {}
    for t in tasks:
        owner = draw(st.one_of(st.none(), st.sampled_from([m.member_id for m in members])))
        if owner is not None:
            previous.setdefault(owner, []).append(t.task_id)
    return members, tasks, {m: tuple(ts) for m, ts in previous.items()}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_groups(), st.integers(0, 4))
def test_moves_are_bounded_once_each_and_never_of_a_recent_move(group, max_moves: int) -> None:
    members, tasks, previous = group
    p = plan(members, tasks, previous, max_moves=max_moves)
    assert len(p.moves) <= max_moves
    assert len({mv.task for mv in p.moves}) == len(p.moves)
    recent = {t.task_id for t in tasks if t.moved_recently}
    assert not recent & {mv.task for mv in p.moves}
    for mv in p.moves:  # every move lowers the larger load of the pair it touches
        assert max(mv.source_after, mv.dest_after) < max(mv.source_load, mv.dest_load)
    active = [m for m in members if not m.leaving]
    assert set(p.placement) == {t.task_id for t in tasks} if active else not p.placement


def test_an_absurd_report_cannot_make_it_move_everything() -> None:
    """Exhaustively over small groups: one broker's tasks at the highest load the controller lets through
    (a report of 1e300 is clamped to MAX_LOAD_SHARE first), the move limit bounds what moves."""
    for n_hot, n_cold, limit in product(range(1, 5), range(0, 5), range(0, 4)):
        tasks = [T(f"h{i}", load=MAX_LOAD_SHARE) for i in range(n_hot)] + [T(f"c{i}", load=0.1) for i in range(n_cold)]
        previous = {"liar": tuple(f"h{i}" for i in range(n_hot)), "b": tuple(f"c{i}" for i in range(n_cold))}
        p = plan([M("liar"), M("b"), M("c")], tasks, previous, max_moves=limit)
        assert len(p.moves) <= limit
        assert all(mv.task.startswith("h") for mv in p.moves)  # only the claimed-heavy tasks move, never the rest
