"""The group coordinator resumed after a controller failover, sans-IO (``controller/protocol/group/failover_load.py``):
a new controller reads back the state znode, the members' requests and their assignments, and either goes on
with no rebalance (a Stable group that still matches) or rebalances, never reusing a generation. Helpers come
from ``test_coordinator``; holds across failover are in ``test_holds``."""

from __future__ import annotations

import pytest

from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.vocabulary import FOREVER, WriteGroupState
from controller.protocol.records.group_messages import Assignment, TaskDescriptor
from tests.unit.protocol.group.test_coordinator import (
    EPOCH,
    coordinator,
    only,
    rejoin_all,
    req,
    stable_group,
    states,
    sync,
    tasks,
)

# --------------------------------------------------------------------------------------------------
# controller failover: load
# --------------------------------------------------------------------------------------------------


def zk_view(c: GroupCoordinator):
    """What a new controller reads back: the state znode and each member's assignment znode."""
    assignments = {
        m: Assignment(generation=c.generation, controller_epoch=EPOCH, assigned=ts) for m, ts in c.assignment.items()
    }
    return c.info(), assignments


def fresh_controller() -> GroupCoordinator:
    new, _ = coordinator()
    new.controller_epoch = EPOCH + 1
    return new


def test_load_a_consistent_stable_group_resumes_without_a_rebalance():
    c, _, snap = stable_group()
    snap = {m: req(m, 1, gen=1, owned=c.assignment[m]) for m in snap}
    info, assignments = zk_view(c)
    new = fresh_controller()
    decisions = new.load(info, snap, dict(c.tasks), assignments)
    assert states(decisions) == ["Stable"] and new.rebalances == 0
    written = only(WriteGroupState, decisions).info
    assert (written.generation, written.controller_epoch, written.leader) == (1, EPOCH + 1, "a")
    assert written.reason == "controller failover: resumed"
    assert new.assignment == c.assignment
    # and it carries on normally: the next change rebalances into generation 2
    assert states(new.on_tasks(tasks("t1"))) == ["PreparingRebalance"] and new.join_generation == 2


def _inconsistent(kind: str):
    c, _, snap = stable_group(members=("a", "b", "c"), task_ids=("t1", "t2", "t3", "t4", "t5", "t6"))
    info, assignments = zk_view(c)
    task_map = dict(c.tasks)
    if kind == "was rebalancing":
        c.on_rebalance_request()
        info = c.info()
    elif kind == "member gone":
        del snap["c"]
    elif kind == "new member":
        snap["d"] = req("d", 2)
    elif kind == "new task":
        task_map["t7"] = TaskDescriptor("t7")
    elif kind == "member asks to rejoin":
        snap["b"] = req("b", 2, gen=1, owned=c.assignment["b"])
    elif kind == "member leaving":
        snap["b"] = req("b", 1, gen=1, owned=c.assignment["b"], leaving=True)
    elif kind == "assignment missing":
        del assignments["a"]
    return info, snap, task_map, assignments


@pytest.mark.parametrize(
    "kind",
    [
        "was rebalancing",
        "member gone",
        "new member",
        "new task",
        "member asks to rejoin",
        "member leaving",
        "assignment missing",
    ],
)
def test_load_anything_else_rebalances(kind):
    info, snap, task_map, assignments = _inconsistent(kind)
    new = fresh_controller()
    decisions = new.load(info, snap, task_map, assignments)
    assert states(decisions) == ["PreparingRebalance"]
    assert new.reason == "controller failover" and new.join_generation == info.generation + 1


def test_load_with_no_state_starts_fresh_and_with_no_members_is_empty():
    new = fresh_controller()
    decisions = new.load(None, {"a": req("a", 1)}, tasks("t1"), {})
    assert states(decisions) == ["PreparingRebalance", "AwaitingSync"]
    c, _, _ = stable_group()
    info, assignments = zk_view(c)
    new = fresh_controller()
    decisions = new.load(info, {}, dict(c.tasks), assignments)
    assert states(decisions) == ["Empty"] and new.generation == 1
    new = fresh_controller()
    assert states(new.load(None, {}, tasks("t1"), {})) == ["Empty"]


def test_load_keeps_the_generation_of_an_unfinished_round():
    c, _, snap = stable_group()
    c.on_rebalance_request()
    rejoin_all(c, snap)  # AwaitingSync at generation 2, no assignment published for it
    new = fresh_controller()
    new.load(c.info(), dict(snap), dict(c.tasks), zk_view(c)[1])
    assert new.join_generation == 3  # never reuses generation 2


@pytest.mark.parametrize("maintenance", [True, False])
def test_a_failover_in_maintenance_mode_holds_the_tasks_of_a_member_gone_meanwhile(maintenance):
    """b's session ended while no controller was active. In maintenance mode the new controller holds b's tasks
    for it, as the live path does for a member that leaves in the window: the group resumes Stable with no
    round (nothing moves), and b's tasks move once the window ends. Out of it they move at once."""
    c, _, snap = stable_group()
    snap = {m: req(m, 1, gen=1, owned=c.assignment[m]) for m in snap}
    info, assignments = zk_view(c)
    b_tasks = c.assignment["b"]
    del snap["b"]
    new = fresh_controller()
    new.operations.maintenance = maintenance
    decisions = new.load(info, dict(snap), dict(c.tasks), assignments)
    if not maintenance:
        assert states(decisions) == ["PreparingRebalance"] and not new.holds.held
        rejoin_all(new, snap)
        sync(new)
        assert set(new.assignment["a"]) == set(c.tasks)
        return
    assert states(decisions) == ["Stable"], "resumed: nothing moves in maintenance mode"
    assert new.holds.held["b"].tasks == b_tasks and new.holds.held["b"].deadline == FOREVER
    assert [h.until for h in decisions[0].info.held] == [None], "the hold is written with the state"
    assert new.assignment == {"a": c.assignment["a"]}
    after = new.on_maintenance(False)
    assert states(after)[0] == "PreparingRebalance" and not new.holds.held
