"""The planned roll, sans-IO: in which order a group's brokers go down, where their tasks go before each
one does, and the state of a roll as ``/admin/roll`` keeps it (so a new controller, or ``roll --resume``,
goes on from where it stood).

A roll restarts every broker of a group once, ``batch`` at a time. Before a batch goes down its tasks move
to brokers already rolled (least loaded first), never to one still to be rolled, and every other task of
the group is pinned where it runs, so the coordinator moves nothing the plan does not. The first batch has
no rolled broker to go to: by default its tasks move to the last batch (moved twice, and the last batch,
back empty, then needs a final balance): ``T + 2T/N`` moves for ``T`` tasks on ``N`` brokers, the floor for
a roll in which every task leaves its broker before that broker goes down, none of them down for a restart
(a move costs a task far less than a broker's restart). With ``in_place`` the first batch restarts *in
place* instead: its tasks wait for it (held by the coordinator, as a static member's are) and are down for
its restart; every later batch's tasks move once, to rolled brokers; and the final balance moves tasks of
the first batch, which have not moved: ``T`` moves in all, no task moved twice.

Moves go out in waves of at most ``wave`` tasks (``DEFAULT_WAVE`` unless asked; 0: a step's moves all at
once): a broker starting twenty tasks on eight threads makes the last ones wait for two starts before their
own.

Warm-up: every plan's moves are announced to the brokers that receive them (``incoming``) before the first
wave goes, and its first wave waits ``warmup_s`` for them to prepare those starts; the tasks run where they
are meanwhile, so the wait lengthens the roll, not any task's downtime. Later waves are prepared while the
waves before them move.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

#: the default wait of a plan's first wave for its receivers to prepare (a no-op task prepares in 0.35 s, a
#: Spark pipeline in well under a second on a warm session: docs/benchmarks.md § "The planned roll")
DEFAULT_WARMUP_S = 1.0
#: the longest wait an operator or a znode may ask
MAX_WARMUP_S = 600.0
#: the default wave: a broker starts at most its pool's threads at once (16 by default, the simulator's 8), so a
#: step's tasks all sent to one rolled broker at once leave the last of them queued behind the others' starts;
#: in waves of 8 none queues, and each later wave is announced, and prepared, while the one before it moves
DEFAULT_WAVE = 8

#: the phases of a roll: ``drain`` (the batch's tasks move away), ``restart`` (the batch was asked to shut
#: down; waiting for it to come back under the same ids), ``balance`` (every batch is back: the final
#: balancing moves), ``done``, ``paused`` (waiting for ``roll --resume``; ``resume_phase`` says where to)
PHASES = ("drain", "restart", "balance", "done", "paused")


@dataclass(frozen=True)
class RollState:
    """``/admin/roll``: one roll of one group, written by the CLI to start it and by the controller (fenced)
    as it goes."""

    group: str
    order: tuple[tuple[str, ...], ...]
    batch: int = 1
    timeout_s: float = 300.0
    step: int = 0
    phase: str = "drain"
    resume_phase: str = ""
    reason: str = ""
    #: wall time the phase began (a restart's bound counts from it)
    since: float = 0.0
    started: float = 0.0
    #: broker epochs (registration czxid) of the batch when it was asked to shut down: back = a new epoch
    epochs: dict[str, int] = field(default_factory=dict)
    #: tasks moved twice (the first batch's, when it could not restart in place), which the final balance
    #: leaves where they are
    twice: tuple[str, ...] = ()
    #: tasks that waited for the first batch's restart in place (moved never): the final balance takes these
    kept: tuple[str, ...] = ()
    moves: int = 0
    #: at most this many tasks in flight at once within a step (0: a step's moves all at once): a broker
    #: starting twenty tasks on eight threads makes the last of them wait for two starts before their own
    wave: int = DEFAULT_WAVE
    #: how long a plan's first wave waits after its moves are announced to their receivers (0: no wait), for
    #: them to prepare those tasks' starts
    warmup_s: float = DEFAULT_WARMUP_S
    #: the first batch restarts in place, its tasks waiting for it (``T`` moves, ``T/N`` of them down for a
    #: restart); False, the default: they move away first, to the last batch (``T + 2T/N`` moves, none of them
    #: down for a restart: a move costs less downtime than a restart)
    in_place: bool = False

    @property
    def active(self) -> bool:
        return self.phase not in ("done", "paused")

    def batch_now(self) -> tuple[str, ...]:
        return self.order[self.step] if self.step < len(self.order) else ()


#: the most tasks a roll's wave may hold in flight (a bound on what an operator or a znode may ask)
MAX_WAVE = 100_000


def roll_order(brokers: Collection[str], batch: int) -> tuple[tuple[str, ...], ...]:
    """The brokers in name order, ``batch`` at a time."""
    if batch < 1:
        raise ValueError("a roll's batch is at least 1")
    names = sorted(brokers)
    return tuple(tuple(names[i : i + batch]) for i in range(0, len(names), batch))


def owners(assignment: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """task -> member from member -> tasks."""
    return {t: m for m, ts in assignment.items() for t in ts}


def _fill(placement: dict[str, str], moving: Sequence[str], dests: Sequence[str]) -> None:
    """Each task to the least loaded destination (then by name)."""
    load = {d: 0 for d in dests}
    for b in placement.values():
        if b in load:
            load[b] += 1
    heap = [(n, d) for d, n in load.items()]
    heapq.heapify(heap)
    for t in sorted(moving):
        n, d = heapq.heappop(heap)
        placement[t] = d
        heapq.heappush(heap, (n + 1, d))


@dataclass(frozen=True)
class Plan:
    """Where every task of the group is to run, and which tasks of the plan move."""

    placement: dict[str, str]
    moved: tuple[str, ...]
    #: tasks with nowhere to go (a batch that is the whole group): down while their broker restarts
    stranded: tuple[str, ...] = ()


def drain_plan(
    assignment: Mapping[str, Sequence[str]], order: Sequence[Sequence[str]], step: int, in_place: bool = True
) -> Plan:
    """Before batch ``step`` goes down: its tasks go to brokers already rolled; the first batch's stay where
    they are (``stranded``: they wait for its restart in place), or, without ``in_place``, go to the last
    batch; every other task stays where it runs."""
    batch = set(order[step])
    current = owners(assignment)
    present = set(assignment)
    rolled = [b for bs in order[:step] for b in bs if b in present]
    last = [b for b in order[-1] if b in present and b not in batch] if step < len(order) - 1 else []
    dests = rolled or ([] if in_place else last)
    placement = {t: b for t, b in current.items() if b not in batch}
    moving = sorted(t for t, b in current.items() if b in batch)
    if not dests:
        return Plan(placement, (), tuple(moving))
    _fill(placement, moving, dests)
    return Plan(placement, tuple(moving))


def hold_plan(assignment: Mapping[str, Sequence[str]]) -> Plan:
    """While a batch restarts: every task stays where it runs (a broker back is given nothing yet)."""
    return Plan(owners(assignment), ())


def balance_plan(
    assignment: Mapping[str, Sequence[str]], twice: Collection[str] = (), kept: Collection[str] = ()
) -> Plan:
    """Every batch is back: the fewest moves that leave the group balanced (member counts differ by at most
    one), taking tasks ``kept`` (never moved) first, then those that moved once, those moved ``twice`` last."""
    current = owners(assignment)
    members = sorted(assignment)
    if not members:
        return Plan({}, ())
    total = len(current)
    base, extra = divmod(total, len(members))
    counts = {m: len(assignment[m]) for m in members}
    # the larger members keep the extra tasks (fewest moves)
    by_size = sorted(members, key=lambda m: (-counts[m], m))
    target = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_size)}
    placement = dict(current)
    spare: list[str] = []
    for m in members:
        surplus = counts[m] - target[m]
        if surplus > 0:
            ts = sorted(assignment[m], key=lambda t: (t in twice, t not in kept, t))
            spare += ts[:surplus]
    short = [m for m in members for _ in range(target[m] - counts[m])]
    for t, m in zip(sorted(spare, key=lambda t: (t in twice, t not in kept, t)), short):
        placement[t] = m
    moved = tuple(sorted(t for t in placement if placement[t] != current[t]))
    return Plan(placement, moved)


def next_wave(assignment: Mapping[str, Sequence[str]], plan: Plan, wave: int) -> dict[str, str] | None:
    """The placement to pin next on the way to ``plan``: at most ``wave`` of its moves not yet done (all of
    them with ``wave`` 0) go where the plan puts them, every other task stays where it runs; None when the
    whole plan is placed. Tasks on their way (in no assignment mid-round) are left to the round."""
    current = owners(assignment)
    pending = [t for t in plan.moved if current.get(t) != plan.placement.get(t)]
    if not pending and all(current.get(t) == b for t, b in plan.placement.items()):
        return None
    now = set(pending[:wave] if wave > 0 else pending)
    out = {t: b for t, b in current.items() if t in plan.placement}
    for t in now:
        out[t] = plan.placement[t]
    for t, b in plan.placement.items():  # a task the plan keeps where it is but the round has not placed yet
        if t not in out and t not in plan.moved:
            out[t] = b
    return out


def incoming_of(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Member -> the tasks the plan moves to it (what the member is told is coming)."""
    out: dict[str, list[str]] = {}
    for t in plan.moved:
        out.setdefault(plan.placement[t], []).append(t)
    return {m: tuple(sorted(ts)) for m, ts in out.items()}


def placed(assignment: Mapping[str, Sequence[str]], placement: Mapping[str, str]) -> bool:
    """Every task of the plan runs where the plan puts it (members the plan names only)."""
    current = owners(assignment)
    return all(current.get(t) == b for t, b in placement.items())
