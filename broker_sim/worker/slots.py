"""Per-task bookkeeping of a worker, shared by its parts: one slot per task it holds or runs, and the
batch that tasks stopped together are released in."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from controller.taskspec import TaskSpec


class _StopBatch:
    """Tasks stopped together: counts the stops still running; the last one to finish releases them all."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._left = size
        self._tasks: list[str] = []
        self._stopped: list[str] = []

    def done(self, task: str, stopped: bool) -> tuple[list[str], list[str]] | None:
        """Record one finished stop; for the last, every task of the batch and those whose runner stopped."""
        with self._lock:
            self._tasks.append(task)
            if stopped:
                self._stopped.append(task)
            self._left -= 1
            return (list(self._tasks), sorted(self._stopped)) if self._left == 0 else None


@dataclass
class _TaskSlot:
    spec: TaskSpec | None = None
    held: bool = False          # our owner znode exists
    running: bool = False       # runner started (and not stopped)
    busy: bool = False          # a start/stop is in progress on a pool thread
    failures: int = 0
    restart_at: float | None = None
    state: str = "STOPPED"
    error: str | None = None
    trace: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    acquired: float | None = None
    started: float | None = None
    dirty: bool = True
    releasing: bool = False     # its last status goes with the owner znode's deletion (the status loop leaves it)
    nonce: int = 0
