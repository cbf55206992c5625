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

from dataclasses import dataclass
from typing import Iterable, Mapping

from controller.protocol.codecs import MoveLimits


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
    moving: dict[str, Move]          # every move in flight after this wave (old ones included)
    deferred: tuple[str, ...]        # tasks whose move waits for a later wave


def combine(*limits: MoveLimits | None) -> MoveLimits:
    """The tightest of several limits (cluster and group settings both hold)."""
    def least(values: Iterable[int | None]) -> int | None:
        vs = [v for v in values if v is not None]
        return min(vs) if vs else None
    ls = [x for x in limits if x is not None]
    return MoveLimits(max_moves=least(x.max_moves for x in ls),
                      max_moves_per_broker=least(x.max_moves_per_broker for x in ls))


def broker_load(moving: Mapping[str, Move]) -> dict[str, int]:
    """Moves in flight into each member (a stop is never throttled; starting is what costs a broker)."""
    load: dict[str, int] = {}
    for mv in moving.values():
        if mv.dest is not None:
            load[mv.dest] = load.get(mv.dest, 0) + 1
    return load


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
    the cluster-wide limit (None: no cluster limit). Moves in flight continue without new room (a revoked task's second round); new ones
    are taken in order: tasks nobody runs first (service back), then tasks leaving a departing member,
    then the rest, each by task id, so the same proposal always gives the same wave.
    """
    out_assigned = {m: set(ts) for m, ts in assigned.items()}
    out_revoked = {m: set(ts) for m, ts in revoked.items()}
    had_by = {m: set(ts) for m, ts in had.items()}
    holder: dict[str, str] = {}
    for m in sorted(had_by):
        for t in had_by[m]:
            holder.setdefault(t, m)
    runnable = set(runnable)
    leaving = set(leaving)
    members = set(out_assigned)
    in_flight = {t: mv for t, mv in moving.items() if t in runnable}

    candidates: list[tuple[int, str, str | None, str | None]] = []  # (priority, task, source, dest)
    for m in sorted(out_assigned):
        for t in sorted(out_assigned[m] - had_by.get(m, set())):
            mv = in_flight.get(t)
            if mv is not None and mv.dest == m:
                continue  # under way already (an eager generation restarting it where it goes)
            if mv is not None and mv.dest is None:
                # the second round of a move under way: counted already, but its destination is new
                candidates.append((-1, t, mv.source, m))
                continue
            source = holder.get(t) if holder.get(t) in members else None
            candidates.append((0 if source is None else 1 if source in leaving else 2, t, source, m))
    for h in sorted(out_revoked):
        for t in sorted(out_revoked[h]):
            if t not in runnable or t in in_flight:
                continue  # a stop (paused, deleted) is never throttled; a move under way is counted once
            candidates.append((1 if h in leaving else 2, t, h, None))

    left = None if limits.max_moves is None else limits.max_moves - len(in_flight)
    if room is not None:
        left = room - len(in_flight) if left is None else min(left, room - len(in_flight))
    if frozen:
        left = 0
    load = broker_load(in_flight)
    per = limits.max_moves_per_broker
    deferred: list[str] = []
    for prio, t, source, dest in sorted(candidates):
        if prio < 0:  # continuing: only its destination's share is new
            if per is None or load.get(dest, 0) < per:  # type: ignore[arg-type]
                in_flight[t] = Move(t, source, dest, in_flight[t].since)
                load[dest] = load.get(dest, 0) + 1  # type: ignore[index]
                continue
            del in_flight[t]  # it waits unassigned, and counts again when a later wave takes it
            deferred.append(t)
            out_assigned[dest].discard(t)  # type: ignore[index]
            continue
        if (left is None or left > 0) and (per is None or dest is None or load.get(dest, 0) < per):
            in_flight[t] = Move(t, source, dest, now)
            if dest is not None:
                load[dest] = load.get(dest, 0) + 1
            if left is not None:
                left -= 1
            continue
        deferred.append(t)
        if dest is None:  # a revocation held back: its owner keeps running it
            out_revoked[source].discard(t)  # type: ignore[index]
            out_assigned[source].add(t)  # type: ignore[index]
        else:
            out_assigned[dest].discard(t)
            if source is not None:  # eager: its previous owner runs it again instead
                out_assigned[source].add(t)
    return Wave(
        assigned={m: tuple(sorted(ts)) for m, ts in out_assigned.items()},
        revoked={m: tuple(sorted(ts)) for m, ts in out_revoked.items() if ts},
        moving=in_flight,
        deferred=tuple(sorted(deferred)),
    )


def moves_of(before: Mapping[str, Iterable[str]], after: Mapping[str, Iterable[str]]) -> int:
    """How many tasks of ``after`` run on a member other than in ``before`` (or ran nowhere)."""
    where = {t: m for m, ts in before.items() for t in ts}
    return sum(1 for m, ts in after.items() for t in ts if where.get(t) != m)
