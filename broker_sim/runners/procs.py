"""Child processes that are always stopped by their id: each runs in its own session (process group), so
``stop_process`` can signal the group by its id and no grandchild (a JVM ``spark-class`` exec'd, a
launcher it forked) outlives it. Used by the Spark Declarative Pipelines runs and by the tests.

A child in its own session does not die with us: ``spawn(..., die_with_parent=True)`` asks Linux for a
SIGKILL when this process dies (``PR_SET_PDEATHSIG``), so a worker killed with SIGKILL leaves no Spark
Connect server or SDP run behind to hold the project (and its Derby metastore) against the next owner.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, TypeVar

PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def _die_with_parent_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` setting the parent-death signal to SIGKILL (Linux only; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only makes the call
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # we died between the fork and the prctl: follow at once
            os._exit(1)

    return preexec


class _Forker:
    """One long-lived thread forks every die-with-parent child: Linux sends the parent-death signal when the
    *thread* that forked the child ends, so a child forked by a short-lived thread would die with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="procs-forker", daemon=True)
                self._thread.start()
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def _run(self) -> None:
        while True:
            fn, fut = self._queue.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller
                fut.set_exception(exc)


_FORKER = _Forker()


def spawn(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    log: str | Path | None = None,
    pipe_output: bool = False,
    die_with_parent: bool = False,
) -> subprocess.Popen[Any]:
    """Start ``cmd`` in a new session; output to ``log`` (appended), to a pipe (text), or discarded.

    ``die_with_parent``: the child is SIGKILLed when this process dies, even by SIGKILL (Linux)."""
    log_file = open(log, "ab") if log is not None and not pipe_output else None  # handed to the child, closed below
    out: IO[bytes] | int = subprocess.PIPE if pipe_output else log_file if log_file is not None else subprocess.DEVNULL
    try:

        def popen(preexec: Callable[[], None] | None = None) -> subprocess.Popen[Any]:
            return subprocess.Popen(
                list(cmd),
                env=dict(env) if env is not None else None,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=pipe_output,
                bufsize=1 if pipe_output else -1,
                preexec_fn=preexec,
            )

        if die_with_parent and (preexec := _die_with_parent_preexec()) is not None:
            return _FORKER.call(lambda: popen(preexec))
        return popen()
    finally:
        if log_file is not None:
            log_file.close()


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


def _program(proc: subprocess.Popen[Any]) -> str:
    """The program ``proc`` runs, for messages."""
    args = proc.args
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args)
    return os.fsdecode(args[0]) if args else "?"


def stop_process(proc: subprocess.Popen[Any], *, grace_s: float = 10.0, timeout_s: float = 30.0) -> int | None:
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
            raise TimeoutError(f"process {proc.pid} ({_program(proc)}) did not exit within {timeout_s:.0f}s")
        time.sleep(0.05)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs: exists and is not a zombie (exited, not yet reaped by its parent)."""
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # gone
        return False


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:  # gone, or not ours to inspect
        return []


def kill_processes(pids: Iterable[int], pgids: Iterable[int] = ()) -> list[int]:
    """SIGKILL ``pids`` with their descendants (collected first: orphans are re-parented) and the process
    groups ``pgids``; no waiting, nothing that can block. Returns the pids signalled."""
    victims: list[int] = []
    for pid in pids:
        victims += _descendants(pid) + [pid]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pgid in pgids:
        _signal_group(pgid, signal.SIGKILL)
    return victims


__all__ = ["spawn", "stop_process", "group_alive", "kill_processes", "process_alive"]
