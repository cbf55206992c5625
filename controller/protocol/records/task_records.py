"""What a running task leaves in ZooKeeper: its owner (``/tasks/<id>/owner``), its status (``/status/<id>``) and
the run intervals a broker records (``/intervals/<broker>``).

Plain frozen values, kept apart from the group protocol's messages and the operators' records because the
worker writes them; ``codecs`` encodes and validates them; callers import them from here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OwnerInfo:
    """``/tasks/<id>/owner``: the one worker running the task (ephemeral)."""

    broker: str
    generation: int


#: bounds of a status's last failure (untrusted: any broker writes statuses): the error, the exception's class,
#: the stack trace (characters), the restart count
MAX_FAILURE_ERROR_CHARS = 4000
MAX_FAILURE_KIND_CHARS = 200
MAX_FAILURE_TRACE_CHARS = 16 * 1024
MAX_FAILURE_RESTARTS = 1_000_000


@dataclass(frozen=True)
class LastFailure:
    """Why a task last failed on its owner: the error, the exception's class (``kind``), a bounded stack trace,
    when (wall time) and how many failures in a row it was (``restarts``). It stays in the status across the
    restarts that follow, so a task running again after failures still says why it failed."""

    error: str
    kind: str
    at: float
    restarts: int
    trace: str | None = None

    def __post_init__(self) -> None:
        if len(self.error) > MAX_FAILURE_ERROR_CHARS:
            raise ValueError(f"error is over {MAX_FAILURE_ERROR_CHARS} characters")
        if not self.kind or len(self.kind) > MAX_FAILURE_KIND_CHARS:
            raise ValueError(f"kind must be 1 to {MAX_FAILURE_KIND_CHARS} characters")
        if self.trace is not None and len(self.trace) > MAX_FAILURE_TRACE_CHARS:
            raise ValueError(f"trace is over {MAX_FAILURE_TRACE_CHARS} characters")
        if not math.isfinite(self.at) or self.at < 0:
            raise ValueError(f"at {self.at!r} is not a wall time")
        if not 0 <= self.restarts <= MAX_FAILURE_RESTARTS:
            raise ValueError(f"restarts {self.restarts!r} is not within 0..{MAX_FAILURE_RESTARTS}")


@dataclass(frozen=True)
class TaskStatus:
    """``/status/<task_id>``: what the owning worker reports about a task."""

    broker: str
    state: str
    generation: int
    updated: float
    error: str | None = None
    trace: str | None = None
    failures: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    #: the ZooKeeper session that wrote it (``0x...``): a status is only as live as that session
    session: str | None = None
    #: the spec version (``revision``) the owner runs (absent: a release that did not say)
    revision: int | None = None
    last_failure: LastFailure | None = None


def session_hex(session_id: int | None) -> str | None:
    """A session id as ZooKeeper's own tools print it."""
    return None if session_id is None else f"0x{session_id:x}"


@dataclass(frozen=True)
class RunInterval:
    """One period during which a worker was running a task; recorded for the checker and timelines.

    ``start``/``end`` bound the useful run (for downtime); ``acquired``/``released`` bound the whole
    period the worker could have been running it (for the no-double-ownership check)."""

    task_id: str
    broker: str
    start: float
    end: float | None = None
    generation: int = 0
    acquired: float | None = None  # owner znode created (the run may begin any time after)
    released: float | None = None  # owner znode deleted (the run has fully stopped before)


@dataclass(frozen=True)
class IntervalLog:
    """``/intervals/<broker>``: a broker's recorded run intervals (bounded; oldest dropped first)."""

    broker: str
    intervals: tuple[RunInterval, ...] = ()
