"""The phases of a task on a worker, and the one table of moves between them.

A task's phase is what its runner is doing here: never started, starting, running, being stopped (and why),
stopped by the fence (to start again once it lifts), ended on its own, waiting to restart after a failure, or
failed for good. Each phase knows the phases it may be entered from (Kafka's ``GroupMetadata`` style);
``transition`` refuses any other move loudly. Pure: no I/O, no locks (the task table holds its lock around
every move, and is the only writer of a slot's phase)."""

from __future__ import annotations

from enum import Enum

from controller.protocol.errors import InternalError


class TaskPhase(Enum):
    """A task's phase on a worker; ``status`` is what its status znode says of it, ``runs`` whether its runner
    is started (and not stopped yet)."""

    #: not running: never started, stopped, let go of, or restarted after a spec change
    STOPPED = ("stopped", "STOPPED", False)
    #: its runner's start is under way (a start cannot be aborted: it runs once it returns)
    STARTING = ("starting", "STARTING", False)
    RUNNING = ("running", "RUNNING", True)
    #: a stop is under way (a revocation, a restart, a failure, the worker stopping); it runs until it returns
    STOPPING = ("stopping", "RUNNING", True)
    #: the fence is stopping it (our session may expire): it starts again once the fence lifts
    FENCE_STOPPING = ("fence_stopping", "RUNNING", True)
    #: the fence stopped it: it starts again once the fence lifts
    FENCED = ("fenced", "STOPPED", False)
    #: its run ended on its own (a batch pipeline done); its runner is not stopped yet
    FINISHED = ("finished", "COMPLETED", True)
    #: its run ended on its own and its runner is stopped
    COMPLETED = ("completed", "COMPLETED", False)
    #: it failed; it starts again once the restart policy's backoff has passed
    RESTARTING = ("restarting", "RESTARTING", False)
    #: it failed for good (attempts spent, or a spec that is garbage) until ``task restart``
    FAILED = ("failed", "FAILED", False)

    def __init__(self, _name: str, status: str, runs: bool) -> None:
        self.status = status
        self.runs = runs


P = TaskPhase

#: phases whose runner is not started: a failure may be counted in any of them
_IDLE = frozenset({P.STOPPED, P.FENCED, P.STARTING, P.RESTARTING, P.FAILED, P.COMPLETED})

#: each phase and the phases it may be entered from
PREDECESSORS: dict[TaskPhase, frozenset[TaskPhase]] = {
    # a new slot, one stopped, fenced or due for its restart; or one taken again after it was let go of
    P.STARTING: frozenset({P.STOPPED, P.FENCED, P.RESTARTING, P.FAILED, P.COMPLETED}),
    # its start returned; also when that start outlived a lost session (STOPPED) or a failure counted meanwhile
    # (a spec that turned to garbage): a start cannot be aborted, the runner runs; and a stop that did not
    # confirm (it raised): the runner may still run, and the deadline watchdog escalates
    P.RUNNING: frozenset({P.STARTING, P.STOPPED, P.RESTARTING, P.FAILED, P.STOPPING, P.FENCE_STOPPING}),
    P.STOPPING: frozenset({P.RUNNING}),
    P.FENCE_STOPPING: frozenset({P.RUNNING}),
    P.FENCED: frozenset({P.FENCE_STOPPING}),
    # a stop returned (or the process was killed); a restart after a spec change, a release, a lost session
    P.STOPPED: frozenset({P.STOPPING, P.RUNNING, P.STOPPED, P.FENCED, P.STARTING, P.RESTARTING, P.FAILED, P.COMPLETED}),
    P.FINISHED: frozenset({P.RUNNING}),
    P.COMPLETED: frozenset({P.FINISHED}),
    P.RESTARTING: _IDLE,
    P.FAILED: _IDLE,
}


class IllegalTaskTransition(InternalError, RuntimeError):
    """A move the table does not allow: a bug in the worker, never a reaction to what others wrote."""


def transition(task: str, current: TaskPhase, to: TaskPhase) -> TaskPhase:
    """The phase ``to``, if the table allows the move from ``current``; else ``IllegalTaskTransition``."""
    if current not in PREDECESSORS[to]:
        raise IllegalTaskTransition(f"task {task}: no move from {current.name} to {to.name}")
    return to


def stop_begun(current: TaskPhase, fence: bool) -> TaskPhase:
    """The phase once a stop begins: a running task is stopping (the fence's stop marks it to start again);
    one already stopping or finished stays as it is (a second stop joins the first)."""
    if current is P.RUNNING:
        return P.FENCE_STOPPING if fence else P.STOPPING
    return current


def stop_ended(current: TaskPhase) -> TaskPhase:
    """The phase once its runner stopped: what the stop (or the end) was for; a task not running stays."""
    return {
        P.RUNNING: P.STOPPED,
        P.STOPPING: P.STOPPED,
        P.FENCE_STOPPING: P.FENCED,
        P.FINISHED: P.COMPLETED,
    }.get(current, current)


def stop_unconfirmed(current: TaskPhase) -> TaskPhase:
    """A stop raised: the runner may still run, so the task counts as running (the watchdog escalates)."""
    return P.RUNNING if current in (P.STOPPING, P.FENCE_STOPPING) else current


#: phases a reconcile starts a held, desired task from (FAILED and COMPLETED wait for ``task restart``)
STARTABLE = frozenset({P.STOPPED, P.FENCED, P.RESTARTING})
#: phases the member counts as "placed, not running for good yet" for a held task (with any task whose runner
#: runs while a start or a stop is under way)
UNSETTLED = frozenset({P.STOPPED, P.FENCED, P.STARTING})
