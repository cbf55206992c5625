"""The fence: a worker stops every task before its session can expire, so that no new owner can start
a task this worker still runs.

Fence deadline (the timing argument). kazoo declares the connection SUSPENDED after
``read_timeout = 2/3 * session_timeout`` without hearing from the server; the server expires the session
``session_timeout`` after it last heard from us, which is no earlier than the last time we heard from it.
So at the moment we see SUSPENDED, the session — and with it our owner znodes, which is what lets a new
owner start — survives at least another ``session_timeout / 3``. We stop every task a *fence margin*
before the earliest expiry: ``fence_margin_s = max(fence_fraction * session_timeout, runner.stop_budget_s)``
(``fence_fraction`` defaults to 1/6), i.e. ``max(0, session_timeout / 3 - margin)`` after SUSPENDED, and
the liveness probe (``LivenessProbe``) does the same ``session_timeout - margin`` after the last answer.
That leaves the margin for the runners' ``stop`` to finish before anyone else can take over. The margin is
capped at half the session timeout (fencing after less silence than that would stop tasks on every
hiccup); a runner whose stop budget exceeds the cap gets a warning: give it a longer session timeout.

The pulse thread (``worker-<id>-pulse``) runs ``LivenessProbe`` and detects that the process itself was
paused (SIGSTOP, a VM pause): it fences at once, un-fencing only after a round trip proves the session is
still its own.

One fence, three routes up (the SUSPENDED timer, the probe, the pause detector), one rule down
(``Fence.lift``): an answer to a request sent after the fence went up, showing the session still owns our
broker znode, lifts it whichever route raised it. Raising it cancels a pending SUSPENDED timer: left to
fire after the fence was lifted, it fenced a healthy worker that nothing then lifted (a chaos run's
tasks stayed without an owner).

The fence is a part the worker owns: it is given the worker's task-table lock (its state and the tasks it
stops are read and written under that one lock), the session check, and callables (what runs, stop these
runners, reconcile), never the worker itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


def fence_margin(session_timeout_s: float, fence_fraction: float, stop_budget_s: float, who: str = "worker") -> float:
    """How long before its session could expire a worker stops every task: a fraction of the session
    timeout, or the runner's stop budget if that is longer, capped at half the session timeout."""
    margin = max(session_timeout_s * fence_fraction, stop_budget_s)
    cap = session_timeout_s / 2
    if margin > cap:
        log.warning(
            "worker %s: its runner's stop may take %.1fs, more than half the %.1fs session timeout; "
            "fencing %.1fs before expiry, so a slow stop can outlive the session: use a session "
            "timeout of at least %.1fs",
            who,
            stop_budget_s,
            session_timeout_s,
            cap,
            2 * stop_budget_s,
        )
        margin = cap
    return margin


def probe_interval(fence_margin_s: float) -> float:
    """How often the liveness probe asks: half the fence margin, at least 0.2 s and at most 1 s."""
    return min(1.0, max(0.2, fence_margin_s / 2))


class SessionCheck(Protocol):
    """What the fence asks ZooKeeper: whether our session still holds our broker znode."""

    @property
    def session_id(self) -> int | None: ...

    @property
    def connected(self) -> bool: ...

    def exists(self) -> Any: ...

    def exists_async(self) -> Any: ...

    def owns(self, stat: Any) -> bool: ...


class LivenessProbe:
    """The fence deadline without relying on kazoo's SUSPENDED, run by the pulse thread.

    kazoo declares SUSPENDED only when a heartbeat ping goes unanswered, and every request it sends
    counts as a ping (it postpones the next one): a worker that keeps issuing requests into a silent
    network never sees SUSPENDED while the server expires its session. So the pulse thread keeps one
    cheap ``exists`` of our broker znode in flight; the server heard from us no earlier than the send
    time of the last answered one, so our session lives at least ``session_timeout`` past it. Once
    ``session_timeout - fence_margin_s`` has passed without an answer, stop every task (the same margin
    as the SUSPENDED fence timer); an answer showing our session still owns our broker znode lifts any fence
    raised before its request was sent."""

    def __init__(
        self,
        who: str,
        session: SessionCheck,
        session_timeout_s: float,
        fence_margin_s: float,
        closing: Callable[[], bool],
        lift: Callable[[float, str], bool],
        fence: Callable[[], None],
    ) -> None:
        self.who = who
        self.check = session
        self.session_timeout_s = session_timeout_s
        self.closing = closing
        self.lift = lift
        self.fence = fence
        self.limit = session_timeout_s - fence_margin_s
        self.interval = probe_interval(fence_margin_s)
        self.sent_at = float("-inf")
        self.session: int | None = None
        self.last_ok = time.monotonic()
        self.pending: tuple[float, Any] | None = None
        self.fenced = False

    def reset(self, now: float) -> None:
        self.last_ok = now
        self.pending = None
        self.sent_at = float("-inf")  # a new session: ask at once

    def earliest_expiry(self) -> float | None:
        """The earliest instant (monotonic) the server may expire our session: ``session_timeout`` after the
        send time of the last request it answered. None while no session is ours (or a new one is not
        adopted yet)."""
        if self.session is None or self.session != self.check.session_id:
            return None
        return self.last_ok + self.session_timeout_s

    def step(self, now: float) -> None:
        session_id = self.check.session_id
        if session_id is None or self.closing():
            self.reset(now)
            return
        if session_id != self.session:  # a new session: its clock starts now
            self.session = session_id
            self.reset(now)
            self.fenced = False
        if self.pending is not None and self.pending[1].ready():
            sent, result = self.pending
            self.pending = None
            try:
                stat = result.get(block=False)
            except Exception:
                stat = False
            if stat is not False:
                self.last_ok = max(self.last_ok, sent)
                if self.check.owns(stat):
                    self.fenced = False  # (this silence is over: the next one may fence again)
                    # whoever raised the fence (this probe, the SUSPENDED timer, a pause): an answer to a
                    # request sent after it went up proves the session outlived it
                    self.lift(sent, "ZooKeeper answers again and our session is alive")
        if self.pending is None and self.check.connected and now - self.sent_at >= self.interval:
            self.sent_at = now
            try:
                self.pending = (now, self.check.exists_async())
            except Exception:
                self.pending = None
        if not self.fenced and now - self.last_ok > self.limit:
            self.fenced = True
            log.warning("worker %s: no answer from ZooKeeper for %.1fs; fencing", self.who, now - self.last_ok)
            self.fence()


class Fence:
    """Arming, raising and lifting the fence; the pulse thread's loop. ``up`` (and ``raised_at``, when it
    last went up) are read and written under ``lock``, the worker's task-table lock."""

    def __init__(
        self,
        who: str,
        session_timeout_s: float,
        margin_s: float,
        lock: threading.RLock,
        session: SessionCheck,
        running: Callable[[], list[str]],
        stop_runners: Callable[[list[str], str], None],
        resume: Callable[[], None],
        closing: Callable[[], bool],
        stopped: threading.Event,
    ) -> None:
        self.who = who
        self.session_timeout_s = session_timeout_s
        self.margin_s = margin_s
        self.lock = lock
        self.session = session
        self.running = running
        self.stop_runners = stop_runners
        self.resume = resume
        self.closing = closing
        self.stopped = stopped
        self.up = False
        self.raised_at = float("-inf")  # (monotonic) when the fence last went up: older answers cannot lift it
        self.lifts = 0  # fences lifted so far (``lift``): a fence whose stops outlast a lift reconciles after them
        self.timer: threading.Timer | None = None
        # (the probe looks ``lift`` and ``fence`` up at each call: whatever this fence's are then)
        self.probe = LivenessProbe(
            who,
            session,
            session_timeout_s,
            margin_s,
            closing,
            lift=lambda sent, why: self.lift(sent, why),
            fence=lambda: self.fence(),
        )

    def blocks_starts(self) -> bool:
        """Whether nothing may start now: the fence is up or the worker is closing."""
        return self.up or self.closing()

    def arm(self) -> None:
        """SUSPENDED: start the fence timer."""
        # SUSPENDED comes 2/3 of the session after we last heard from the server: fence a margin before
        # the earliest expiry, at once if the margin is a third of the session or more
        delay = max(0.0, self.session_timeout_s / 3 - self.margin_s)
        with self.lock:
            if self.timer is None:
                self.timer = threading.Timer(delay, self.fence)
                self.timer.name = f"worker-{self.who}-fence"
                self.timer.daemon = True
                self.timer.start()

    def disarm(self) -> None:
        """CONNECTED again: a pending fence timer will not fire."""
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def fence(self) -> None:
        """ZooKeeper has not come back in time: stop every task before our session can expire.

        A SUSPENDED timer still pending is cancelled, whoever fences: left to fire, it would fence again
        later, possibly after the fence was lifted, with the connection healthy and nothing left to lift it.

        The fence may be lifted while its stops are still under way: the lift's reconcile saw those tasks
        still running and left them alone, and nothing else would start them again once stopped. So if a
        lift came while the stops ran, reconcile once they have ended (a stop that could not confirm leaves
        its task running, so it is not started twice: the deadline watchdog deals with it)."""
        with self.lock:
            timer, self.timer = self.timer, None
            self.up = True
            self.raised_at = time.monotonic()
            running = self.running()
            lifts = self.lifts
        if timer is not None:
            timer.cancel()  # (harmless from the timer's own thread: it has fired)
        log.warning("worker %s: fencing, stopping %d tasks (ZooKeeper unreachable)", self.who, len(running))
        # fresh threads: the task pool may be stuck in ZooKeeper calls, and stopping must not wait for it
        try:
            self.stop_runners(running, "fence")
        finally:
            with self.lock:
                lifted = self.lifts != lifts and not self.up and not self.closing()
            if lifted:
                self.resume()

    def lift(self, sent: float, why: str) -> bool:
        """An answer to a request sent at ``sent`` (monotonic) showed our session alive: lift the fence if
        that request went out after the fence went up (an older answer proves nothing about the silence
        that raised it), and move the liveness deadline forward from its send time."""
        with self.lock:
            if not self.up or sent < self.raised_at or self.closing():
                return False
            self.up = False
            self.lifts += 1
        self.probe.last_ok = max(self.probe.last_ok, sent)
        log.info("worker %s: %s; resuming", self.who, why)
        self.resume()
        return True

    def clear(self) -> None:
        """The session is lost: nothing runs and nothing is held, so the next session starts unfenced."""
        with self.lock:
            self.up = False

    def resume_if_alive(self, why: str) -> None:
        """One round trip, sent now (after the fence went up), to prove our session alive and lift the fence
        (a reconnection, the end of a pause); if it fails, the probe's next answer lifts it instead."""
        sent = time.monotonic()
        try:
            stat = self.session.exists()
        except Exception:  # (connection loss, timeout, a client closing: the pulse thread must not die of it)
            return
        if self.session.owns(stat):
            self.lift(sent, why)

    # ---- the pulse thread ---------------------------------------------------------------------------
    def pulse_loop(self) -> None:
        """Detect that this process was paused (SIGSTOP, VM or GC pause): a thread doing no I/O wakes up
        much later than it asked to. The session may be gone and our tasks someone else's: fence now,
        then un-fence only after a round trip proves the session survived (our broker znode is ours)."""
        period = 0.2
        last = time.monotonic()
        probe = self.probe
        while not self.stopped.wait(period):
            now = time.monotonic()
            gap, last = now - last, now
            if gap <= self.session_timeout_s / 3:
                probe.step(now)
                continue
            # the last answer stays what it was: the deadline watchdog halts us if the pause went past it
            probe.pending = None
            log.warning("worker %s: paused for %.1fs; fencing", self.who, gap)
            self.fence()
            self.resume_if_alive("the session survived the pause")
            last = time.monotonic()
