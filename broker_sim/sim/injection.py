"""Which faults happened: the one rule every chaos harness (process brokers, containers, the protocol
simulation) judges a run by, pure.

An engine may refuse a fault at the moment of injection: ``docker pause`` that cannot freeze the container's
cgroup, a signal to a process that is already gone, no active controller to kill. That is no failure of the
system under test, so the fault is recorded as not injected, with the engine's message, and the run is judged
on the faults that did happen. A run in which fewer than half the drawn faults could be injected proves too
little, and fails for that reason alone (said apart from a broken invariant)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.protocol.errors import ZkcError

#: below this share of the drawn faults injected, a run proves too little and fails
MIN_INJECTED_SHARE = 0.5


class FaultRefused(ZkcError, RuntimeError):
    """The engine refused to inject a fault now (its message says why): the fault did not happen."""

    code = "fault_refused"


@dataclass(frozen=True)
class NotInjected:
    """A drawn fault the engine refused, and the engine's message."""

    fault: str
    reason: str

    def __str__(self) -> str:
        return f"{self.fault}: {self.reason}"


@dataclass(frozen=True)
class Injection:
    """How many faults the schedule drew, and which of them the engine refused."""

    drawn: int
    not_injected: tuple[NotInjected, ...] = ()

    def __post_init__(self) -> None:
        if self.drawn < 0 or len(self.not_injected) > self.drawn:
            raise ValueError(f"{len(self.not_injected)} faults not injected of {self.drawn} drawn")

    @property
    def injected(self) -> int:
        return self.drawn - len(self.not_injected)

    @property
    def enough(self) -> bool:
        """At least half the drawn faults happened (a run that drew none has nothing to fall short of)."""
        return self.injected >= MIN_INJECTED_SHARE * self.drawn

    def line(self) -> str:
        """The summary's line: how many were injected, and each refusal with the engine's message."""
        head = f"{self.injected} of {self.drawn} drawn faults injected"
        if not self.not_injected:
            return head
        verdict = "" if self.enough else f" — TOO FEW (at least {MIN_INJECTED_SHARE:.0%} must be)"
        return f"{head}{verdict}; not injected: " + "; ".join(str(n) for n in self.not_injected)


def tally(drawn: int, refused: Iterable[NotInjected]) -> Injection:
    return Injection(drawn, tuple(refused))


def judge(verdicts_ok: bool, injection: Injection) -> tuple[bool, str]:
    """The run's verdict: it fails on a broken invariant, or when too few of its faults happened; refusals
    alone never fail it. Returns (ok, the word the summary prints)."""
    if not verdicts_ok:
        return False, "VIOLATION"
    if not injection.enough:
        return False, f"TOO FEW FAULTS INJECTED ({injection.injected} of {injection.drawn})"
    return True, "OK"
