"""The worker's own events: kazoo callbacks and other threads only enqueue these; the worker's event
thread (``worker-<id>-events``) handles them one at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.protocol.records.group_messages import JoinRequest


@dataclass(frozen=True)
class GroupStateEvent:
    pass


@dataclass(frozen=True)
class AssignmentEvent:
    pass


@dataclass(frozen=True)
class Owned:
    pass


@dataclass(frozen=True)
class Stopped:
    """Reconcile: revoked tasks stopped on pool threads; the event thread releases them with our report in
    one multi (``tasks``: whose busy flags to clear; ``ready``: those that stopped, to release)."""

    tasks: tuple[str, ...]
    ready: tuple[str, ...]


@dataclass(frozen=True)
class Released:
    """The release multi sent by the event thread for ``Stopped`` has an answer (``result``: kazoo's
    async result) and carried ``request``, our report."""

    tasks: tuple[str, ...]
    ready: tuple[str, ...]
    request: JoinRequest
    result: Any


@dataclass(frozen=True)
class JoinResultEvent:
    """The join result of a generation we joined was written (we led the last one: we may lead this)."""

    generation: int


@dataclass(frozen=True)
class CoordinatorEvent:
    pass


@dataclass(frozen=True)
class ShutdownRequested:
    pass


@dataclass(frozen=True)
class ConnectionEvent:
    state: str


@dataclass(frozen=True)
class StopEvent:
    pass
