"""The worker's task phases, pure: every pair of phases is either a move the table allows or one it refuses
loudly (the list of legal moves is written out here, apart from the module's table), and the task table's
moves walk a slot through a task's life (start, stop, the fence's stop and restart, failures with backoff,
completion, release, a lost session, a kill). No ZooKeeper, no runner."""

from __future__ import annotations

import itertools

import pytest

from broker_sim.sim.protosim import ProtocolSim
from broker_sim.worker.phases import (
    PREDECESSORS,
    IllegalTaskTransition,
    TaskPhase,
    stop_begun,
    stop_ended,
    transition,
)
from broker_sim.worker.slots import TaskSlot, TaskTable
from controller.protocol.errors import ZkcError
from controller.protocol.tasks.spec import parse_spec

P = TaskPhase
IDLE = {P.STOPPED, P.FENCED, P.STARTING, P.RESTARTING, P.FAILED, P.COMPLETED}

#: every legal move (from, to), written out by hand: the table must say exactly this
LEGAL = (
    {(a, P.STARTING) for a in (P.STOPPED, P.FENCED, P.RESTARTING, P.FAILED, P.COMPLETED)}
    | {(a, P.RUNNING) for a in (P.STARTING, P.STOPPED, P.RESTARTING, P.FAILED, P.STOPPING, P.FENCE_STOPPING)}
    | {(P.RUNNING, P.STOPPING), (P.RUNNING, P.FENCE_STOPPING), (P.RUNNING, P.FINISHED)}
    | {(P.FENCE_STOPPING, P.FENCED), (P.FINISHED, P.COMPLETED)}
    | {(a, P.STOPPED) for a in (P.STOPPING, P.RUNNING, *IDLE)}
    | {(a, P.RESTARTING) for a in IDLE}
    | {(a, P.FAILED) for a in IDLE}
)


def test_every_phase_has_a_row_and_a_status():
    assert set(PREDECESSORS) == set(TaskPhase)
    assert PREDECESSORS[P.FAILED] == PREDECESSORS[P.RESTARTING]  # (``TaskTable.failed`` checks one for both)
    assert {p.status for p in TaskPhase} == {"STOPPED", "STARTING", "RUNNING", "COMPLETED", "RESTARTING", "FAILED"}
    assert {p for p in TaskPhase if p.runs} == {P.RUNNING, P.STOPPING, P.FENCE_STOPPING, P.FINISHED}


@pytest.mark.parametrize(
    ("current", "to"), list(itertools.product(TaskPhase, TaskPhase)), ids=lambda p: p.name if p else ""
)
def test_each_pair_is_allowed_or_refused_loudly(current: TaskPhase, to: TaskPhase):
    if (current, to) in LEGAL:
        assert transition("t1", current, to) is to
    else:
        with pytest.raises(IllegalTaskTransition, match=f"t1: no move from {current.name} to {to.name}") as err:
            transition("t1", current, to)
        assert isinstance(err.value, ZkcError) and not err.value.user_facing


def test_a_stop_says_why_and_ends_where_its_reason_leads():
    assert stop_begun(P.RUNNING, fence=False) is P.STOPPING
    assert stop_begun(P.RUNNING, fence=True) is P.FENCE_STOPPING
    # a second stop joins the first; a finished run stays COMPLETED to readers while it is stopped
    for phase in (P.STOPPING, P.FENCE_STOPPING, P.FINISHED):
        assert stop_begun(phase, fence=True) is phase and stop_begun(phase, fence=False) is phase
    assert [stop_ended(p) for p in (P.RUNNING, P.STOPPING, P.FENCE_STOPPING, P.FINISHED)] == [
        P.STOPPED,
        P.STOPPED,
        P.FENCED,
        P.COMPLETED,
    ]
    for phase in IDLE:  # not running: a late stop changes nothing
        assert stop_ended(phase) is phase
    for phase in TaskPhase:  # every move these helpers make is one the table allows (or no move at all)
        for fence in (False, True):
            if phase.runs:
                begun = stop_begun(phase, fence)
                assert begun is phase or (phase, begun) in LEGAL
                assert (begun, stop_ended(begun)) in LEGAL


# ---- the task table's moves --------------------------------------------------------------------------
SPEC = parse_spec({"id": "t1", "pipeline": {"kind": "noop"}, "restart": {"max_attempts": 1}})


def table_with(t: str = "t1", held: bool = True) -> TaskTable:
    table = TaskTable()
    table.slots[t] = TaskSlot(held=held)
    table.desired = frozenset({t})
    return table


def run(table: TaskTable, t: str = "t1") -> TaskSlot:
    """Start ``t`` and see its start return: it runs."""
    slot = table.begin_start(t, SPEC)
    table.start_done(t, slot)
    return slot


def stop(table: TaskTable, slot: TaskSlot, t: str = "t1") -> None:
    """A stop of ``t`` (not the fence's) that returns."""
    table.begin_stop(t, fence=False)
    table.stop_done(t, slot, confirmed=True)


def test_start_then_a_revocation_stop():
    table = table_with()
    assert table.starting() == {"t1"} and table.running() == []
    slot = table.begin_start("t1", SPEC)
    assert slot.state == "STARTING" and table.running_or_starting() == {"t1"}
    table.start_done("t1", slot)
    assert slot.state == "RUNNING" and table.running() == ["t1"] and table.starting() == frozenset()
    assert table.begin_stop("t1", fence=False) is slot
    assert slot.phase is P.STOPPING and slot.state == "RUNNING" and table.starting() == {"t1"}
    table.stop_done("t1", slot, confirmed=True)
    assert slot.phase is P.STOPPED and not slot.running and slot.stopping == 0 and slot.stops == 1
    assert table.begin_stop("t1", fence=False) is None  # nothing runs: nothing to stop


def test_the_fence_stops_a_task_that_starts_again_once_it_lifts():
    table = table_with()
    slot = table.begin_start("t1", SPEC)
    table.start_done("t1", slot)
    table.begin_stop("t1", fence=True)
    assert slot.phase is P.FENCE_STOPPING
    table.begin_stop("t1", fence=False)  # a revocation's stop joins the fence's
    table.stop_done("t1", slot, confirmed=True)
    assert slot.phase is P.FENCED and slot.state == "STOPPED" and table.starting() == {"t1"}
    table.stop_done("t1", slot, confirmed=True)  # the second stop returns: nothing more changes
    assert slot.phase is P.FENCED and slot.stopping == 0
    table.begin_start("t1", SPEC)  # the lift's reconcile starts it again
    assert slot.phase is P.STARTING


def test_a_stop_that_raises_leaves_the_task_running():
    table = table_with()
    slot = run(table)
    table.begin_stop("t1", fence=False)
    table.stop_done("t1", slot, confirmed=False)
    assert slot.phase is P.RUNNING and slot.running


def test_failures_back_off_then_fail_for_good_and_start_refuses_a_running_task():
    table = table_with()
    slot = table.begin_start("t1", SPEC)
    _, delay = table.failed("t1", "boom", "trace", "ValueError", permanent=False)
    assert slot.phase is P.RESTARTING and delay == pytest.approx(0.5) and slot.restart_at is not None
    table.begin_start("t1", SPEC)
    table.start_done("t1", slot)
    assert slot.error is None and slot.failures == 1
    # running again, it still says why it failed last
    assert slot.last_failure is not None and slot.last_failure.kind == "ValueError"
    assert (slot.last_failure.error, slot.last_failure.trace, slot.last_failure.restarts) == ("boom", "trace", 0)
    with pytest.raises(IllegalTaskTransition):  # a running task is never started again
        table.begin_start("t1", SPEC)
    with pytest.raises(IllegalTaskTransition):  # nor failed while its runner runs: it is stopped first
        table.failed("t1", "boom", None, "ValueError", permanent=False)
    table.begin_stop("t1", fence=False)
    table.stop_done("t1", slot, confirmed=True)
    _, delay = table.failed("t1", "boom again", None, "", permanent=False)
    assert delay is None and slot.phase is P.FAILED and slot.restart_at is None and slot.error == "boom again"
    assert slot.last_failure is not None and (slot.last_failure.kind, slot.last_failure.restarts) == ("Error", 1)


def test_a_finished_run_is_completed_once_stopped_and_a_stale_reading_is_ignored():
    table = table_with()
    slot = table.begin_start("t1", SPEC)
    table.start_done("t1", slot)
    table.ended("t1", slot, stops=slot.stops + 1)  # read before a stop that began since: stale
    assert slot.phase is P.RUNNING
    table.ended("t1", slot, stops=slot.stops)
    assert slot.phase is P.FINISHED and slot.state == "COMPLETED" and slot.running
    table.begin_stop("t1", fence=True)
    assert slot.state == "COMPLETED"  # being stopped, still COMPLETED to a reader
    table.stop_done("t1", slot, confirmed=True)
    assert slot.phase is P.COMPLETED and not slot.running
    table.restarted("t1", SPEC)  # `task restart`: it starts again
    assert slot.phase is P.STOPPED


def test_release_lost_session_and_kill():
    table = table_with()
    slot = run(table)
    stop(table, slot)
    assert table.releasing("t1").releasing and slot.phase is P.STOPPED
    table.slots["t2"] = other = TaskSlot(held=True)
    table.begin_start("t2", SPEC)
    table.failed("t2", "x", None, "SpecError", permanent=True)
    table.releasing("t2")
    assert other.phase is P.FAILED  # a FAILED task's last status says FAILED
    table.session_lost()
    assert not slot.held and not other.held and other.phase is P.STOPPED
    table.slots["t3"] = third = TaskSlot(held=True)
    table.begin_start("t3", SPEC)
    table.start_done("t3", third)
    table.killed("t3", third)
    assert third.phase is P.STOPPED and table.running() == []


def test_the_protocol_simulation_moves_phases_through_this_table():
    """Its seeded schedules check the table (invariant 6): a move the table refuses is recorded, not skipped."""
    sim = ProtocolSim(7)
    result = sim.run()
    assert not result.violations
    moved = {p for node in sim.nodes.values() for p in node.phases.values()}
    assert P.RUNNING in moved  # tasks ran, so their phases moved
    node = next(iter(sim.nodes.values()))
    node.phases["t0"] = P.RUNNING
    sim.move(node, "m0", "t0", P.STARTING)
    assert [(v.invariant, v.detail) for v in sim.violations] == [(6, "task t0 on m0: no move from RUNNING to STARTING")]
