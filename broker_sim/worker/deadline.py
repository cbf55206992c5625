"""The hard fence deadline: no task of this broker runs past the last instant its session is certainly alive.

The fence (``fence``) stops tasks gracefully a *fence margin* before the earliest moment the server can
expire our session. A stop can hang (a wedged Spark driver, a ``StreamingQuery.stop()`` that never returns),
and a graceful fence is only as good as the slowest stop. So a named watchdog thread
(``worker-<id>-deadline``) enforces two hard limits, every half safety margin (at most ``MAX_PERIOD_S``):

- **the session deadline**: ``last_answer + session_timeout - safety`` (``last_answer`` is the send time of
  the last request ZooKeeper answered; the server cannot expire the session before ``last_answer +
  session_timeout``). Past it, no runner may still be running or stopping: another broker may take our
  tasks as soon as the session expires.
- **each stop's own budget** (``stop_timeout_s``): a stop that has not returned by then holds its owner
  znode, and with it the task, forever; and a stop that raised did not confirm that the task stopped.

Either way the broker **escalates**: it kills what runs its tasks (``TaskRunner.kill``: the Spark driver JVM
and every process group a runner started), then halts: the process exits with ``EXIT_HALTED`` (75, EX_TEMPFAIL)
and its supervisor (docker's restart policy, systemd ``Restart=on-failure``) starts it again; the new process
registers with a new session once the old one has expired. Embedded workers (the simulator, tests) halt by
an in-process kill instead (``WorkerConfig.on_halt = "kill"``).

A paused process (SIGSTOP, a VM pause) runs no thread at all, so it cannot enforce anything while paused: the
**lease guard** (``guard``) does it from outside. The watchdog keeps a lease file saying until when the session
is certainly alive and which processes run our tasks; a separate guard process kills them when the lease runs
out unrenewed. When the paused worker resumes past its deadline, the watchdog sees it at once and halts.

The watchdog is given what it needs as values and callables (the earliest expiry, a snapshot of the tasks
that run or start, kill every runner, the runners' processes, halt), never the worker's lock, slots or
runner: it only reads, kills and halts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker_sim.runners.lease import Lease, write_lease

log = logging.getLogger(__name__)

#: The exit code of a broker that halted at its fence deadline (sysexits' EX_TEMPFAIL: restart me).
EXIT_HALTED = 75
#: how often the watchdog looks, at most: half the safety margin (so it acts inside it), never more than this
MAX_PERIOD_S = 0.25
#: How long a broker's own stop of one task may take, by default: a multiple of the runner's stop budget.
STOP_TIMEOUT_FACTOR = 3.0
MIN_STOP_TIMEOUT_S = 5.0
#: How many lost guards a broker replaces before it halts (a guard that keeps dying is not a guard).
MAX_GUARD_LOSSES = 5


def safety_margin(session_timeout_s: float, fence_margin_s: float) -> float:
    """Time left between the hard deadline and the earliest expiry of the session: for killing the runners'
    processes and exiting (milliseconds), and for clock-rate differences between us and the server (ppm).
    A twentieth of the session, at most a quarter of the fence margin (the graceful stop gets the rest), at
    least 0.2 s."""
    return max(0.2, min(session_timeout_s / 20, fence_margin_s / 4))


def stop_timeout(stop_budget_s: float, configured: float | None) -> float:
    """Each stop's own budget: configured, else three times the runner's declared stop budget (at least 5 s)."""
    if configured is not None:
        return configured
    return max(MIN_STOP_TIMEOUT_S, STOP_TIMEOUT_FACTOR * stop_budget_s)


def lease_dir() -> Path:
    return Path(os.environ.get("ZKC_STATE_DIR", ".zkc")) / "leases"


class DeadlineWatchdog:
    """The watchdog thread's state: stops in flight with their deadlines, the lease and its guard."""

    def __init__(
        self,
        who: str,
        session_timeout_s: float,
        fence_margin_s: float,
        stop_budget_s: float,
        configured_stop_timeout_s: float | None,
        earliest_expiry: Callable[[], float | None],
        running_or_starting: Callable[[], set[str]],
        kill_runners: Callable[[], None],
        runner_processes: Callable[[], tuple[set[int], set[int]]],
        halt: Callable[[str], None],
        stopped: threading.Event,
        guard_lost: Callable[[str], object] = lambda _reason: None,
        engine_lost: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.who = who
        self.earliest_expiry = earliest_expiry
        self.running_or_starting = running_or_starting
        self.kill_runners = kill_runners
        self.runner_processes = runner_processes
        self.halt = halt
        self.stopped = stopped
        self.guard_lost = guard_lost
        self.engine_lost = engine_lost
        self.guard_losses = 0
        self.safety_s = safety_margin(session_timeout_s, fence_margin_s)
        self.stop_timeout_s = stop_timeout(stop_budget_s, configured_stop_timeout_s)
        self._lock = threading.Lock()
        self._stops: dict[str, float] = {}  # task -> monotonic instant its stop must have returned by
        self.halted = threading.Event()
        self.reason: str | None = None
        self._lease_path: Path | None = None
        self._last_lease: Lease | None = None
        self._guard: subprocess.Popen[bytes] | None = None
        self.period_s = min(MAX_PERIOD_S, self.safety_s / 2)

    # ---- stops -----------------------------------------------------------------------------------------
    def stop_begins(self, task: str) -> None:
        with self._lock:
            self._stops[task] = time.monotonic() + self.stop_timeout_s

    def stop_ends(self, task: str) -> None:
        with self._lock:
            self._stops.pop(task, None)

    # ---- the session deadline ----------------------------------------------------------------------------
    def session_deadline(self) -> float | None:
        """The last instant (monotonic) our tasks may run: ``safety`` before the earliest expiry."""
        expiry = self.earliest_expiry()
        return None if expiry is None else expiry - self.safety_s

    def busy(self) -> list[str]:
        """Tasks that run, start (a start cannot be aborted: it runs once it returns) or stop now."""
        busy = self.running_or_starting()
        with self._lock:
            return sorted(busy | set(self._stops))

    def check(self, now: float) -> str | None:
        """Why the broker must halt now, or None. Reads the worker's state and the runner's engine, no I/O."""
        with self._lock:
            overdue = sorted(t for t, d in self._stops.items() if now >= d)
        if overdue:
            return f"the stop of {', '.join(overdue[:5])} did not return within its {self.stop_timeout_s:.1f}s budget"
        deadline = self.session_deadline()
        if deadline is not None and now >= deadline and (tasks := self.busy()):
            return (
                f"{len(tasks)} task(s) ({', '.join(tasks[:5])}) still running {now - deadline:.2f}s past the "
                "session's fence deadline"
            )
        return self.lease_ran_out(now) or self.engine_died()

    def engine_died(self) -> str | None:
        """Why the broker must halt because the engine its tasks share died under it (the Spark driver JVM:
        killed, crashed, out of memory), or None. Its queries ended with it and every start would fail on its
        dead gateway while the broker holds the tasks; a new process starts a new engine. Asked after the
        lease: a JVM that the guard killed at the lease's expiry is no death of the engine."""
        reason = self.engine_lost()
        return None if reason is None else f"{reason}: its tasks cannot run here any more"

    def lease_ran_out(self, now: float) -> str | None:
        """Why the broker must halt because the lease it last wrote ran out, or None. The guard kills the
        runners' processes (the Spark driver JVM, which every pipeline of this broker shares) at that instant,
        and a start it cut short leaves no task busy by the time this thread looks: the broker would resume
        on a dead engine, every start failing until its tasks fail for good while it still holds them. Halting
        lets its supervisor start it again with a new engine and session, as after any hard fence."""
        lease = self._last_lease
        if lease is None or lease.expires is None or not (lease.pids or lease.pgids) or now < lease.expires:
            return None
        return (
            f"its lease ran out {now - lease.expires:.2f}s ago unrenewed: the lease guard kills its runners' "
            f"processes {list(lease.pids)} and process groups {list(lease.pgids)}"
        )

    # ---- escalation --------------------------------------------------------------------------------------
    def escalate(self, reason: str) -> None:
        """Kill what runs our tasks, then halt. Once."""
        with self._lock:
            if self.halted.is_set():
                return
            self.halted.set()
            self.reason = reason
        log.critical("worker %s: HALTING: %s; killing its runners' processes", self.who, reason)
        try:
            self.kill_runners()
        except Exception:
            log.exception("worker %s: killing the runner's processes", self.who)
        self.halt(reason)

    # ---- the lease ---------------------------------------------------------------------------------------
    def start_guard(self) -> None:
        """Start the lease guard (a process of its own session, so that a SIGSTOP of the worker's process or
        process group does not stop it). Only brokers that halt by exiting have one: an embedded worker shares
        its process, and a JVM, with others."""
        directory = lease_dir()
        directory.mkdir(parents=True, exist_ok=True)
        self._lease_path = directory / f"{self.who}-{os.getpid()}.json"
        self._write_lease(time.monotonic(), force=True)
        self._spawn_guard()

    @property
    def lease_path(self) -> Path | None:
        """The lease file (None: no guard): the processes that run our tasks read it too."""
        return self._lease_path

    @property
    def guard_pid(self) -> int | None:
        return None if self._guard is None else self._guard.pid

    def _spawn_guard(self) -> None:
        cmd = [sys.executable, "-m", "broker_sim.worker.guard", str(self._lease_path)]
        self._guard = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        log.info("worker %s: lease guard pid %d watches %s", self.who, self._guard.pid, self._lease_path)

    def check_guard(self) -> None:
        """A guard that exited while the broker runs is a fault (it only exits once the lease file is removed
        or the broker is gone): the tasks it guarded are halted and reported with the reason (their restart
        policy acts), and a new guard takes over at once; after ``MAX_GUARD_LOSSES`` the broker halts."""
        guard = self._guard
        if guard is None or guard.poll() is None or self.stopped.is_set():
            return
        code = guard.returncode
        how = f"signal {-code}" if code < 0 else f"code {code}"
        reason = (
            f"the broker's lease guard (pid {guard.pid}) exited with {how}: its tasks that run in processes of "
            "their own were halted, so that no run outlives a deadline nobody enforces"
        )
        log.critical("worker %s: %s", self.who, reason)
        self.guard_losses += 1
        if self.guard_losses > MAX_GUARD_LOSSES:
            self.escalate(f"{reason} ({self.guard_losses} guards lost)")
            return
        try:
            self._write_lease(time.monotonic(), force=True)  # (a lease file removed meanwhile would end it at once)
            self._spawn_guard()
        except OSError as exc:
            self.escalate(f"{reason}; a new guard could not start: {exc}")
            return
        try:
            self.guard_lost(reason)
        except Exception:
            log.exception("worker %s: halting the tasks of a lost guard", self.who)

    def _write_lease(self, now: float, force: bool = False) -> None:
        if self._lease_path is None:
            return
        pids, pgids = self.runner_processes()
        deadline = self.session_deadline()
        busy = bool(self.busy())
        lease = Lease(
            broker=self.who,
            owner_pid=os.getpid(),
            expires=deadline if busy else None,
            pids=tuple(sorted(pids)),
            pgids=tuple(sorted(pgids)),
        )
        last = self._last_lease
        if (
            not force
            and last is not None
            and last.pids == lease.pids
            and last.pgids == lease.pgids
            and ((last.expires is None) == (lease.expires is None))
            and (lease.expires is None or abs(lease.expires - (last.expires or 0.0)) < 0.1)
        ):
            return
        try:
            write_lease(self._lease_path, lease)
            self._last_lease = lease
        except OSError as exc:
            log.warning("worker %s: cannot write its lease %s: %s", self.who, self._lease_path, exc)

    def close_guard(self) -> None:
        """A clean stop: nothing runs any more; the guard exits when its lease file is gone."""
        if self._lease_path is not None:
            try:
                self._lease_path.unlink()
            except OSError:
                pass
        if self._guard is not None:
            try:
                self._guard.wait(2.0)
            except subprocess.TimeoutExpired:
                self._guard.kill()
                self._guard.wait(5.0)

    # ---- the thread ----------------------------------------------------------------------------------------
    def loop(self) -> None:
        while not self.stopped.wait(self.period_s):
            if self.halted.is_set():
                return
            now = time.monotonic()
            reason = self.check(now)
            if reason is not None:
                self.escalate(reason)
                return
            self._write_lease(now)
            self.check_guard()
