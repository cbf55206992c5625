"""The move throttle and maintenance mode, sans-IO: which of a proposal's moves go out in this wave.

A *move* is a task starting on a member that did not run it (it was revoked from another, its owner left,
or it is new), from the decision until the new owner reports it running. The leader's assignor proposes
the whole target; the controller lets through at most what the limits leave room for, and sends every
other task back where it was (its previous owner keeps it, or it stays unassigned until a later wave).
Stops are never throttled: a paused or deleted task is let go at once. Maintenance mode is the same
planner with no room at all: nothing moves and nothing gains an owner.

This is Helix's ``StateTransitionThrottleConfig`` and Kafka's reassignment throttles in one rule: the
number of moves in flight, per group (or cluster) and per broker.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from controller.protocol.records.admin_records import MoveLimits
from controller.protocol.records.group_messages import JoinRequest, TaskDescriptor


@dataclass(frozen=True)
class Move:
    """A task in flight: from ``source`` (None: nobody ran it) to ``dest`` (None: revoked, the next
    generation names its owner)."""

    task: str
    source: str | None
    dest: str | None
    since: float


@dataclass(frozen=True)
class Wave:
    """What the controller publishes for one generation, and what it keeps for later."""

    assigned: dict[str, tuple[str, ...]]
    revoked: dict[str, tuple[str, ...]]
    moving: dict[str, Move]  # every move in flight after this wave (old ones included)
    deferred: tuple[str, ...]  # tasks whose move waits for a later wave


def combine(*limits: MoveLimits | None) -> MoveLimits:
    """The tightest of several limits (cluster and group settings both hold)."""

    def least(values: Iterable[int | None]) -> int | None:
        vs = [v for v in values if v is not None]
        return min(vs) if vs else None

    ls = [x for x in limits if x is not None]
    return MoveLimits(
        max_moves=least(x.max_moves for x in ls), max_moves_per_broker=least(x.max_moves_per_broker for x in ls)
    )


def broker_load(moving: Mapping[str, Move]) -> dict[str, int]:
    """Moves in flight into each member (a stop is never throttled; starting is what costs a broker)."""
    load: dict[str, int] = {}
    for mv in moving.values():
        if mv.dest is not None:
            load[mv.dest] = load.get(mv.dest, 0) + 1
    return load


class Throttle(Protocol):
    """What a coordinator's protocol part needs of its group's throttle (``GroupOperations`` has it)."""

    @property
    def maintenance(self) -> bool: ...
    @property
    def moving(self) -> Mapping[str, Move]: ...
    @property
    def deferred(self) -> tuple[str, ...]: ...
    @property
    def reassign(self) -> Mapping[str, str]: ...

    def wave(
        self,
        assigned: Mapping[str, tuple[str, ...]],
        revoked: Mapping[str, tuple[str, ...]],
        had: Callable[[], Mapping[str, Iterable[str]]],
        leaving: Callable[[], Iterable[str]],
    ) -> Wave: ...
    def settle_preferred(self, placed: Mapping[str, tuple[str, ...]], members: Collection[str]) -> None: ...
    def drop_moves(self, dest: str | None = None, runnable: Collection[str] | None = None) -> None: ...
    def postpone(self, why: str) -> None: ...
    def incoming_for(self, member_id: str, assigned: Collection[str]) -> tuple[str, ...]: ...
    def descriptors(self, eligible: Mapping[str, JoinRequest], skip: Collection[str] = ()) -> list[TaskDescriptor]: ...


#: a move the wave may let through: (priority, task, source, destination); lower priorities go first
Candidate = tuple[int, str, str | None, str | None]
#: the second round of a move under way (its revocation was counted; only its destination is new)
CONTINUING = -1


def holders_of(had: Mapping[str, set[str]]) -> dict[str, str]:
    """Task -> the member that ran it before this generation (the first by member id if several did)."""
    holder: dict[str, str] = {}
    for m in sorted(had):
        for t in had[m]:
            holder.setdefault(t, m)
    return holder


def candidates(
    assigned: Mapping[str, set[str]],
    revoked: Mapping[str, set[str]],
    had: Mapping[str, set[str]],
    in_flight: Mapping[str, Move],
    runnable: Collection[str],
    leaving: Collection[str],
) -> list[Candidate]:
    """The moves a proposal makes, in the order a wave takes them: second rounds of moves under way, then
    tasks nobody runs (service back), then tasks leaving a departing member, then the rest, each by task id."""
    holder = holders_of(had)
    out: list[Candidate] = []
    for m in sorted(assigned):
        for t in sorted(assigned[m] - had.get(m, set())):
            mv = in_flight.get(t)
            if mv is not None and mv.dest == m:
                continue  # under way already (an eager generation restarting it where it goes)
            if mv is not None and mv.dest is None:
                out.append((CONTINUING, t, mv.source, m))
                continue
            source = holder.get(t) if holder.get(t) in assigned else None
            out.append((0 if source is None else 1 if source in leaving else 2, t, source, m))
    for h in sorted(revoked):
        for t in sorted(revoked[h]):
            if t not in runnable or t in in_flight:
                continue  # a stop (paused, deleted) is never throttled; a move under way is counted once
            out.append((1 if h in leaving else 2, t, h, None))
    return out


def room_left(limits: MoveLimits, in_flight: int, room: int | None, frozen: bool) -> int | None:
    """How many new moves this wave may start (None: no limit): the group's limit and the cluster's room,
    less the moves in flight; none at all in maintenance mode."""
    if frozen:
        return 0
    left = None if limits.max_moves is None else limits.max_moves - in_flight
    if room is not None:
        left = room - in_flight if left is None else min(left, room - in_flight)
    return left


def plan_wave(
    assigned: Mapping[str, Iterable[str]],
    revoked: Mapping[str, Iterable[str]],
    had: Mapping[str, Iterable[str]],
    runnable: Iterable[str],
    moving: Mapping[str, Move],
    limits: MoveLimits,
    now: float,
    frozen: bool = False,
    leaving: Iterable[str] = (),
    room: int | None = None,
) -> Wave:
    """Trim a validated proposal to what the limits allow.

    ``had`` is what each member ran before this generation (its owned tasks and its last assignment),
    ``moving`` the moves already in flight, ``room`` the most moves this group may have in flight under
    the cluster-wide limit (None: no cluster limit). Moves in flight continue without new room (a revoked
    task's second round); new ones are taken in the order of :func:`candidates`, so the same proposal always
    gives the same wave. A move held back goes back where it was: a revocation stays with its owner, an eager
    move's task runs on its previous owner again, a second round waits unassigned.
    """
    out_assigned = {m: set(ts) for m, ts in assigned.items()}
    out_revoked = {m: set(ts) for m, ts in revoked.items()}
    tasks = set(runnable)
    in_flight = {t: mv for t, mv in moving.items() if t in tasks}
    todo = candidates(out_assigned, out_revoked, {m: set(ts) for m, ts in had.items()}, in_flight, tasks, set(leaving))
    left = room_left(limits, len(in_flight), room, frozen)
    load = broker_load(in_flight)
    per = limits.max_moves_per_broker
    deferred: list[str] = []
    for prio, t, source, dest in sorted(todo):
        if prio == CONTINUING and dest is not None:  # only its destination's share is new
            if per is None or load.get(dest, 0) < per:
                in_flight[t] = Move(t, source, dest, in_flight[t].since)
                load[dest] = load.get(dest, 0) + 1
                continue
            del in_flight[t]  # it waits unassigned, and counts again when a later wave takes it
            deferred.append(t)
            out_assigned[dest].discard(t)
            continue
        if (left is None or left > 0) and (per is None or dest is None or load.get(dest, 0) < per):
            in_flight[t] = Move(t, source, dest, now)
            if dest is not None:
                load[dest] = load.get(dest, 0) + 1
            if left is not None:
                left -= 1
            continue
        deferred.append(t)
        hold_back(out_assigned, out_revoked, t, source, dest)
    settle_in_flight(in_flight, out_assigned, out_revoked)
    return Wave(
        assigned={m: tuple(sorted(ts)) for m, ts in out_assigned.items()},
        revoked={m: tuple(sorted(ts)) for m, ts in out_revoked.items() if ts},
        moving=in_flight,
        deferred=tuple(sorted(deferred)),
    )


def settle_in_flight(
    in_flight: dict[str, Move], assigned: Mapping[str, set[str]], revoked: Mapping[str, set[str]]
) -> None:
    """A move in flight to a member that this wave does not give its task is over, having never arrived:
    revoked from that member, it goes on as a revocation (counted once, the next generation names its owner);
    otherwise it stops counting (the task waits for a later wave or went elsewhere). Kept, it could never be
    done and would hold its room in the throttle until the move timeout."""
    for t, mv in list(in_flight.items()):
        if mv.dest is None or t in assigned.get(mv.dest, ()):
            continue
        if t in revoked.get(mv.dest, ()):
            in_flight[t] = Move(t, mv.dest, None, mv.since)
        else:
            del in_flight[t]


def hold_back(
    assigned: dict[str, set[str]], revoked: dict[str, set[str]], task: str, source: str | None, dest: str | None
) -> None:
    """A move that waits for a later wave: a revocation held back leaves the task with its owner; an eager
    move's task runs on its previous owner again (if any) instead of its new one."""
    if dest is None:
        if source is not None:
            revoked[source].discard(task)
            assigned[source].add(task)
        return
    assigned[dest].discard(task)
    if source is not None:
        assigned[source].add(task)
