"""The group coordinator's vocabulary, sans-IO: the decisions it returns for the IO layer to carry out, its
configuration, and what its parts see of it. Apart from the coordinator itself (``coordinator.py``) and its parts
(``join_round.py``, ``reconcile.py``, ``operations.py``, ``holds.py``), so that every one of them imports
it at the top. The states and their transitions live in ``state.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias

from controller.protocol.clock import Clock
from controller.protocol.group.state import GroupState
from controller.protocol.group.throttle import Throttle
from controller.protocol.records.group_messages import (
    Assignment,
    GroupStateInfo,
    JoinResult,
    TaskDescriptor,
)

if TYPE_CHECKING:  # (holds.py imports this module: the part is named here for its type alone)
    from controller.protocol.group.holds import Holds

FOREVER = float("inf")


# ---- decisions (what the IO layer must do) --------------------------------------------------------
@dataclass(frozen=True)
class WriteGroupState:
    info: GroupStateInfo


@dataclass(frozen=True)
class WriteJoinResult:
    result: JoinResult


@dataclass(frozen=True)
class WriteAssignments:
    assignments: tuple[tuple[str, Assignment], ...]


@dataclass(frozen=True)
class WatchSync:
    """Watch for the leader's proposal of this generation."""

    generation: int


@dataclass(frozen=True)
class DeleteGenerationsBelow:
    """Old join results and proposals are no longer needed."""

    generation: int


@dataclass(frozen=True)
class WatchMoves:
    """Tell the coordinator (``on_move_done``) when each of these tasks runs on its new owner."""

    tasks: tuple[str, ...]


Decision: TypeAlias = (
    WriteGroupState | WriteJoinResult | WriteAssignments | WatchSync | DeleteGenerationsBelow | WatchMoves
)


@dataclass(frozen=True)
class Rebalance:
    """A part asks its coordinator for a new placement, for this reason."""

    reason: str


@dataclass(frozen=True)
class Step:
    """A part asks for a step towards the reconcile target (a throttled wave may go), for this reason."""

    reason: str


@dataclass(frozen=True)
class ShowState:
    """A part asks for the group state to be written (with this reason; None: the one shown stays)."""

    reason: str | None = None


#: what a part asks of its coordinator (None: nothing)
Ask: TypeAlias = Rebalance | Step | ShowState | None


@dataclass(frozen=True)
class MembersTaken:
    """What a change of the live members means for either protocol family, for the coordinator to take: the
    members that left, the static members back within the delay (member, identity; join rounds), the members
    that began a controlled shutdown, the reason for a rebalance ("" when none is needed), and (reconcile)
    whether the group state is written even so (a member that ran nothing left quietly)."""

    left: tuple[str, ...]
    shutdowns: tuple[str, ...]
    need: str
    returned: tuple[tuple[str, str], ...] = ()
    quiet: bool = False


@dataclass(frozen=True)
class GroupConfig:
    rebalance_timeout_s: float = 30.0
    scheduled_rebalance_delay_s: float = 0.0
    default_assignor: str = "sticky"
    #: a move not running on its new owner after this long stops counting against the throttle
    move_timeout_s: float = 120.0
    #: reconcile: while a group is still reconciling, its target is recomputed at most this often (a burst of
    #: brokers starting together gets one target for many of them, not a cascade of moves for each)
    retarget_interval_s: float = 0.5
    #: reconcile: a group that runs nothing yet waits this long after each member joins (at most the rebalance
    #: timeout after the first) before its first target, so that brokers starting together are placed in one
    #: go instead of each newcomer taking tasks from the ones before it (Kafka's initial rebalance delay)
    initial_delay_s: float = 1.0
    #: reconcile: a member whose acknowledgements ZooKeeper contradicts this many times in a row (it reports
    #: tasks taken whose owner znodes it does not hold, or does not take them in time) is kept from new work for ``backoff_initial_s``,
    #: doubled at each back-off in a row up to ``backoff_max_s`` (``probation``)
    backoff_refusals: int = 3
    backoff_initial_s: float = 30.0
    backoff_max_s: float = 960.0
    #: load-balanced groups: an imbalance must last this long before the controller moves pipelines for it,
    #: and a pipeline moved for load stays put this long (hysteresis); checked every ``load_check_s``
    load_window_s: float = 60.0
    load_check_s: float = 10.0
    #: cooperative rounds: a planned move (a roll's or a reassign's pin) is handed to its receiver in the round
    #: that revokes it (``Assignment.handoff``), which takes it as soon as its owner znode is released instead
    #: of a round later. Off where the receiver's right to the task is granted only with its assignment
    #: (per-broker ACLs): it could not take the task before that round anyway
    handoff: bool = True


class GroupView(Protocol):
    """What every part of the coordinator reads of its group: its name, clock, configuration and state, the
    tasks it places, its holds (the tasks held for departed members), and the reason of its last rebalance.
    ``GroupCore`` (the protocol families) and ``OperationsCore`` (the operations part) add what each reads."""

    @property
    def reason(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def config(self) -> GroupConfig: ...
    @property
    def state(self) -> GroupState: ...
    @property
    def tasks(self) -> Mapping[str, TaskDescriptor]: ...
    @property
    def holds(self) -> Holds: ...


class GroupCore(GroupView, Protocol):
    """What either protocol family's part reads of its group (read only: a part returns what it decided, and
    the coordinator writes it): the generation record, the placement, and the operations its moves go
    through. ``JoinCore`` and ``ReconcileCore`` add what each family reads on top."""

    @property
    def generation(self) -> int: ...
    @property
    def leader(self) -> str | None: ...
    @property
    def protocol(self) -> str | None: ...
    @property
    def assignor(self) -> str | None: ...
    @property
    def generation_members(self) -> tuple[str, ...]: ...
    @property
    def assignment(self) -> Mapping[str, tuple[str, ...]]: ...
    @property
    def controller_epoch(self) -> int: ...
    @property
    def operations(self) -> Throttle: ...
