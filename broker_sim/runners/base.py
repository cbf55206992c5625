"""The runner interface: how a worker starts, stops and watches one task, whatever runs it.

``start`` and ``stop`` block until done; the worker calls them concurrently (one named pool thread per
call) so runners must be thread-safe. ``stop`` returns only once the task has fully stopped: the worker
releases ``/tasks/<bucket>/<id>/owner`` right after, so a runner that returned early would let two owners overlap.
``prepare`` and ``discard`` (optional) let a runner do part of a start before the task is its own: a prepared
task is not running, and ``start`` uses what was prepared only for the same spec.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from controller.protocol.records.registration_records import SessionInfo
from controller.protocol.tasks.spec import TaskSpec


class RunState(str, Enum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class RunStatus:
    state: RunState
    error: str | None = None
    trace: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    #: the failure's exception class (a JVM cause's, where Spark gives one)
    error_type: str | None = None


class TaskRunner(abc.ABC):
    """Runs tasks of one worker. One instance per worker process; thread-safe."""

    name: str = "abstract"
    #: How long a ``stop`` may take. The worker fences (stops every task) at least this long before its
    #: session could expire, so a stop begun at the fence deadline ends before another worker can take over.
    stop_budget_s: float = 0.0
    #: Whether tasks run in processes of their own (a JVM, child processes): those a paused broker cannot stop,
    #: so a lease guard kills them when the broker's fence deadline passes (``broker_sim.worker.guard``).
    runs_processes: bool = False

    @abc.abstractmethod
    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        """Start the task and return once it runs (or raise with the reason it could not start)."""

    @abc.abstractmethod
    def stop(self, task_id: str, timeout: float = 60.0) -> None:
        """Stop the task and return only once it has fully stopped (idempotent)."""

    @abc.abstractmethod
    def status(self, task_id: str) -> RunStatus:
        """The task's current state; STOPPED for a task this runner does not run."""

    def prepare(self, task_id: str, spec: TaskSpec) -> bool:
        """Do now the part of the task's start that needs no ownership (a planned roll announced the task: it
        arrives soon), so that its ``start`` with this very spec is shorter. Nothing outside this process may
        see it: no output, no owner, no query or job started. False: this runner prepares nothing (the
        default: a runner that cannot prepare starts its tasks as it always did)."""
        return False

    def discard(self, task_id: str) -> None:  # noqa: B027  (an optional hook: nothing prepared by default)
        """Drop what ``prepare`` kept for the task (it did not arrive, or its spec changed); idempotent.
        ``kill`` and ``close`` drop everything prepared too."""

    def session_info(self) -> SessionInfo | None:
        """The compute session its tasks share (a SparkSession), as the broker's registration reports it;
        None: this runner has none (its broker is always ready for work)."""
        return None

    def warm_up(self) -> None:  # noqa: B027  (an optional hook: most runners have nothing to start)
        """Start that session now, before the broker joins its group; raise with what to do if it cannot."""

    def running(self) -> set[str]:
        """Ids of the tasks this runner currently runs (started and not stopped)."""
        return set()

    def processes(self) -> tuple[set[int], set[int]]:
        """(pids, process group ids) that run this runner's tasks now: what the lease guard kills."""
        return set(), set()

    def attach_lease(self, path: Path) -> None:  # noqa: B027  (an optional hook: most runners run no process)
        """The broker's lease file (``broker_sim.runners.lease``): a runner whose tasks run in processes of
        their own hands it to them, so each ends its run by the broker's deadline itself."""

    def fault(self, reason: str) -> set[str]:
        """The broker lost what guards its tasks' processes (its lease guard died): end NOW the tasks that run
        in processes of their own, each then reported FAILED with ``reason`` (its restart policy acts). The
        ids of those tasks; the default runs none."""
        return set()

    def engine_lost(self) -> str | None:
        """Why the engine every task of this runner shares died under it (not by its own stop), or None: the
        broker then halts, as its tasks can neither run nor start here. The default shares none."""
        return None

    def kill(self) -> None:
        """The broker halts at its fence deadline: end every task NOW, no grace, nothing that can block (SIGKILL
        the processes that run them). The default suits runners whose tasks run inside the broker's own
        process: they end with it."""
        from broker_sim.runners.procs import kill_processes

        pids, pgids = self.processes()
        kill_processes(pids, pgids)

    def close(self) -> None:  # noqa: B027  (an optional hook, not abstract: a runner may hold nothing to release)
        """Stop everything and release resources (SparkSession, threads)."""
