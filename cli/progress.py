"""Progress of long operations (``--wait`` commands, the demo): what is awaited and how far it is.

On a terminal, one line redrawn in place with a bar; anywhere else (a log, a pipe), a plain timestamped
line whenever the count changes, and at most one every ``quiet_s`` otherwise, with no control characters.
Progress goes to stderr, so ``--json`` output on stdout stays pure JSON (and ``--json`` shows none at all).
The rendering is pure (``render_tty``, ``render_plain``), so it is tested without a terminal.
"""

from __future__ import annotations

import sys
import time
from typing import IO

BAR = 24


def _count(done: int, total: int, unit: str) -> str:
    return f"{done}/{total} {unit}".rstrip()


def render_tty(
    what: str, done: int, total: int, elapsed: float, timeout: float | None, width: int, unit: str = ""
) -> str:
    """One line of at most ``width`` characters: ``what  [#####-----] 3/8 moved  4.1s/60s``."""
    frac = 1.0 if total <= 0 else max(0.0, min(1.0, done / total))
    filled = round(frac * BAR)
    clock = f"{elapsed:.1f}s" + (f"/{timeout:g}s" if timeout else "")
    tail = f" [{'#' * filled}{'-' * (BAR - filled)}] {_count(done, total, unit)}  {clock}"
    if len(tail) + 10 > width:  # a narrow terminal: the count and the clock, no bar
        tail = f" {_count(done, total, unit)}  {clock}"
    room = max(0, width - len(tail))
    head = what if len(what) <= room else (what[: max(0, room - 1)] + "…" if room > 1 else "")
    return (head + tail)[:width]


def render_plain(what: str, done: int, total: int, elapsed: float, timeout: float | None, unit: str = "") -> str:
    """A log line: ``[  4.1s] what: 3/8 moved (timeout 60s)``."""
    limit = f" (timeout {timeout:g}s)" if timeout else ""
    return f"[{elapsed:6.1f}s] {what}: {_count(done, total, unit)}{limit}"


class Progress:
    """Reports (done, total) of one wait; ``enabled=False`` (``--json``) reports nothing."""

    def __init__(
        self,
        what: str,
        timeout: float | None = None,
        unit: str = "",
        stream: IO[str] | None = None,
        enabled: bool = True,
        tty: bool | None = None,
        width: int | None = None,
        quiet_s: float = 5.0,
    ) -> None:
        self.what = what
        self.timeout = timeout
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty() if tty is None else tty
        self.width = width
        self.quiet_s = quiet_s
        self.t0 = time.monotonic()
        self._last: tuple[int, int] | None = None
        self._last_at = 0.0
        self._drawn = False

    def _width(self) -> int:
        if self.width is not None:
            return self.width
        import shutil

        return max(20, shutil.get_terminal_size((80, 24)).columns - 1)

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.t0
        if self.tty:
            line = render_tty(self.what, done, total, elapsed, self.timeout, self._width(), self.unit)
            self.stream.write("\r" + line.ljust(self._width()))
            self._drawn = True
        elif (done, total) != self._last or now - self._last_at >= self.quiet_s:
            self.stream.write(render_plain(self.what, done, total, elapsed, self.timeout, self.unit) + "\n")
            self._last_at = now
        else:
            return
        self._last = (done, total)
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the in-place line (a terminal) so what follows starts on its own line."""
        if self.enabled and self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()


def waiting(what: str, timeout: float, unit: str, wait: bool, json_out: bool) -> Progress:
    """The progress of a ``--wait`` command: shown only when it waits and prints for people."""
    return Progress(what, timeout=timeout, unit=unit, enabled=wait and not json_out)
