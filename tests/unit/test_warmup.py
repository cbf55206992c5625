"""The warm-up of a planned roll's incoming tasks, sans-IO: what a broker prepares and discards
(``broker_sim.worker.warmup.decide``), which assignments it takes the announcement from, the announcement in
the ``Assignment`` codec (an old payload without it decodes, a malformed one is refused), the roll's
announcement per receiver and the coordinator publishing it, and the no-op runner's prepared start."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from broker_sim.runners.noop import NoopRunner
from broker_sim.worker.warmup import Decision, announced, decide
from controller.protocol.cluster.roll_plan import Plan, drain_plan, incoming_of, roll_order
from controller.protocol.group.rules import COOPERATIVE, RECONCILE
from controller.protocol.group.state import GroupState
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import MAX_INCOMING, Assignment
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from tests.unit.test_reconcile import ack, coordinator, published, report, req


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


# ---- the codec ------------------------------------------------------------------------------------------
def test_an_assignment_without_incoming_decodes():
    """An assignment of a controller before the warm-up: no field, nothing announced."""
    old = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"], "revoked": []}
    a = codecs.decode(Assignment, json.dumps(old).encode())
    assert a.incoming == () and a.assigned == ("t1",)


def test_a_broker_of_an_earlier_release_reads_an_assignment_with_incoming():
    """Its codec knows no such field: the rest decodes, the field is ignored."""

    @dataclasses.dataclass(frozen=True)
    class EarlierAssignment:
        generation: int
        controller_epoch: int
        assigned: tuple[str, ...] = ()
        revoked: tuple[str, ...] = ()

    data = codecs.encode(Assignment(generation=4, controller_epoch=2, assigned=("t1",), incoming=("t2",)))
    assert codecs.decode(EarlierAssignment, data) == EarlierAssignment(4, 2, ("t1",))


def test_incoming_round_trips():
    a = Assignment(generation=4, controller_epoch=2, assigned=("t1",), incoming=("t2", "t3"))
    assert codecs.decode(Assignment, codecs.encode(a)) == a


@pytest.mark.parametrize(
    "incoming, why",
    [
        (["t2", "t2"], "twice"),
        (["t1"], "already assigned"),
        ([""], "empty"),
        (["x" * 201], "over 200"),
        ([f"t{i}" for i in range(MAX_INCOMING + 1)], f"over {MAX_INCOMING}"),
        ("t2", "expected an array"),
        ([2], "expected string"),
    ],
)
def test_a_malformed_incoming_is_refused(incoming, why):
    body = {"version": 1, "generation": 4, "controller_epoch": 2, "assigned": ["t1"], "incoming": incoming}
    with pytest.raises(PayloadError, match=why):
        codecs.decode(Assignment, json.dumps(body).encode(), "/groups/g/assignment/m")


# ---- the roll's announcement, and the coordinator publishing it ----------------------------------------------
def test_a_drain_announces_each_receiver_what_moves_to_it():
    assignment = {"a": ["t0", "t1"], "b": ["t2", "t3"], "c": ["t4", "t5"]}
    plan = drain_plan(assignment, roll_order(assignment, 1), 2)
    got = incoming_of(plan)
    assert sorted(t for ts in got.values() for t in ts) == ["t4", "t5"]
    assert all(plan.placement[t] == m for m, ts in got.items() for t in ts)
    assert incoming_of(Plan({"t0": "a"}, ())) == {}


def _stable_pair():
    """A reconciling group of two members, 4 tasks, Stable."""
    c = coordinator(4)
    c.on_members({"a": req("a")})
    ack(c)
    c.on_members({"a": c.members["a"], "b": req("b")})
    _settle(c)
    return c


def _settle(c, limit: int = 10) -> dict[str, Assignment]:
    """Every member reports what it was last published until the group is Stable; the assignments published
    on the way (the last one per member)."""
    out: dict[str, Assignment] = {}
    for _ in range(limit):
        if c.state is GroupState.STABLE:
            return out
        for m in sorted(c.members):
            out.update(published(report(c, m)))
    assert c.state is GroupState.STABLE
    return out


def test_reconcile_publishes_the_announcement_to_the_receiver_alone():
    c = _stable_pair()
    moving = c.assignment["b"][:1]
    out = published(c.on_roll_incoming({"a": moving}))
    assert set(out) == {"a"} and out["a"].incoming == moving and out["a"].assigned == c.assignment["a"]
    report(c, "a")
    assert c.state is GroupState.STABLE
    assert published(c.on_roll_incoming({"a": moving})) == {}  # nothing new: nobody written to
    # the task moves: once it is assigned to the receiver, it is no longer announced
    c.on_roll_placement({moving[0]: "a"}, "roll")
    out = _settle(c)
    assert moving[0] in c.assignment["a"] and out["a"].incoming == ()


def test_reconcile_withdraws_an_announcement_when_the_roll_ends():
    c = _stable_pair()
    moving = c.assignment["b"][:2]
    assert published(c.on_roll_incoming({"a": moving}))["a"].incoming == moving
    report(c, "a")
    out = published(c.end_roll())
    assert set(out) == {"a"} and out["a"].incoming == () and out["a"].assigned == c.assignment["a"]
    assert c.end_roll() == []  # (nothing announced any more)


def test_a_join_round_assignment_carries_the_announcement():
    from controller.protocol.records.group_messages import SyncProposal
    from tests.unit.test_reconcile import req as _req

    c = coordinator(4)
    c.on_tasks(c.tasks)
    r = {m: _req(m, protocols=(COOPERATIVE,)) for m in ("a", "b")}
    c.on_members(r)
    c.operations.incoming = {"a": ("t3",)}
    gen = c.generation
    proposal = SyncProposal(generation=gen, leader=c.leader or "a", assigned={"a": ("t0", "t1"), "b": ("t2", "t3")})
    out = published(c.on_proposal(proposal))
    assert out["a"].incoming == ("t3",) and out["b"].incoming == ()


# ---- the no-op runner's prepared start ------------------------------------------------------------------------
def _spec(t: str, **kw) -> TaskSpec:
    return TaskSpec(id=t, pipeline=NoopPipeline(kind="noop", **kw))


def test_a_prepared_noop_start_sleeps_only_the_rest_of_its_latency():
    r = NoopRunner(start_latency_s=0.4, prepare_share=0.75)
    spec = _spec("t")
    t0 = time.monotonic()
    assert r.prepare("t", spec)
    prep = time.monotonic() - t0
    assert r.prepared() == {"t"} and r.running() == set()  # prepared is not running
    t0 = time.monotonic()
    r.start("t", spec, 1)
    warm = time.monotonic() - t0
    assert 0.25 <= prep < 0.4 and warm < 0.25, (prep, warm)
    assert r.prepared() == set() and list(r.warm_starts) == ["t"]


def test_a_noop_start_of_another_spec_or_after_discard_is_cold():
    r = NoopRunner(start_latency_s=0.2, prepare_share=0.9)
    assert r.prepare("t", _spec("t"))
    t0 = time.monotonic()
    r.start("t", _spec("t", complete_after_s=5.0), 1)  # its spec changed since
    assert time.monotonic() - t0 >= 0.2 and not r.warm_starts
    assert r.prepare("u", _spec("u"))
    r.discard("u")
    r.start("u", _spec("u"), 1)
    assert not r.warm_starts


def test_a_noop_runner_without_a_share_prepares_nothing_and_kill_drops_what_it_did():
    assert not NoopRunner(start_latency_s=0.1, prepare_share=0.0).prepare("t", _spec("t"))
    r = NoopRunner(prepare_share=0.5)
    assert r.prepare("t", _spec("t"))
    r.kill()
    assert r.prepared() == set()
    with pytest.raises(ValueError):
        NoopRunner(prepare_share=1.5)
