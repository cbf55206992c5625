"""Operating a live cluster against a real ZooKeeper and real workers: the move throttle's waves, maintenance
mode (manual and automatic), preferred placement, and the settings' refusals. The throttle is checked
from the workers' own run intervals (``broker_sim.sim.checker``), not from what the controller says it did."""

from __future__ import annotations

import time

import pytest

from broker_sim.sim.checker import concurrent_moves, move_runs
from controller.admin import AdminClient
from controller.admin.common import NotFound
from controller.admin.operations import SettingError
from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records.group_messages import MemberMetadata, TaskDescriptor
from tests.controller_support import create_tasks, group_state
from tests.waiting import wait_until

START_S = 0.6  # a slow start, so that moves in flight overlap unless something holds them apart


def _intervals(cluster):
    return [i for w in cluster.workers for i in list(w.intervals) + w.open_intervals()]


def _running(workers) -> dict[str, set[str]]:
    return {w.id: w.running_tasks() for w in workers}


def _settled(zk, layout, n_tasks, workers):
    s = group_state(zk, layout)
    run = _running(workers)
    return (
        s is not None
        and s.state == "Stable"
        and not s.moving
        and not s.deferred
        and sum(map(len, run.values())) == n_tasks
        and len(set().union(*run.values())) == n_tasks
    )


def _worker(cluster, wid, **kw):
    return cluster.worker(wid, runner_options={"start_latency_s": START_S}, status_interval_s=0.1, **kw)


def test_a_throttled_rebalance_moves_in_waves_and_an_unthrottled_one_does_not(cluster, zk, layout):
    ctl = cluster.controller("c1", group=GroupConfig(rebalance_timeout_s=10))
    admin = AdminClient(zk, layout)
    ids = [f"t{i:02d}" for i in range(12)]
    create_tasks(zk, layout, ids)
    workers = [_worker(cluster, "w1"), _worker(cluster, "w2")]
    wait_until(lambda: _settled(zk, layout, 12, workers), 30, "12 tasks running on two brokers")

    admin.update_settings({"max_moves": 2, "max_moves_per_broker": 2})
    wait_until(
        lambda: (
            ctl.ctx.groups["default"].operations.limits.max_moves_per_broker == 2
            and ctl.ctx.settings.throttle.max_moves == 2
        ),
        10,
        "the controller sees the throttle",
    )
    mark = time.time()
    workers.append(_worker(cluster, "w3"))
    wait_until(
        lambda: _settled(zk, layout, 12, workers) and len(workers[2].running_tasks()) == 4,
        60,
        "w3 runs its share, wave after wave",
    )
    moves = move_runs(_intervals(cluster), (mark, time.time()))
    most, per = concurrent_moves(moves)
    assert len(moves) == 4, moves
    assert most <= 2 and max(per.values()) <= 2, (most, per, moves)
    assert group_state(zk, layout).generation >= 3  # the join, then at least one more wave

    admin.reset_settings()  # the control: the same kind of change with no throttle overlaps its moves
    wait_until(lambda: ctl.ctx.settings.throttle.max_moves is None, 10, "the throttle gone")
    mark = time.time()
    workers.append(_worker(cluster, "w4"))
    wait_until(
        lambda: _settled(zk, layout, 12, workers) and len(workers[3].running_tasks()) == 3, 60, "w4 runs its share"
    )
    most, _ = concurrent_moves(move_runs(_intervals(cluster), (mark, time.time())))
    assert most == 3


def test_maintenance_freezes_placement_and_a_lost_brokers_tasks_wait_for_it(cluster, zk, layout):
    cluster.controller("c1", group=GroupConfig(rebalance_timeout_s=10))
    admin = AdminClient(zk, layout)
    ids = [f"t{i}" for i in range(6)]
    create_tasks(zk, layout, ids)
    w1, w2 = _worker(cluster, "w1"), _worker(cluster, "w2")
    wait_until(lambda: _settled(zk, layout, 6, [w1, w2]), 30, "6 tasks on two brokers")
    on = admin.set_maintenance(True, "replacing a disk")
    assert on.on and on.by == "operator"
    wait_until(lambda: group_state(zk, layout).maintenance, 10, "the group in maintenance")
    mark = time.time()
    lost = w2.running_tasks()
    w2.kill()
    wait_until(
        lambda: any(h.until is None and set(h.tasks) == lost for h in group_state(zk, layout).held),
        15,
        "w2's tasks held for it, without a deadline",
    )
    time.sleep(2.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert w1.running_tasks() == set(ids) - lost  # nothing piled onto the survivor
    st = admin.status(full=True)
    assert st.maintenance["on"] and st.tasks["unowned"] == len(lost)
    assert st.groups[0].held == len(lost)
    # a new broker gets nothing while it lasts; the lost one gets its own tasks back
    w3 = _worker(cluster, "w3")
    w2b = _worker(cluster, "w2")
    wait_until(lambda: w2b.running_tasks() == lost, 20, "w2 back with its own tasks")
    time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert w3.running_tasks() == set() and w1.running_tasks() == set(ids) - lost
    assert move_runs(_intervals(cluster), (mark, time.time())) == []
    off = admin.set_maintenance(False)
    assert not off.on
    wait_until(
        lambda: _settled(zk, layout, 6, [w1, w2b, w3]) and len(w3.running_tasks()) == 2,
        30,
        "the postponed join happens once maintenance ends",
    )


def test_losing_too_many_brokers_at_once_turns_maintenance_on_by_itself(cluster, zk, layout):
    ctl = cluster.controller("c1", group=GroupConfig(rebalance_timeout_s=10))
    admin = AdminClient(zk, layout)
    admin.update_settings({"max_offline_brokers": 1, "offline_window_s": 60})
    ids = [f"t{i}" for i in range(8)]
    create_tasks(zk, layout, ids)
    ws = [_worker(cluster, f"w{i}") for i in range(1, 5)]
    wait_until(lambda: _settled(zk, layout, 8, ws), 30, "8 tasks on four brokers")
    survivors_before = _running(ws[:2])
    lost3, lost4 = ws[2].running_tasks(), ws[3].running_tasks()
    ws[2].kill()
    ws[3].kill()
    wait_until(lambda: admin.maintenance().on, 15, "maintenance on by itself")
    m = admin.maintenance()
    assert m.by == "auto" and m.offline == ("w3", "w4") and "2 brokers lost" in m.reason
    time.sleep(2.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert _running(ws[:2]) == survivors_before  # a rack loss does not pile everything on the survivors
    w3 = _worker(cluster, "w3")  # one back: 1 still offline, within the limit, so it ends by itself
    wait_until(lambda: not admin.maintenance().on, 20, "automatic maintenance ends")
    assert ctl.ctx.maintenance.by == "auto"
    everyone = [*ws[:2], w3]
    wait_until(lambda: _settled(zk, layout, 8, everyone), 30, "w4's tasks placed once it ends")
    assert lost3 <= w3.running_tasks() | set().union(*_running(ws[:2]).values())
    assert lost4 <= set().union(*_running(everyone).values())


def test_rebalance_preferred_restores_the_assignors_layout_in_throttled_waves(cluster, zk, layout):
    ctl = cluster.controller("c1", group=GroupConfig(rebalance_timeout_s=10))
    admin = AdminClient(zk, layout)
    ids = [f"t{i}" for i in range(9)]
    create_tasks(zk, layout, ids)
    w1 = _worker(cluster, "w1")
    wait_until(lambda: _settled(zk, layout, 9, [w1]), 30, "9 tasks on w1")
    w2 = _worker(cluster, "w2")
    w3 = _worker(cluster, "w3")
    ws = [w1, w2, w3]
    wait_until(lambda: _settled(zk, layout, 9, ws) and all(len(w.running_tasks()) == 3 for w in ws), 60, "balanced")
    coord = ctl.ctx.groups["default"]
    preferred = get_assignor(coord.assignor).assign(
        [MemberMetadata(member_id=w.id) for w in ws], [TaskDescriptor(task_id=t) for t in ids], {}
    )
    off = sum(1 for w in ws for t in w.running_tasks() if t not in preferred[w.id])
    assert off > 0, "the sticky layout after joins should differ from the layout from scratch"
    admin.update_settings({"max_moves": 1})
    wait_until(lambda: ctl.ctx.settings.throttle.max_moves == 1, 10, "the throttle in force")
    mark = time.time()
    admin.rebalance("default", reason="test", preferred=True)
    wait_until(
        lambda: _settled(zk, layout, 9, ws) and all(w.running_tasks() == set(preferred[w.id]) for w in ws),
        60,
        "every task where the assignor puts it from scratch",
    )
    moves = move_runs(_intervals(cluster), (mark, time.time()))
    assert len(moves) == off and concurrent_moves(moves)[0] == 1, moves
    assert coord.operations.measure_imbalance() == 0 and not coord.operations.preferred


@pytest.mark.parametrize(
    "changes, group, message",
    [
        ({"max_moves": 0}, None, "max_moves: 0 is not a whole number >= 1"),
        ({"max_moves": "ten"}, None, "max_moves: 'ten' is not a whole number >= 1"),
        ({"max_offline_fraction": 1.5}, None, "max_offline_fraction: 1.5 is not a fraction in (0, 1]"),
        ({"max_moves_per_broker": True}, None, "is not a whole number >= 1"),
        ({"offline_window_s": None}, None, "offline_window_s: None is not seconds from 1 to 604800"),
        ({"preferred_check_s": 1e-9}, None, "preferred_check_s: 1e-09 is not seconds from 1 to 604800, or 0: never"),
        ({"max_moves": 99999999999999999999999}, None, "max_moves: 99999999999999999999999 is not a whole number >= 1"),
        ({"bogus": 1}, None, "unknown setting 'bogus'"),
        ({"max_offline_brokers": 2}, "g1", "only max_moves and max_moves_per_broker are set per group"),
    ],
)
def test_a_bad_setting_is_refused_and_changes_nothing(zk, layout, changes, group, message):
    admin = AdminClient(zk, layout)
    admin.update_settings({"max_moves": 3})
    before = zk.get(layout.settings)
    with pytest.raises(SettingError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        admin.update_settings(changes, group=group)
    assert zk.get(layout.settings)[0] == before[0]


def test_group_throttles_are_kept_per_group(zk, layout):
    admin = AdminClient(zk, layout)
    before = zk.get(layout.settings)[0] if zk.exists(layout.settings) else None
    with pytest.raises(NotFound, match="unknown group 'etl'"):  # no such group: nothing stored
        admin.update_settings({"max_moves": 4}, group="etl")
    assert (zk.get(layout.settings)[0] if zk.exists(layout.settings) else None) == before
    zk.ensure_path(layout.group("etl"))
    s = admin.update_settings({"max_moves": 4}, group="etl")
    s = admin.update_settings({"max_moves_per_broker": 1})
    assert s.group_throttle["etl"].max_moves == 4 and s.throttle.max_moves_per_broker == 1
    s = admin.update_settings({"max_moves": None}, group="etl")
    assert "etl" not in s.group_throttle
