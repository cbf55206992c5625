"""The roll planner, exhaustively over small groups: each broker but the first batch empty before it goes
down, no task moved to a broker still to be rolled, the group balanced at the end; in place (the first batch
restarts with its tasks held for it): ``T`` moves at most and none moved twice from a balanced group; without
(a reconciling group): the first batch's tasks to the last batch, ``T + 2T/N`` moves, none moved more than
twice."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from controller.protocol.cluster.roll_plan import (
    Plan,
    balance_plan,
    drain_plan,
    hold_plan,
    next_wave,
    owners,
    placed,
    roll_order,
)


def _assignment(placement: dict[str, str], members: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {m: [] for m in members}
    for t, m in placement.items():
        out[m].append(t)
    return out


def _roll(
    members: list[str], counts: list[int], batch: int, in_place: bool = True
) -> tuple[Counter[str], dict[str, list[str]]]:
    """Play a whole roll: the plans applied as the coordinator would, a batch coming back empty (the first,
    in place, with its tasks)."""
    tasks = iter(f"t{i:03d}" for i in range(1000))
    assignment = {m: [next(tasks) for _ in range(n)] for m, n in zip(members, counts)}
    moves: Counter[str] = Counter()
    order = roll_order(members, batch)
    rolled: set[str] = set()
    twice: set[str] = set()
    kept: set[str] = set()
    for step, bs in enumerate(order):
        before = owners(assignment)
        plan = drain_plan(assignment, order, step, in_place)
        later = {b for bs2 in order[step:] for b in bs2}
        for t, b in plan.placement.items():
            if before[t] != b:
                moves[t] += 1
                if step == 0:
                    assert b in order[-1] and b not in bs
                else:
                    assert b in rolled and b not in later
        if step == 0:
            twice |= set(plan.moved)
            kept |= set(plan.stranded) if len(order) > 1 else set()
        assignment = _assignment(plan.placement, members)
        if plan.stranded:
            assert len(order) == 1 or (in_place and step == 0)
            for t in plan.stranded:
                assignment[before[t]].append(t)  # held through the restart
        else:
            assert all(not assignment[b] for b in bs), "a broker goes down owning tasks"
        assert placed(assignment, plan.placement)
        assert hold_plan(assignment).placement == owners(assignment)
        rolled |= set(bs)
    before = owners(assignment)
    final = balance_plan(assignment, twice, kept)
    for t in final.moved:
        moves[t] += 1
        assert before[t] != final.placement[t]
    return moves, _assignment(final.placement, members)


@pytest.mark.parametrize("n", range(1, 7))
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_roll_in_place_bounds(n: int, batch: int) -> None:
    members = [f"b{i}" for i in range(n)]
    for per in (0, 1, 3, 10):
        for skew in itertools.product((0, 2), repeat=min(n, 3)):
            counts = [per + (skew[i] if i < len(skew) else 0) for i in range(n)]
            total = sum(counts)
            moves, end = _roll(members, counts, batch)
            # balanced before the roll: no task moves twice, T moves at most (skewed: twice, T + skew)
            balanced = max(counts) - min(counts) <= 1
            assert max(moves.values(), default=0) <= (1 if balanced else 2)
            sizes = [len(end[m]) for m in members]
            assert max(sizes) - min(sizes) <= 1
            assert sum(len(v) for v in end.values()) == total
            if balanced:
                assert sum(moves.values()) <= total


@pytest.mark.parametrize("n", range(1, 7))
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_roll_moving_the_first_batch_bounds(n: int, batch: int) -> None:
    members = [f"b{i}" for i in range(n)]
    for per in (0, 1, 3, 10):
        for skew in itertools.product((0, 2), repeat=min(n, 3)):
            counts = [per + (skew[i] if i < len(skew) else 0) for i in range(n)]
            total = sum(counts)
            moves, end = _roll(members, counts, batch, in_place=False)
            # a group balanced before the roll: no task moves more than twice (a skewed one: three times)
            assert max(moves.values(), default=0) <= (2 if len(set(counts)) == 1 else 3)
            sizes = [len(end[m]) for m in members]
            assert max(sizes) - min(sizes) <= 1
            assert sum(len(v) for v in end.values()) == total
            if n > batch and len(set(counts)) == 1:
                first = sum(counts[:batch])
                last_batch = len(roll_order(members, batch)[-1])
                assert sum(moves.values()) <= total + first + math.ceil(total * last_batch / n)


def test_equal_brokers_in_place_move_each_task_once() -> None:
    moves, _ = _roll([f"b{i}" for i in range(10)], [20] * 10, 1)
    assert sum(moves.values()) == 200 and max(moves.values()) == 1


def test_equal_brokers_moving_the_first_batch_move_t_plus_2t_over_n() -> None:
    moves, _ = _roll([f"b{i}" for i in range(5)], [40] * 5, 1, in_place=False)
    assert sum(moves.values()) == 200 + 2 * 40
    assert max(moves.values()) == 2


def test_next_wave_moves_at_most_wave_tasks_and_keeps_the_rest() -> None:
    assignment = {"a": [f"t{i}" for i in range(10)], "b": []}
    plan = Plan({f"t{i}": "b" for i in range(10)}, tuple(f"t{i}" for i in range(10)))
    first = next_wave(assignment, plan, 4)
    assert first is not None and sorted(t for t, m in first.items() if m == "b") == ["t0", "t1", "t2", "t3"]
    assert all(first[f"t{i}"] == "a" for i in range(4, 10))
    after = {"a": [f"t{i}" for i in range(4, 10)], "b": ["t0", "t1", "t2", "t3"]}
    second = next_wave(after, plan, 4)
    assert second is not None and sum(1 for m in second.values() if m == "b") == 8
    assert next_wave({"a": [], "b": [f"t{i}" for i in range(10)]}, plan, 4) is None
    assert next_wave(assignment, plan, 0) == plan.placement  # 0: all at once


def test_order_is_batched_by_name() -> None:
    assert roll_order(["c", "a", "b"], 2) == (("a", "b"), ("c",))
    with pytest.raises(ValueError):
        roll_order(["a"], 0)


def test_first_batch_restarts_in_place() -> None:
    plan = drain_plan({"a": ["t1"], "b": ["t2"]}, roll_order(["a", "b"], 1), 0)
    assert plan.stranded == ("t1",) and plan.moved == ()
    plan = drain_plan({"a": ["t1"], "b": ["t2"]}, roll_order(["a", "b"], 1), 0, in_place=False)
    assert plan.stranded == () and plan.moved == ("t1",) and plan.placement["t1"] == "b"


def test_balance_takes_tasks_kept_in_place_first() -> None:
    plan = balance_plan({"a": ["t1", "t2", "t3", "t4"], "b": []}, kept={"t3", "t4"})
    assert set(plan.moved) == {"t3", "t4"}


def test_whole_group_in_one_batch_strands_its_tasks() -> None:
    plan = drain_plan({"a": ["t1"], "b": ["t2"]}, roll_order(["a", "b"], 2), 0)
    assert plan.stranded == ("t1", "t2") and plan.moved == ()


def test_balance_prefers_tasks_moved_once() -> None:
    plan = balance_plan({"a": ["t1", "t2", "t3", "t4"], "b": []}, twice={"t1", "t2"})
    assert set(plan.moved) == {"t3", "t4"}
