"""The worker's own events: kazoo callbacks and other threads only enqueue these; the worker's event
thread (``worker-<id>-events``) handles them one at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.codecs import JoinRequest


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
class _Stopped:
    """Reconcile: revoked tasks stopped on pool threads; the event thread releases them with our report in
    one multi (``tasks``: whose busy flags to clear; ``ready``: those that stopped, to release)."""

    tasks: tuple[str, ...]
    ready: tuple[str, ...]


@dataclass(frozen=True)
class _Released:
    """The release multi sent by the event thread for ``_Stopped`` has an answer (``result``: kazoo's
    async result) and carried ``request``, our report."""

    tasks: tuple[str, ...]
    ready: tuple[str, ...]
    request: JoinRequest
    result: Any


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
