"""A group resumed after a controller failover, sans-IO: the coordinator's state rebuilt from what ZooKeeper
holds (the group state znode, the members' requests, the tasks, the published assignments). A group that still
matches goes on without a rebalance; a reconciling one goes on reconciling; any other rebalances. Used once per
group by :meth:`~controller.protocol.group.coordinator.GroupCoordinator.load`, through the few things it needs of the
coordinator (:class:`LoadCore`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from controller.protocol.group.join_round import JoinRound
from controller.protocol.group.operations import GroupOperations
from controller.protocol.group.reconcile import ReconcileGroup
from controller.protocol.group.rules import RECONCILE
from controller.protocol.group.state import GroupState, GroupStateMachine
from controller.protocol.group.vocabulary import Decision, GroupCore, WatchMoves, WriteGroupState
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest, TaskDescriptor


class LoadCore(GroupCore, Protocol):
    """What a failover load needs of the coordinator beyond ``GroupCore``: the rest of its generation record,
    its members and tasks (set from ZooKeeper), and the parts it restores (the state machine, the join round,
    the reconcile protocol, the moves under way)."""

    join_generation: int
    members: dict[str, JoinRequest]
    tasks: dict[str, TaskDescriptor]

    @property
    def machine(self) -> GroupStateMachine: ...
    @property
    def join(self) -> JoinRound: ...
    @property
    def reconcile(self) -> ReconcileGroup: ...
    @property
    def operations(self) -> GroupOperations: ...

    def all_prefer_reconcile(self, requests: Mapping[str, JoinRequest]) -> bool: ...


def load(
    core: LoadCore,
    info: GroupStateInfo | None,
    members: Mapping[str, JoinRequest],
    tasks: Mapping[str, TaskDescriptor],
    assignments: Mapping[str, Assignment],
) -> list[Decision]:
    """Resume a group after controller failover from what ZooKeeper holds.

    A group that was Stable and still matches (same members, every task placed, no pending join)
    stays Stable with no rebalance; anything else rebalances (reason: controller failover).
    """
    core.members = dict(members)
    core.tasks = dict(tasks)
    if info is not None and info.protocol == RECONCILE:
        return _load_reconcile(core, info, assignments)
    if info is not None:
        resumed = _load_join_round(core, info, assignments)
        if resumed is not None:
            return resumed
    else:
        core.machine.restore(GroupState.EMPTY)
        # no readable state: resume above every generation the members and assignments carry, or the
        # members would take the new generations for stale ones and ignore them
        core.generation = max(
            [a.generation for a in assignments.values()] + [r.generation for r in members.values()] + [0]
        )
        core.join_generation = core.generation
    if not core.members:
        if core.state is GroupState.STABLE:
            core.transition(GroupState.PREPARING_REBALANCE)
            core.transition(GroupState.EMPTY)
            core.generation_members, core.leader = (), None
        return [WriteGroupState(core.info())]
    return core.prepare_rebalance("controller failover")


def _load_reconcile(core: LoadCore, info: GroupStateInfo, assignments: Mapping[str, Assignment]) -> list[Decision]:
    """Failover of a group that ran reconcile: it goes on reconciling, or (a member that cannot reconcile,
    or no members) goes through a join round as for the other protocols."""
    # member epochs run ahead of the state znode (it is not rewritten for every step)
    core.generation = max([info.generation, info.join_generation - 1, 0] + [a.generation for a in assignments.values()])
    core.join_generation = core.generation
    core.protocol, core.assignor, core.leader = info.protocol, info.assignor, None
    core.holds.restore(info)
    core.holds.hold_lost(info, assignments, None)
    if (
        info.state in (GroupState.RECONCILING.value, GroupState.STABLE.value)
        and core.members
        and core.all_prefer_reconcile(core.members)
    ):
        core.generation_members = tuple(sorted(core.members))
        core.machine.restore(GroupState.RECONCILING)
        return core.reconcile.load(assignments)
    core.assignment = {m: a.assigned for m, a in assignments.items() if m in core.members and a.error is None}
    core.generation_members = tuple(m for m in info.members if m in core.members)
    core.machine.restore(GroupState.STABLE)
    if not core.members:
        core.transition(GroupState.PREPARING_REBALANCE)
        core.transition(GroupState.EMPTY)
        core.generation_members = ()
        return [WriteGroupState(core.info())]
    return core.prepare_rebalance("controller failover")


def _load_join_round(
    core: LoadCore, info: GroupStateInfo, assignments: Mapping[str, Assignment]
) -> list[Decision] | None:
    """Failover of a group of the join-round protocols: the decisions of a Stable group that still matches
    what ZooKeeper holds (it goes on with no rebalance), else None (Stable restored, to rebalance from)."""
    core.generation = max(info.generation, info.join_generation - 1, 0)
    core.join_generation = core.generation
    core.protocol, core.assignor, core.leader = info.protocol, info.assignor, info.leader
    core.generation_members = tuple(m for m in info.members if m in core.members)
    core.assignment = {
        m: a.assigned
        for m, a in assignments.items()
        if a.generation == info.generation and a.error is None and m in core.generation_members
    }
    core.holds.restore(info)
    core.holds.hold_lost(info, assignments, info.generation)
    core.operations.resume_moves(info.moving, {t: m for m, ts in core.assignment.items() for t in ts})
    # a request older than the member's assignment that asks for a later generation was answered
    # by a static rejoin: it does not list the tasks given back, so it must be rewritten to count
    core.join.static_returned = {
        m: r
        for m, r in core.members.items()
        if (a := assignments.get(m)) is not None
        and a.error is None
        and a.generation == info.generation
        and r.generation < a.generation < r.join_generation
    }
    consistent = (
        info.state == GroupState.STABLE.value
        and set(core.generation_members) == set(core.members)
        and all(r.join_generation <= info.generation and not r.leaving for r in core.members.values())
        and {t for ts in core.assignment.values() for t in ts} | core.holds.tasks() == set(core.tasks)
        and not info.deferred  # moves waiting for a wave: the next generation computes them again
    )
    core.machine.restore(GroupState.STABLE, resumed=True)
    if not consistent:
        return None
    core.reason = "controller failover: resumed"
    decisions: list[Decision] = [WriteGroupState(core.info())]
    if core.operations.moving:
        decisions.append(WatchMoves(tuple(sorted(core.operations.moving))))
    return decisions
