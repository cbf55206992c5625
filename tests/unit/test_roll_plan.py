"""The roll planner, exhaustively over small groups: each broker empty before it goes down, no task back on
a broker still to be rolled (but the first batch's, which has nowhere rolled to go), no task moved more than
twice, ``T + 2T/N`` moves at most, the group balanced at the end."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from controller.protocol.roll import balance_plan, drain_plan, hold_plan, owners, placed, roll_order


def _assignment(placement: dict[str, str], members: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {m: [] for m in members}
    for t, m in placement.items():
        out[m].append(t)
    return out


def _roll(members: list[str], counts: list[int], batch: int) -> tuple[Counter[str], dict[str, list[str]]]:
    """Play a whole roll: the plans applied as the coordinator would, a batch coming back empty."""
    tasks = iter(f"t{i:03d}" for i in range(1000))
    assignment = {m: [next(tasks) for _ in range(n)] for m, n in zip(members, counts)}
    moves: Counter[str] = Counter()
    order = roll_order(members, batch)
    rolled: set[str] = set()
    twice: set[str] = set()
    for step, bs in enumerate(order):
        before = owners(assignment)
        plan = drain_plan(assignment, order, step)
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
        assignment = _assignment(plan.placement, members)
        if plan.stranded:
            assert len(order) == 1
            for t in plan.stranded:
                assignment[before[t]].append(t)  # held through the restart
        else:
            assert all(not assignment[b] for b in bs), "a broker goes down owning tasks"
        assert placed(assignment, plan.placement)
        assert hold_plan(assignment).placement == owners(assignment)
        rolled |= set(bs)
    before = owners(assignment)
    final = balance_plan(assignment, twice)
    for t in final.moved:
        moves[t] += 1
        assert before[t] != final.placement[t]
    return moves, _assignment(final.placement, members)


@pytest.mark.parametrize("n", range(1, 7))
@pytest.mark.parametrize("batch", [1, 2, 3])
def test_roll_bounds(n: int, batch: int) -> None:
    members = [f"b{i}" for i in range(n)]
    for per in (0, 1, 3, 10):
        for skew in itertools.product((0, 2), repeat=min(n, 3)):
            counts = [per + (skew[i] if i < len(skew) else 0) for i in range(n)]
            total = sum(counts)
            moves, end = _roll(members, counts, batch)
            # a group balanced before the roll: no task moves more than twice (a skewed one: three times)
            assert max(moves.values(), default=0) <= (2 if len(set(counts)) == 1 else 3)
            sizes = [len(end[m]) for m in members]
            assert max(sizes) - min(sizes) <= 1
            assert sum(len(v) for v in end.values()) == total
            if n > batch and len(set(counts)) == 1:
                first = sum(counts[:batch])
                last_batch = len(roll_order(members, batch)[-1])
                assert sum(moves.values()) <= total + first + math.ceil(total * last_batch / n)


def test_equal_brokers_move_t_plus_2t_over_n() -> None:
    moves, _ = _roll([f"b{i}" for i in range(5)], [40] * 5, 1)
    assert sum(moves.values()) == 200 + 2 * 40
    assert max(moves.values()) == 2


def test_order_is_batched_by_name() -> None:
    assert roll_order(["c", "a", "b"], 2) == (("a", "b"), ("c",))
    with pytest.raises(ValueError):
        roll_order(["a"], 0)


def test_whole_group_in_one_batch_strands_its_tasks() -> None:
    plan = drain_plan({"a": ["t1"], "b": ["t2"]}, roll_order(["a", "b"], 2), 0)
    assert plan.stranded == ("t1", "t2") and plan.moved == ()


def test_balance_prefers_tasks_moved_once() -> None:
    plan = balance_plan({"a": ["t1", "t2", "t3", "t4"], "b": []}, twice={"t1", "t2"})
    assert set(plan.moved) == {"t3", "t4"}
