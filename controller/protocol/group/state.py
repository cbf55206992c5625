"""A group's state and the one place it changes, sans-IO.

Everything that moves a group from one state to another lives here, with the table it obeys (h11's "Rule 1":
one module for the state machine). Each state names the states it may be entered from, as Kafka's
``GroupMetadata.scala`` does; ``transition`` refuses anything else loudly. A controller that fails over does
not replay the moves that led to the state ZooKeeper recorded: ``restore`` takes that state as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from controller.protocol.clock import Clock
from controller.protocol.errors import InternalError


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
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.AWAITING_SYNC, GroupState.EMPTY, GroupState.RECONCILING}
    ),
    GroupState.AWAITING_SYNC: frozenset({GroupState.PREPARING_REBALANCE}),
    # (from Reconciling: every member has its target and every revocation is confirmed)
    GroupState.STABLE: frozenset({GroupState.AWAITING_SYNC, GroupState.RECONCILING}),
    # (from PreparingRebalance: a join round chose reconcile; from Stable: a change under reconcile)
    GroupState.RECONCILING: frozenset({GroupState.PREPARING_REBALANCE, GroupState.STABLE}),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.DEAD: frozenset(
        {
            GroupState.STABLE,
            GroupState.PREPARING_REBALANCE,
            GroupState.AWAITING_SYNC,
            GroupState.EMPTY,
            GroupState.RECONCILING,
            GroupState.DEAD,
        }
    ),
}


class IllegalTransition(InternalError, RuntimeError):
    """A state change the protocol does not allow: a bug, never swallowed."""


def check_transition(current: GroupState, target: GroupState) -> None:
    if current not in VALID_PREVIOUS[target]:
        raise IllegalTransition(f"group cannot go from {current.value} to {target.value}")


@dataclass
class GroupStateMachine:
    """A group's state and the wall time it entered it (what a benchmark takes as the instant a group became
    Stable: a monotonic clock does not survive a failover, wall time does)."""

    wall: Clock
    state: GroupState = GroupState.EMPTY
    since: float | None = None

    def transition(self, target: GroupState) -> None:
        """Enter ``target`` from the current state, or raise :class:`IllegalTransition`."""
        check_transition(self.state, target)
        self.state = target
        self.since = self.wall.now()

    def restore(self, state: GroupState, resumed: bool = False) -> None:
        """Failover: take the state a previous controller left (no predecessor to check, the moves that led
        there happened under that controller). ``resumed``: the group counts as entering it now (a Stable
        group that goes on as it was)."""
        self.state = state
        if resumed:
            self.since = self.wall.now()

    def end(self) -> None:
        """Dead, from any state: the controller resigns and the group decides nothing more."""
        check_transition(self.state, GroupState.DEAD)
        self.state = GroupState.DEAD
