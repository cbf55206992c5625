"""A member whose acknowledgements ZooKeeper keeps contradicting (it says it took tasks whose owner znodes it
does not hold: it runs nothing) is kept from new work for a growing back-off, pure: the policy, the count, the
target moved off it, the group state that shows it, its return after the back-off, and a back-off twice as
long when it goes on. The real broker that acknowledges and runs nothing:
tests/integration/daemon/test_probation_broker.py."""

from __future__ import annotations

import pytest

from controller.protocol.group.probation import MAX_MEMBERS, BackoffPolicy, Probation
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import WriteGroupState
from tests.unit.protocol.group.test_reconcile import ack, coordinator, req

WHY = "reports 2 task(s) taken whose owner znode it does not hold (t1, t2)"


def test_the_back_off_doubles_and_is_capped():
    p = BackoffPolicy(refusals=3, initial_s=30.0, max_s=200.0)
    assert [p.backoff_s(n) for n in (1, 2, 3, 4, 99)] == [30.0, 60.0, 120.0, 200.0, 200.0]


def test_n_refusals_in_a_row_start_a_back_off_and_a_confirmed_report_forgives():
    p = Probation(BackoffPolicy(refusals=3, initial_s=30.0, max_s=960.0))
    assert not p.contradicted("x", 0.0, WHY) and not p.contradicted("x", 1.0, WHY)
    p.confirmed("x")  # it behaved in between: the count starts again
    assert not p.contradicted("x", 2.0, WHY) and not p.contradicted("x", 3.0, WHY)
    assert p.contradicted("x", 4.0, WHY)
    assert p.kept("x", 4.0) and p.kept("x", 33.9) and not p.kept("x", 34.0)
    assert not p.contradicted("x", 5.0, WHY)  # refusals while kept do not lengthen it
    assert p.deadline() == 34.0 and "backed off for 30s more" in p.describe(4.0)["x"]
    assert WHY in p.describe(4.0)["x"]
    assert p.expire(33.0) == [] and p.expire(34.0) == ["x"] and p.deadline() is None
    for t in (40.0, 41.0, 42.0):  # back, and at it again: twice as long
        started = p.contradicted("x", t, WHY)
    assert started and p.until["x"] == 42.0 + 60.0
    p.expire(200.0)
    p.confirmed("x")  # it behaves after its back-off: the next one would start from the first again
    assert "x" not in p.level


def test_a_kept_member_is_given_nothing():
    p = Probation(BackoffPolicy(refusals=1))
    p.contradicted("x", 0.0, WHY)
    target = {"a": ("t1",), "b": (), "x": ("t2", "t3", "t4")}
    out = p.apply(target, ["a", "b", "x"], 1.0)
    assert out["x"] == () and sorted(out["a"] + out["b"]) == ["t1", "t2", "t3", "t4"]
    assert len(out["a"]) == len(out["b"]) == 2  # to the least loaded
    assert p.apply(target, ["x"], 1.0) == target  # nobody else to take them: they stay
    assert p.apply(target, ["a", "b", "x"], 99.0) == target  # its back-off is over


def test_what_is_remembered_is_bounded():
    p = Probation(BackoffPolicy(refusals=2))
    for i in range(MAX_MEMBERS + 50):
        p.contradicted(f"m{i}", 0.0, WHY)
    assert len(p.refused) == MAX_MEMBERS


def _contradict(c, m: str, times: int) -> list:
    decisions: list = []
    for _ in range(times):
        decisions += c.contradicted(m, WHY)
    return decisions


def test_a_member_that_acknowledges_and_runs_nothing_is_kept_from_new_work_then_tried_again():
    c = coordinator(6, backoff_refusals=3, backoff_initial_s=30.0, backoff_max_s=960.0)
    c.on_members({"a": req("a"), "b": req("b")})
    ack(c)
    c.on_members({**c.members, "x": req("x")})  # a newcomer: the target gives it a share
    given = c.reconcile.target["x"]
    assert given, c.reconcile.target
    assert _contradict(c, "x", 2) == []  # two refusals: not yet
    decisions = _contradict(c, "x", 1)
    assert c.reconcile.target["x"] == () and not set(given) & set(c.assignment.get("x", ()))
    assert sorted(c.reconcile.target["a"] + c.reconcile.target["b"]) == [f"t{i}" for i in range(6)]
    shown = [i for d in decisions if isinstance(d, WriteGroupState) for i in d.info.ignored if i.member == "x"]
    assert shown and "backed off for 30s more" in shown[-1].reason and WHY in shown[-1].reason
    assert c.next_deadline() is not None and c.next_deadline() <= c.clock.now() + 30.0
    ack(c)  # a and b run everything; x holds nothing
    assert c.state is GroupState.STABLE and c.assignment["x"] == ()
    assert c.operations.measure_imbalance() == 0, "a back-off is no imbalance for the periodic check to undo"
    c.on_members({**c.members, "x": req("x", generation=c.reconcile.acks.epoch_of("x"), incarnation="x.1")})
    assert c.reconcile.target["x"] == (), "a rebalance while it is kept gives it nothing"

    c.clock.advance(30.0)
    c.on_tick()  # its back-off is over: it is given work again
    assert c.reconcile.target["x"], c.reconcile.target
    assert not any(i.member == "x" for i in c.info().ignored)
    _contradict(c, "x", 3)  # at it again: twice as long
    assert c.reconcile.acks.probation.until["x"] == pytest.approx(c.clock.now() + 60.0)
    assert c.reconcile.target["x"] == ()
