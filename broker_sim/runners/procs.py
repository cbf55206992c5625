"""Child processes that are always stopped by their id: each runs in its own session (process group), so
``stop_process`` can signal the group by its id and no grandchild (a JVM ``spark-class`` exec'd, a
launcher it forked) outlives it. Used by the Spark Declarative Pipelines runs and by the tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import IO, Mapping, Sequence


def spawn(cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
          log: str | Path | None = None, pipe_output: bool = False) -> subprocess.Popen:
    """Start ``cmd`` in a new session; output to ``log`` (appended), to a pipe, or discarded."""
    out: IO | int
    if pipe_output:
        out = subprocess.PIPE
    elif log is not None:
        out = open(log, "ab")  # noqa: SIM115 - handed to the child, closed below
    else:
        out = subprocess.DEVNULL
    try:
        return subprocess.Popen(list(cmd), env=dict(env) if env is not None else None, cwd=cwd,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, text=pipe_output, bufsize=1 if pipe_output else -1)
    finally:
        if log is not None and not pipe_output:
            out.close()  # type: ignore[union-attr]


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal the process group ``pgid``; False when no member is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a group member we may not signal: nothing we can do about it
        return True


def group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


def stop_process(proc: subprocess.Popen, *, grace_s: float = 10.0, timeout_s: float = 30.0) -> int | None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace_s``; return once every member is gone.

    Raises TimeoutError if the group is still there after ``timeout_s`` (an unkillable process: the caller
    must not act as if it stopped). Returns the leader's exit code.
    """
    pgid = proc.pid  # start_new_session: the leader's pid is the group's id
    deadline = time.monotonic() + max(timeout_s, grace_s)
    if proc.poll() is None or group_alive(pgid):
        _signal_group(pgid, signal.SIGTERM)
    grace_end = time.monotonic() + grace_s
    killed = False
    while True:
        code = proc.poll()
        if code is not None and not group_alive(pgid):
            return code
        now = time.monotonic()
        if not killed and now >= grace_end:
            _signal_group(pgid, signal.SIGKILL)
            killed = True
        if now >= deadline:
            raise TimeoutError(f"process {proc.pid} ({proc.args[0] if proc.args else '?'}) did not exit "
                               f"within {timeout_s:.0f}s")
        time.sleep(0.05)


__all__ = ["spawn", "stop_process", "group_alive"]
