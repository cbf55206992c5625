"""The warm-up of a planned roll's incoming tasks on the broker, sans-IO: what it prepares and discards
(``broker_sim.worker.warmup.decide``) and which assignments it takes the announcement from."""

from __future__ import annotations

from broker_sim.worker.warmup import Decision, announced, decide
from controller.protocol.group.rules import COOPERATIVE, RECONCILE
from controller.protocol.records.group_messages import Assignment


# ---- what to prepare, what to discard ---------------------------------------------------------------------
def _decide(incoming=(), prepared=None, preparing=(), desired=(), running=(), expired=(), now=100.0, **kw):
    return decide(incoming, prepared or {}, preparing, desired, running, expired, now, **kw)


def test_announced_tasks_not_run_nor_prepared_are_prepared():
    d = _decide(incoming=("a", "b", "c", "d"), prepared={"a": 99.0}, preparing=("b",), running=("c",))
    assert d == Decision(prepare=("d",))


def test_a_task_already_assigned_is_not_prepared():
    """Its start is under way already: a prepare would only race it."""
    assert _decide(incoming=("a",), desired=("a",)).prepare == ()


def test_a_prepared_task_that_arrived_is_forgotten_not_discarded():
    d = _decide(incoming=(), prepared={"a": 99.0}, desired=("a",), running=("a",))
    assert d == Decision(arrived=("a",))


def test_a_prepared_task_assigned_and_not_started_yet_is_kept():
    """(it waits for its owner znode: its start takes what was prepared)"""
    assert _decide(incoming=(), prepared={"a": 1.0}, desired=("a",), now=1000.0) == Decision()


def test_a_prepared_task_no_longer_announced_is_discarded():
    d = _decide(incoming=("b",), prepared={"a": 99.0, "b": 99.0})
    assert d.discard == ("a",) and d.prepare == ()


def test_a_prepared_task_that_did_not_arrive_within_the_bound_is_discarded():
    d = _decide(incoming=("a", "b"), prepared={"a": 10.0, "b": 90.0}, now=100.0, ttl_s=60.0)
    assert d.discard == ("a",)


def test_a_task_discarded_for_age_is_not_prepared_again_while_announced():
    assert _decide(incoming=("a",), expired=("a",)).prepare == ()


def test_prepares_are_bounded():
    announced = ("p", "q", *(f"t{i}" for i in range(10)))
    d = _decide(incoming=announced, prepared={"p": 99.0}, preparing=("q",), limit=5)
    assert d.prepare == ("t0", "t1", "t2")


def test_fenced_everything_prepared_is_discarded_and_nothing_prepared():
    d = _decide(incoming=("a", "b"), prepared={"b": 99.0, "c": 99.0}, desired=("c",), fenced=True)
    assert d == Decision(discard=("b", "c"))


# ---- which assignment announces ---------------------------------------------------------------------------
def test_the_announcement_is_taken_from_the_members_own_assignment_only():
    a = Assignment(generation=7, controller_epoch=1, protocol=RECONCILE, incarnation="me", incoming=("t1", "t2"))
    assert announced(a, 7, "me") == ("t1", "t2")
    assert announced(a, 8, "me") is None  # stale
    assert announced(a, 7, "an earlier life") is None
    err = Assignment(generation=7, controller_epoch=1, protocol=RECONCILE, incarnation="me", error="X")
    assert announced(err, 7, "me") is None
    coop = Assignment(generation=3, controller_epoch=1, protocol=COOPERATIVE, incoming=("t1",))
    assert announced(coop, 3, "whatever") == ("t1",)


def test_an_announced_id_that_names_no_task_is_left_out():
    a = Assignment(generation=1, controller_epoch=1, protocol=COOPERATIVE, incoming=("ok", "../x", "a b"))
    assert announced(a, 1, "") == ("ok",)
