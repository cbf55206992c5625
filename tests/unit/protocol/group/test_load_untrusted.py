"""A broker's load report is a claim: on the controller's side an absurd one (1e300 for every task it runs) is
bounded where it is read, and the load check it causes moves no more than the move throttle lets through, one
wave at a time; the tasks it did not claim for stay where they run."""

from __future__ import annotations

from controller.protocol.clock import FakeClock
from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import JoinRequest, MemberMetadata, SyncProposal, TaskDescriptor
from controller.protocol.tasks.load import MAX_LOAD_SHARE, broker_figures

START = {"liar": tuple(f"h{i}" for i in range(6)), "b": ("l0", "l1"), "c": ("l2", "l3")}


def _req(m: str, jg: int, g: int) -> JoinRequest:
    return JoinRequest(
        member_id=m, join_generation=jg, generation=g, protocols=("eager",), assignors=("load-balanced",)
    )


def _stable(limit: int) -> tuple[GroupCoordinator, FakeClock]:
    clock = FakeClock()
    config = GroupConfig(rebalance_timeout_s=5, default_assignor="load-balanced", load_window_s=10, load_check_s=5)
    c = GroupCoordinator(group="g", controller_epoch=1, clock=clock, wall=clock, config=config)
    c.on_tasks({t: TaskDescriptor(task_id=t) for ts in START.values() for t in ts})
    c.on_members({m: _req(m, 1, 0) for m in START})
    c.on_proposal(SyncProposal(generation=c.generation, leader=c.leader, assigned=START))
    c.operations.moving.clear()
    c.on_settings(MoveLimits(max_moves=limit), preferred_check_s=0, max_imbalance=0)
    assert c.state is GroupState.STABLE
    return c, clock


def _round(c: GroupCoordinator) -> dict[str, str]:
    """Every member rejoins; the leader proposes the load-balanced assignor's placement; task -> member after."""
    jg = c.join_generation
    c.on_members({m: _req(m, jg, c.generation) for m in START})
    members = [MemberMetadata(member_id=m) for m in sorted(START)]
    target = get_assignor("load-balanced").assign(members, c.operations.descriptors(c.members), c.assignment)
    c.on_proposal(SyncProposal(generation=c.generation, leader=c.leader, assigned=target))
    return {t: m for m, ts in c.assignment.items() for t in ts}


def test_an_absurd_report_moves_no_more_than_the_throttle_allows() -> None:
    c, clock = _stable(limit=2)
    raw = {"cpu_percent": 1e300, "tasks": {t: 1e300 for t in START["liar"]}}
    figures = broker_figures(raw)
    assert set(figures.tasks.values()) == {MAX_LOAD_SHARE} and figures.problems  # bounded, and said so
    light = {m: {t: 0.1 for t in ts} for m, ts in START.items() if m != "liar"}
    c.on_load_reports({"liar": dict(figures.tasks), **light})
    for _ in range(3):  # the imbalance lasts the window: the load check asks for a rebalance
        clock.advance(5.0)
        c.on_tick()
    assert c.state is GroupState.PREPARING_REBALANCE and c.reason.startswith("load: liar +"), c.reason
    before = {t: m for m, ts in START.items() for t in ts}
    after = _round(c)
    moved = {t for t, m in after.items() if before[t] != m}
    assert 0 < len(moved) <= 2, moved  # the throttle's wave, not everything the claim asked for
    assert moved <= set(START["liar"])  # only tasks of the claim move; the others stay where they run
    assert len(c.operations.moving) == len(moved)
