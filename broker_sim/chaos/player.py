"""Playing a fault schedule in time: each fault begins at its time after the start of the fault phase and
is ended ``duration`` later; an exclusive fault (``EXCLUSIVE``) is waited out where it began, nothing else
starting or ending meanwhile, and the faults after it are pushed back by what it overran. What a fault does
is not known here: ``begin`` injects it and returns what ends it, or raises ``FaultRefused`` when the engine
refuses it now (recorded as not injected, with the engine's message: see ``broker_sim.sim.injection``)."""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from broker_sim.chaos.schedule import EXCLUSIVE, Fault
from broker_sim.sim.injection import FaultRefused, Injection, NotInjected

log = logging.getLogger(__name__)

End = Callable[[], None]

#: a fault that begins this much after its planned time says when it began
LATE_S = 1.0


@dataclass(frozen=True)
class Played:
    """What playing the schedule did: the faults injected by kind, those the engine refused (not injected,
    with its message), those that failed otherwise (an error at injection that is no refusal, or at their
    end), and the wall-clock time the last fault began or ended (invariant 4 counts from there)."""

    injected: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)
    faults_end: float = 0.0
    injection: Injection = Injection(0)


def play(
    schedule: Sequence[Fault],
    begin: Callable[[Fault], End | None],
    sleep: Callable[[float], bool],
    echo: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Played:
    """Begin and end every fault of ``schedule`` at its time; ``sleep(s)`` waits (the run may cut it short).
    A fault that begins a second or more after its planned time says when it began: the schedule's times are
    planned ones, the verdicts' are the fault phase's clock, and an exclusive fault that overran (a quorum
    that took long to return) moves every later fault by as much."""
    injected: Counter[str] = Counter()
    failed: list[str] = []
    refused: list[NotInjected] = []

    def end_it(end: End, label: str) -> None:
        try:
            end()
        except Exception as exc:
            failed.append(f"end of {label}: {type(exc).__name__}: {exc}")
            log.exception("ending %s", label)

    phase0 = clock()
    pending: list[tuple[float, int, End, str]] = []  # a heap of (due, seq, end action, label)
    seq = 0
    lag = 0.0  # what exclusive faults overran: the rest of the schedule comes that much later
    faults_end = time.time()
    queue = list(schedule)
    while queue or pending:
        next_begin = phase0 + lag + queue[0].at if queue else float("inf")
        next_end = pending[0][0] if pending else float("inf")
        sleep(max(0.0, min(next_begin, next_end) - clock()))
        if next_end <= next_begin:
            _, _, end, label = heapq.heappop(pending)
            end_it(end, label)
            faults_end = time.time()
            continue
        f = queue.pop(0)
        label = f.describe().strip()
        started = clock()
        late = started - phase0 - f.at
        said = "injected"
        try:
            ending = begin(f)
            injected[f.kind] += 1
        except FaultRefused as exc:
            ending, said = None, f"not injected ({exc})"
            refused.append(NotInjected(label, str(exc)))
            log.warning("not injected: %s: %s", label, exc)
        except Exception as exc:
            ending, said = None, f"failed ({type(exc).__name__})"
            failed.append(f"{label}: {type(exc).__name__}: {exc}")
            log.exception("injecting %s", label)
        if f.kind in EXCLUSIVE:
            if ending is not None:  # wait out the exclusive fault here: nothing else runs meanwhile
                sleep(f.duration)
                end_it(ending, label)
            lag += max(0.0, clock() - started - f.duration)
        elif ending is not None:
            seq += 1
            heapq.heappush(pending, (clock() + f.duration, seq, ending, label))
        faults_end = time.time()
        when = f" (began at t+{started - phase0:.2f}s, {late:.2f}s late)" if late >= LATE_S else ""
        echo(f"  {said}: {label}{when}" if said != "injected" else f"  injected {label}{when}")
    return Played(injected, failed, faults_end, Injection(len(schedule), tuple(refused)))
