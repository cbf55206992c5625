"""What a running task leaves in ZooKeeper: its owner (``/tasks/<id>/owner``), its status (``/status/<id>``) and
the run intervals a broker records (``/intervals/<broker>``).

Plain frozen values, kept apart from the group protocol's messages and the operators' records because the
worker writes them; ``codecs`` encodes and validates them; callers import them from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OwnerInfo:
    """``/tasks/<id>/owner``: the one worker running the task (ephemeral)."""

    broker: str
    generation: int


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
