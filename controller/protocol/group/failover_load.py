"""A group resumed after a controller failover, sans-IO: what the coordinator adopts, read from what ZooKeeper
holds (the group state znode, the members' requests, the tasks, the published assignments). Pure functions: the
coordinator (:meth:`~controller.protocol.group.coordinator.GroupCoordinator.load`) adopts the record they return
and restores its parts, so the state it keeps is written in one place only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from controller.protocol.group.state import GroupState
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest, TaskDescriptor


@dataclass(frozen=True)
class Resumed:
    """The generation record a failover resumes from (``join_generation`` equals ``generation``)."""

    generation: int
    protocol: str | None
    assignor: str | None
    leader: str | None
    generation_members: tuple[str, ...] = ()
    #: the published assignments kept
    assignment: dict[str, tuple[str, ...]] = field(default_factory=dict)


def fresh_generation(members: Mapping[str, JoinRequest], assignments: Mapping[str, Assignment]) -> int:
    """No readable group state: resume above every generation the members and assignments carry, or the members
    would take the new generations for stale ones and ignore them."""
    return max([a.generation for a in assignments.values()] + [r.generation for r in members.values()] + [0])


def reconcile_record(info: GroupStateInfo, assignments: Mapping[str, Assignment]) -> Resumed:
    """A group that ran reconcile: member epochs run ahead of the state znode (it is not rewritten for every
    step), so the generation is the highest either holds."""
    generation = max([info.generation, info.join_generation - 1, 0] + [a.generation for a in assignments.values()])
    return Resumed(generation, info.protocol, info.assignor, None)


def published(
    assignments: Mapping[str, Assignment], members: Collection[str], generation: int | None = None
) -> dict[str, tuple[str, ...]]:
    """The published assignments of present members without an error (of ``generation`` when given)."""
    return {
        m: a.assigned
        for m, a in assignments.items()
        if a.error is None and m in members and (generation is None or a.generation == generation)
    }


def join_round_record(
    info: GroupStateInfo, members: Mapping[str, JoinRequest], assignments: Mapping[str, Assignment]
) -> Resumed:
    """A group of the join-round protocols: its generation as the state znode says, with the members still
    present and their assignments of that generation."""
    generation_members = tuple(m for m in info.members if m in members)
    return Resumed(
        max(info.generation, info.join_generation - 1, 0),
        info.protocol,
        info.assignor,
        info.leader,
        generation_members,
        published(assignments, generation_members, info.generation),
    )


def static_returned(
    info: GroupStateInfo, members: Mapping[str, JoinRequest], assignments: Mapping[str, Assignment]
) -> dict[str, JoinRequest]:
    """A request older than the member's assignment that asks for a later generation was answered by a static
    rejoin: it does not list the tasks given back, so it must be rewritten to count."""
    return {
        m: r
        for m, r in members.items()
        if (a := assignments.get(m)) is not None
        and a.error is None
        and a.generation == info.generation
        and r.generation < a.generation < r.join_generation
    }


def still_matches(
    info: GroupStateInfo,
    members: Mapping[str, JoinRequest],
    tasks: Mapping[str, TaskDescriptor],
    generation_members: Collection[str],
    placed: set[str],
) -> bool:
    """A Stable group whose members, placement (``placed``: assigned or held) and requests still match what
    ZooKeeper holds goes on with no rebalance."""
    return (
        info.state == GroupState.STABLE.value
        and set(generation_members) == set(members)
        and all(r.join_generation <= info.generation and not r.leaving for r in members.values())
        and placed == set(tasks)
        and not info.deferred  # moves waiting for a wave: the next generation computes them again
    )
