"""The group protocol's messages: the coordinator's view of a group, members' join requests, the join result
the leader assigns from, its proposal and the per-member assignments (``/groups/<g>/...``).

Plain frozen values; ``codecs`` encodes and validates them; callers import them from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

#: the most tasks an assignment may announce as ``incoming`` (a roll moves at most a few brokers' share at once)
MAX_INCOMING = 10_000
#: the longest task id (``layout.check_name`` allows 200 characters)
MAX_TASK_ID_CHARS = 200


@dataclass(frozen=True)
class HeldTasks:
    """Tasks of a departed static member, kept unassigned until ``until`` (wall-clock seconds) for it to
    return; ``until`` None: until maintenance mode ends."""

    instance: str
    tasks: tuple[str, ...]
    until: float | None


@dataclass(frozen=True)
class IgnoredMember:
    """A member znode the coordinator gives no work: no live broker of the same session behind it (a ghost),
    or a request or report it refused (``reason`` says which)."""

    member: str
    reason: str


@dataclass(frozen=True)
class GroupStateInfo:
    """``/groups/<g>/state``: the coordinator's view of a group, written only by the controller. ``held``
    keeps the scheduled rebalance delay's holds across a controller failover."""

    state: str
    generation: int
    join_generation: int
    controller_epoch: int
    protocol: str | None = None
    assignor: str | None = None
    leader: str | None = None
    members: tuple[str, ...] = ()
    reason: str = ""
    held: tuple[HeldTasks, ...] = ()
    #: the move throttle's view: moves in flight now, moves waiting for a later wave, and the imbalance
    #: (tasks off the preferred layout) last measured
    moving: tuple[str, ...] = ()
    deferred: int = 0
    imbalance: int | None = None
    maintenance: bool = False
    #: member znodes set apart (ghosts, refused reports): shown, never given work
    ignored: tuple[IgnoredMember, ...] = ()
    #: reconcile: members that have not yet acknowledged (taken and reported) their current assignment
    unacked: tuple[str, ...] = ()
    #: reconcile: members that hold tasks placed with them whose start has not finished (not running yet)
    starting: tuple[str, ...] = ()


@dataclass(frozen=True)
class JoinRequest:
    """``/groups/<g>/members/<member>``: a member's join request (ephemeral, rewritten to rejoin).

    ``join_generation`` is the generation the member asks to join (the coordinator's current
    generation + 1); ``owned`` is what it still runs (always empty under the eager protocol).
    """

    member_id: str
    join_generation: int
    generation: int
    protocols: tuple[str, ...]
    assignors: tuple[str, ...]
    owned: tuple[str, ...] = ()
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None
    leaving: bool = False
    #: this life of the member (new at every start): a reconcile assignment names the one it is for
    incarnation: str | None = None
    #: reconcile: tasks of its assignment whose owner znode it does not hold yet (empty: it runs its
    #: assignment of member epoch ``generation``, which is its acknowledgement)
    pending: tuple[str, ...] = ()
    #: the member reports what it took and acknowledges its member epoch (``pending``). A broker of a release
    #: before acknowledgements writes no such field: its published assignment counts as taken, as it did
    #: then, so controllers and brokers can be upgraded in either order
    acknowledges: bool = False
    #: reconcile: tasks it holds (owner znode taken) whose start has not finished: placed, not yet running
    starting: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskDescriptor:
    """What an assignor needs to know of one task (a projection of its spec)."""

    task_id: str
    weight: int = 1
    pinned: tuple[str, ...] = ()
    pin_mode: str = "preferred"
    rack: str | None = None
    #: its measured load share (None: no history; the load-aware assignor then goes by ``weight``)
    load: float | None = None
    #: moved within the load balancer's window: the load-aware assignor does not move it for balance
    moved_recently: bool = False

    OMIT_AT_DEFAULT: ClassVar[dict[str, object]] = {"load": None, "moved_recently": False}


@dataclass(frozen=True)
class MemberMetadata:
    """What an assignor needs to know of one member."""

    member_id: str
    owned: tuple[str, ...] = ()
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None
    leaving: bool = False


@dataclass(frozen=True)
class JoinResult:
    """``/groups/<g>/join/<generation>``: the join phase's outcome, for the leader to assign from.

    ``held`` are tasks waiting for a departed member to return (scheduled rebalance delay): the
    assignor must leave them unassigned. ``previous`` is the last published assignment, for sticky
    assignors.
    """

    generation: int
    leader: str
    protocol: str
    assignor: str
    controller_epoch: int
    members: tuple[MemberMetadata, ...]
    tasks: tuple[TaskDescriptor, ...]
    held: tuple[str, ...] = ()
    previous: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncProposal:
    """``/groups/<g>/sync/<generation>``: the leader's proposed assignment for that generation."""

    generation: int
    leader: str
    assigned: dict[str, tuple[str, ...]]
    revoked: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _check_task_list(name: str, tasks: tuple[str, ...]) -> None:
    """A list of task ids a member is told about: bounded, no repeats, each id non-empty and bounded."""
    if len(tasks) > MAX_INCOMING:
        raise ValueError(f"{name} names {len(tasks)} tasks, over {MAX_INCOMING}")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"{name} names a task twice")
    if any(not t or len(t) > MAX_TASK_ID_CHARS for t in tasks):
        raise ValueError(f"{name} names a task id that is empty or over {MAX_TASK_ID_CHARS} characters")


@dataclass(frozen=True)
class Assignment:
    """``/groups/<g>/assignment/<member>``: what one member must run, fenced by the controller epoch.

    ``error`` carries a protocol error code for this member (e.g. UNKNOWN_MEMBER_ID) instead of tasks.
    """

    generation: int
    controller_epoch: int
    assigned: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    protocol: str = "cooperative"
    leader: str | None = None
    error: str | None = None
    #: whether this member rejoins once its revocations are let go, so a second round assigns what moved
    #: (the leader, when the published assignment revokes anything); None: it decides from its own proposal
    #: (controllers before the move throttle, whose assignment was always the proposal)
    follow_up: bool | None = None
    #: reconcile: the member's life (its request's ``incarnation``) this assignment is for
    incarnation: str | None = None
    #: tasks a planned roll moves to this member next (none of them assigned yet): it may prepare their start
    #: (``broker_sim.worker.warmup``) but runs none of them; a broker of an earlier release ignores the field
    incoming: tuple[str, ...] = ()
    #: cooperative, planned moves: tasks this same generation revokes from their owner and a roll or reassign
    #: pins to this member. It takes each as soon as its owner znode is released (that znode stays the one lock)
    #: and lists it as owned from then on; the next generation assigns it. A broker of an earlier release
    #: ignores the field and takes them with that generation
    handoff: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_task_list("handoff", self.handoff)
        _check_task_list("incoming", self.incoming)
        if not set(self.handoff).isdisjoint(self.assigned) or not set(self.handoff).isdisjoint(self.revoked):
            raise ValueError("handoff names a task also assigned or revoked")
        if not set(self.incoming).isdisjoint(self.assigned):
            raise ValueError("incoming names a task already assigned")
