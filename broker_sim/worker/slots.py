"""Per-task bookkeeping of a worker, shared by its parts: the task table (one slot per task it holds or
runs, and what the member wants run, under one lock), and the batch that tasks stopped together are
released in."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from controller.protocol.taskspec import TaskSpec


class TaskTable:
    """What the worker holds and runs, task by task, and what its member wants run (``desired``). One
    re-entrant lock guards both, and the fence's state too (the fence takes this lock): a fence and the
    snapshot of what it stops, a reconcile and the fence it reads, are each one step."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.slots: dict[str, TaskSlot] = {}
        self.desired: frozenset[str] = frozenset()

    def running(self) -> list[str]:
        """Tasks whose runner is started (and not stopped)."""
        with self.lock:
            return [t for t, s in self.slots.items() if s.running]

    def held(self) -> frozenset[str]:
        """Tasks whose owner znode we hold, or may hold any moment (a create in flight: a busy slot not yet
        held). A revoked task counts as let go only once neither is true."""
        with self.lock:
            return frozenset(t for t, s in self.slots.items() if s.held or s.busy)

    def holding(self) -> frozenset[str]:
        """Tasks whose owner znode we hold now (an acquisition still waiting is not one of them)."""
        with self.lock:
            return frozenset(t for t, s in self.slots.items() if s.held)

    def starting(self) -> frozenset[str]:
        """Tasks whose owner znode we hold and whose start has not finished (it has not begun, or is under
        way), or that are being stopped (a task given back while its stop is under way stops, is let go and is
        taken again; a task the fence is stopping starts again once it lifts): placed, not running for good
        yet. A task whose start failed is not one (it is FAILED, and retried)."""
        with self.lock:
            return frozenset(
                t
                for t, s in self.slots.items()
                if s.held
                and ((not s.running and s.state in ("STOPPED", "STARTING")) or (s.running and (s.busy or s.stopping)))
            )

    def running_or_starting(self) -> set[str]:
        """Tasks that run or start (a start cannot be aborted: it runs once it returns)."""
        with self.lock:
            return {t for t, s in self.slots.items() if s.running or s.state == "STARTING"}


class StopBatch:
    """Tasks stopped together, released together: one multi once every stop has returned. A stop that is slow
    (or hung, until the deadline watchdog escalates) must not hold the others: once ``linger_s`` has passed
    (``expire``), what has stopped is released at once and each later stop releases its own task."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._left = size
        self._ready: list[str] = []  # stopped, not released yet
        self._waiting: list[str] = []  # finished (stopped or not), busy flag not cleared yet
        self._expired = False

    def done(self, task: str, stopped: bool) -> tuple[list[str], list[str]] | None:
        """Record one finished stop. Returns (tasks whose busy flags to clear, tasks to release now), or None
        while the batch still waits for others."""
        with self._lock:
            self._left -= 1
            self._waiting.append(task)
            if stopped:
                self._ready.append(task)
            if self._left > 0 and not self._expired:
                return None
            out = (list(self._waiting), sorted(self._ready))
            self._waiting.clear()
            self._ready.clear()
            return out

    def expire(self) -> tuple[list[str], list[str]] | None:
        """The batch waited long enough: what has finished goes now; later stops go one by one."""
        with self._lock:
            if self._expired or self._left == 0:
                return None
            self._expired = True
            if not self._waiting:
                return None
            out = (list(self._waiting), sorted(self._ready))
            self._waiting.clear()
            self._ready.clear()
            return out


@dataclass
class TaskSlot:
    spec: TaskSpec | None = None
    held: bool = False  # our owner znode exists
    running: bool = False  # runner started (and not stopped)
    busy: bool = False  # a start/stop is in progress on a pool thread
    stopping: int = 0  # runner stops under way (``stop_runner``; the fence's run on threads of their own)
    stops: int = 0  # runner stops begun: a poll's reading of the run from before one of them is stale
    failures: int = 0
    restart_at: float | None = None
    state: str = "STOPPED"
    error: str | None = None
    trace: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    acquired: float | None = None
    started: float | None = None
    dirty: bool = True  # its state changed: written at the next status tick
    metrics_dirty: bool = False  # only its metrics changed: written once ``metrics_interval_s`` has passed
    written_at: float = 0.0  # monotonic time of its last status write
    releasing: bool = False  # its last status goes with the owner znode's deletion (the status loop leaves it)
    nonce: int = 0
