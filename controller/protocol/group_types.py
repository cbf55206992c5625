"""The group coordinator's vocabulary, sans-IO: its states and the transitions between them, the decisions it
returns for the IO layer to carry out, and its configuration. Apart from the coordinator itself (``group.py``
for the join-round protocols, ``reconcile.py`` for reconcile), so that both halves import it at the top."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Union

from controller.protocol.codecs import Assignment, GroupStateInfo, JoinResult
from controller.protocol.errors import InternalError

FOREVER = float("inf")


class GroupState(str, Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    AWAITING_SYNC = "AwaitingSync"
    STABLE = "Stable"
    #: reconcile protocol: members are moving towards their targets (revocations or moves outstanding)
    RECONCILING = "Reconciling"
    DEAD = "Dead"


VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    # (from Reconciling: a member without reconcile joined, the group goes back through a join round)
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.EMPTY,
                                               GroupState.RECONCILING}),
    GroupState.AWAITING_SYNC: frozenset({GroupState.PREPARING_REBALANCE}),
    # (from Reconciling: every member has its target and every revocation is confirmed)
    GroupState.STABLE: frozenset({GroupState.AWAITING_SYNC, GroupState.RECONCILING}),
    # (from PreparingRebalance: a join round chose reconcile; from Stable: a change under reconcile)
    GroupState.RECONCILING: frozenset({GroupState.PREPARING_REBALANCE, GroupState.STABLE}),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.DEAD: frozenset({GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.AWAITING_SYNC,
                                GroupState.EMPTY, GroupState.RECONCILING, GroupState.DEAD}),
}


class IllegalTransition(InternalError, RuntimeError):
    """A state change the protocol does not allow: a bug, never swallowed."""


def check_transition(current: GroupState, target: GroupState) -> None:
    if current not in VALID_PREVIOUS[target]:
        raise IllegalTransition(f"group cannot go from {current.value} to {target.value}")


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


Decision = Union[WriteGroupState, WriteJoinResult, WriteAssignments, WatchSync, DeleteGenerationsBelow, WatchMoves]


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


@dataclass
class Held:
    """Tasks of a departed member, waiting up to the delay for it (same instance id) to return."""

    tasks: tuple[str, ...]
    deadline: float
