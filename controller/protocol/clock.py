"""Time is injected: protocol code asks a Clock, so timeouts and delays are testable without sleeping
and the deterministic simulation can run hours of protocol time in seconds."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic within one process."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()


class WallClock:
    """Wall-clock seconds, for timestamps that other processes compare (run intervals, status)."""

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._now += seconds
        return self._now

    def set(self, when: float) -> None:
        if when < self._now:
            raise ValueError("time does not go backwards")
        self._now = when
