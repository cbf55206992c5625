"""The controller's load check, sans-IO: a load-balanced group is rebalanced for load only once the imbalance has
lasted a whole window, a burst shorter than that moves nothing, a task moved for load stays put for a window,
a broker's claim about another broker's task is ignored, and maintenance holds everything."""

from __future__ import annotations

from controller.protocol.clock import FakeClock
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.load_balance import LoadWatch
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records.group_messages import JoinRequest, SyncProposal, TaskDescriptor

HEAVY = ("h1", "h2", "h3")
SKEWED = {"a": ("h1", "h2", "h3"), "b": ("l0", "l1", "l2"), "c": ("l3", "l4", "l5")}


def _req(m: str, jg: int, g: int) -> JoinRequest:
    return JoinRequest(
        member_id=m, join_generation=jg, generation=g, protocols=("eager",), assignors=("load-balanced",)
    )


def _stable_skewed(window_s: float = 30.0) -> tuple[GroupCoordinator, FakeClock]:
    clock = FakeClock()
    config = GroupConfig(
        rebalance_timeout_s=5, default_assignor="load-balanced", load_window_s=window_s, load_check_s=5
    )
    c = GroupCoordinator(group="g", controller_epoch=1, clock=clock, wall=clock, config=config)
    c.on_tasks({t: TaskDescriptor(task_id=t) for ts in SKEWED.values() for t in ts})
    c.on_members({m: _req(m, 1, 0) for m in SKEWED})
    c.on_proposal(SyncProposal(generation=c.generation, leader=c.leader, assigned=SKEWED))
    c.operations.moving.clear()
    assert c.state is GroupState.STABLE
    return c, clock


def _report(c: GroupCoordinator, heavy: float = 0.9) -> None:
    figures = {m: {t: (heavy if t in HEAVY else 0.05) for t in ts} for m, ts in SKEWED.items()}
    c.on_load_reports(figures)


def _ticks(c: GroupCoordinator, clock: FakeClock, seconds: float) -> None:
    for _ in range(int(seconds / 5)):
        clock.advance(5.0)
        c.on_tick()


def test_a_lasting_imbalance_is_rebalanced_after_the_window_and_explained() -> None:
    c, clock = _stable_skewed()
    _report(c)
    _ticks(c, clock, 30)
    assert c.state is GroupState.STABLE  # 25 s of imbalance seen so far: not yet
    _ticks(c, clock, 5)
    assert c.state is GroupState.PREPARING_REBALANCE and c.reason.startswith("load: a +")
    assert "moving h1 a->b" in c.reason
    assert c.operations.load.last_plan[0].startswith("mean load")
    descriptors = {d.task_id: d for d in c.operations.descriptors(c.members)}
    assert descriptors["h1"].load == 0.9 and not descriptors["h1"].moved_recently  # free to move in this round
    assert descriptors["l0"].load == 0.05


def test_a_task_that_moved_stays_put_for_a_window_whatever_moved_it() -> None:
    c, clock = _stable_skewed()
    c.operations.descriptors(c.members)  # (the first look: where every task runs)
    c.on_members({m: _req(m, 2, 1) for m in SKEWED})
    moved = {"a": ("h2", "h3"), "b": ("h1", "l0", "l1", "l2"), "c": SKEWED["c"]}
    c.on_proposal(SyncProposal(generation=c.generation, leader=c.leader, assigned=moved))
    clock.advance(1.0)
    descriptors = {d.task_id: d for d in c.operations.descriptors(c.members)}
    assert descriptors["h1"].moved_recently and not descriptors["h2"].moved_recently
    clock.advance(30.0)
    assert not {d.task_id: d for d in c.operations.descriptors(c.members)}["h1"].moved_recently


def test_a_burst_shorter_than_the_window_moves_nothing() -> None:
    c, clock = _stable_skewed()
    _report(c)
    _ticks(c, clock, 20)
    _report(c, heavy=0.05)  # the burst ends: every task light again
    _ticks(c, clock, 10)
    _report(c)  # and comes back: the window starts over
    _ticks(c, clock, 25)
    assert c.state is GroupState.STABLE


def test_maintenance_holds_the_load_check() -> None:
    c, clock = _stable_skewed()
    _report(c)
    c.on_maintenance(True)
    _ticks(c, clock, 60)
    assert c.state is GroupState.STABLE


def test_a_claim_about_another_broker_s_task_is_ignored() -> None:
    watch = LoadWatch()
    watch.on_reports({"a": {"h1": 0.9, "l0": 10.0}, "b": {"l0": 0.05}})
    assert watch.loads({"a": ("h1",), "b": ("l0",)}) == {"h1": 0.9, "l0": 0.05}


def test_a_recent_move_is_forgotten_after_the_window() -> None:
    watch = LoadWatch(window_s=10.0)
    watch.note_moves(["t"], now=100.0)
    (d,) = watch.descriptors([TaskDescriptor("t")], 105.0, {})
    assert d.moved_recently
    (d,) = watch.descriptors([TaskDescriptor("t")], 111.0, {})
    assert not d.moved_recently
