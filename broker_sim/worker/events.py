"""The worker's own events: kazoo callbacks and other threads only enqueue these; the worker's event
thread (``worker-<id>-events``) handles them one at a time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class _GroupState:
    pass


@dataclass(frozen=True)
class _Assignment:
    pass


@dataclass(frozen=True)
class _Owned:
    pass


@dataclass(frozen=True)
class _JoinResult:
    """The join result of a generation we joined was written (we led the last one: we may lead this)."""

    generation: int


@dataclass(frozen=True)
class _Coordinator:
    pass


@dataclass(frozen=True)
class _ShutdownRequested:
    pass


@dataclass(frozen=True)
class _Connection:
    state: str


@dataclass(frozen=True)
class _Stop:
    pass
