"""Per-task bookkeeping of a worker, shared by its parts: the task table (one slot per task it holds or
runs, and what the member wants run, under one lock), and the batch that tasks stopped together are
released in."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from broker_sim.worker.phases import (
    UNSETTLED,
    IllegalTaskTransition,
    TaskPhase,
    stop_begun,
    stop_ended,
    stop_unconfirmed,
    transition,
)
from controller.protocol.records.task_records import (
    MAX_FAILURE_ERROR_CHARS,
    MAX_FAILURE_KIND_CHARS,
    MAX_FAILURE_RESTARTS,
    LastFailure,
)
from controller.protocol.tasks.failure_trace import bound_trace
from controller.protocol.tasks.spec import TaskSpec

log = logging.getLogger(__name__)


class TaskTable:
    """What the worker holds and runs, task by task, and what its member wants run (``desired``). One
    re-entrant lock guards both, and the fence's state too (the fence takes this lock): a fence and the
    snapshot of what it stops, a reconcile and the fence it reads, are each one step.

    The only writer of a slot's phase: every move goes through the table of ``phases`` (``_move``), under the
    lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.slots: dict[str, TaskSlot] = {}
        self.desired: frozenset[str] = frozenset()

    # ---- views --------------------------------------------------------------------------------------
    def desired_tasks(self) -> frozenset[str]:
        return self.desired

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
        """Held tasks placed here but not running for good yet: not started, starting, stopped by the fence
        (``UNSETTLED``), or running while a start or stop is under way (a task given back while its stop is
        under way stops, is let go and is taken again). A task whose start failed is not one (it is
        RESTARTING or FAILED)."""
        with self.lock:
            return frozenset(
                t
                for t, s in self.slots.items()
                if s.held and (s.phase in UNSETTLED or (s.running and (s.busy or s.stopping > 0)))
            )

    def running_or_starting(self) -> set[str]:
        """Tasks that run or start (a start cannot be aborted: it runs once it returns)."""
        with self.lock:
            return {t for t, s in self.slots.items() if s.running or s.phase is TaskPhase.STARTING}

    # ---- the moves (each under the lock; the caller may hold it already) ---------------------------
    def _move(self, t: str, slot: TaskSlot, to: TaskPhase) -> None:
        self._check(t, slot, to)
        slot.phase = to

    def _check(self, t: str, slot: TaskSlot, to: TaskPhase) -> None:
        """Refuse (loudly) a move the table does not allow, changing nothing."""
        try:
            transition(t, slot.phase, to)
        except IllegalTaskTransition:  # logged here: a pool thread's future would swallow it
            log.exception("the task table refused a move")
            raise

    def _follow(self, t: str, slot: TaskSlot, to: TaskPhase) -> None:
        """A move a stop computes (``phases.stop_*``): none when it leaves the phase as it is."""
        if to is not slot.phase:
            self._move(t, slot, to)

    def begin_start(self, t: str, spec: TaskSpec) -> TaskSlot:
        """Its runner is about to start with ``spec``."""
        with self.lock:
            slot = self.slots[t]
            slot.spec = spec
            self._move(t, slot, TaskPhase.STARTING)
            return slot

    def start_done(self, t: str, slot: TaskSlot) -> None:
        """Its runner's start returned: it runs."""
        with self.lock:
            self._move(t, slot, TaskPhase.RUNNING)
            slot.started = time.time()
            slot.error = None
            slot.dirty = True

    def begin_stop(self, t: str, fence: bool) -> TaskSlot | None:
        """A stop of its runner begins (None: it does not run); ``fence``: the fence's, to start it again."""
        with self.lock:
            slot = self.slots.get(t)
            if slot is None or not slot.running:
                return None
            slot.stopping += 1
            slot.stops += 1
            self._follow(t, slot, stop_begun(slot.phase, fence))
            return slot

    def stop_done(self, t: str, slot: TaskSlot, confirmed: bool) -> None:
        """A stop of its runner returned (``confirmed``) or raised (it may still run)."""
        with self.lock:
            slot.stopping -= 1
            if confirmed:
                if slot.running:
                    self._follow(t, slot, stop_ended(slot.phase))
                slot.dirty = True
            elif slot.stopping == 0:
                self._follow(t, slot, stop_unconfirmed(slot.phase))

    def ended(self, t: str, slot: TaskSlot, stops: int) -> None:
        """The runner says the run ended on its own: it counts only if no stop began since the run was read
        and none is under way (a stopped run looks ended)."""
        with self.lock:
            if slot.running and slot.stopping == 0 and slot.stops == stops:
                if slot.phase is TaskPhase.RUNNING:
                    self._move(t, slot, TaskPhase.FINISHED)
                slot.dirty = True

    def spec_kept(self, t: str, spec: TaskSpec) -> None:
        """A new version of its spec that needs no restart (the same pipeline): kept, its status says so."""
        with self.lock:
            slot = self.slots[t]
            slot.dirty = slot.dirty or slot.spec is None or spec.revision != slot.spec.revision
            slot.spec = spec

    def restarted(self, t: str, spec: TaskSpec) -> None:
        """Its runner stopped for a spec change: it starts again with ``spec``."""
        with self.lock:
            slot = self.slots[t]
            self._move(t, slot, TaskPhase.STOPPED)
            slot.spec = spec

    def failed(
        self, t: str, error: str, trace: str | None, kind: str, permanent: bool
    ) -> tuple[TaskSlot, float | None]:
        """Count a failure (kept as the slot's ``last_failure``, bounded): RESTARTING after the backoff of the
        spec's restart policy (returned), or FAILED (None) once its attempts are spent, when the failure is
        permanent, or with no spec read."""
        with self.lock:
            slot = self.slots.setdefault(t, TaskSlot())
            self._check(t, slot, TaskPhase.FAILED)  # (refused before anything changes: RESTARTING's rule too)
            slot.failures += 1
            slot.error = error
            slot.trace = trace
            slot.last_failure = LastFailure(
                error=error[:MAX_FAILURE_ERROR_CHARS],
                kind=(kind or "Error")[:MAX_FAILURE_KIND_CHARS],
                at=time.time(),
                restarts=min(slot.failures - 1, MAX_FAILURE_RESTARTS),
                trace=bound_trace(trace) if trace else None,
            )
            slot.dirty = True
            policy = slot.spec.restart if slot.spec is not None else None
            if permanent or policy is None or policy.gives_up(slot.failures):
                self._move(t, slot, TaskPhase.FAILED)
                slot.restart_at = None
                return slot, None
            delay = policy.delay_before(slot.failures)
            self._move(t, slot, TaskPhase.RESTARTING)
            slot.restart_at = time.monotonic() + delay
            return slot, delay

    def releasing(self, t: str) -> TaskSlot:
        """Its last status goes with the owner znode's deletion: the status loop leaves it alone, and a task
        neither COMPLETED nor FAILED is STOPPED."""
        with self.lock:
            slot = self.slots[t]
            slot.releasing = True
            if slot.phase not in (TaskPhase.COMPLETED, TaskPhase.FAILED):
                self._move(t, slot, TaskPhase.STOPPED)
            return slot

    def session_lost(self) -> None:
        """Everything held is gone with the session; what is not running is STOPPED (a runner whose stop did
        not confirm keeps its phase: the deadline watchdog deals with it)."""
        with self.lock:
            for t, slot in self.slots.items():
                slot.held = False
                if not slot.running:
                    self._move(t, slot, TaskPhase.STOPPED)

    def killed(self, t: str, slot: TaskSlot) -> None:
        """The process is killed: its runners end with it."""
        with self.lock:
            if slot.running:
                self._follow(t, slot, stop_ended(slot.phase))


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
    """One task on this worker: its phase (written by the ``TaskTable`` alone), its owner znode and the job
    that holds it, and what its status says."""

    spec: TaskSpec | None = None
    phase: TaskPhase = TaskPhase.STOPPED
    held: bool = False  # our owner znode exists
    busy: bool = False  # a start/stop is in progress on a pool thread
    stopping: int = 0  # runner stops under way (``stop_runner``; the fence's run on threads of their own)
    stops: int = 0  # runner stops begun: a poll's reading of the run from before one of them is stale
    failures: int = 0
    restart_at: float | None = None
    error: str | None = None
    trace: str | None = None
    last_failure: LastFailure | None = None  # kept across the restarts that follow (the status says why)
    metrics: dict[str, Any] = field(default_factory=dict)
    acquired: float | None = None
    started: float | None = None
    dirty: bool = True  # its state changed: written at the next status tick
    metrics_dirty: bool = False  # only its metrics changed: written once ``metrics_interval_s`` has passed
    written_at: float = 0.0  # monotonic time of its last status write
    releasing: bool = False  # its last status goes with the owner znode's deletion (the status loop leaves it)
    nonce: int = 0

    @property
    def running(self) -> bool:
        """Its runner is started (and not stopped)."""
        return self.phase.runs

    @property
    def state(self) -> str:
        """What its status says of it."""
        return self.phase.status
