"""The planned roll's announcement per receiver: a drain tells each broker what moves to it."""

from __future__ import annotations

from controller.protocol.cluster.roll_plan import Plan, drain_plan, incoming_of, roll_order


# ---- the roll's announcement, and the coordinator publishing it ----------------------------------------------
def test_a_drain_announces_each_receiver_what_moves_to_it():
    assignment = {"a": ["t0", "t1"], "b": ["t2", "t3"], "c": ["t4", "t5"]}
    plan = drain_plan(assignment, roll_order(assignment, 1), 2)
    got = incoming_of(plan)
    assert sorted(t for ts in got.values() for t in ts) == ["t4", "t5"]
    assert all(plan.placement[t] == m for m, ts in got.items() for t in ts)
    assert incoming_of(Plan({"t0": "a"}, ())) == {}
