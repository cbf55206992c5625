"""The broker's lease as a process that runs one of its tasks reads it: until when it may run.

Why here and not only in the guard: the exactly-once promise must not rest on one helper process. The lease
guard (``broker_sim.worker.guard``) kills a paused broker's processes from outside; an isolated driver also
keeps the lease itself (``LeaseKeeper``) and ends its own run before the deadline when its broker stops
renewing it, so a guard killed with ``kill -9`` leaves the deadline enforced. Only a renewal by the broker
moves the deadline: a lease file that turns bad, vanishes or names another broker leaves the last good lease
in force, and that one runs out.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: A lease file is a few hundred bytes; anything past this is not one.
MAX_LEASE_BYTES = 64 * 1024
#: How long before the deadline a driver ends its run: its check period and its own kill, which a loaded host
#: can slow to a few hundred milliseconds (measured: 0.4 s at load average 18).
LEAD_S = 0.5


@dataclass(frozen=True)
class Lease:
    """What the guard reads: until when (``CLOCK_MONOTONIC``, shared by every process of a Linux host) the
    processes listed may run, and whose lease it is."""

    broker: str
    owner_pid: int
    expires: float | None  # None: no task holds the session (nothing to enforce)
    pids: tuple[int, ...] = ()
    pgids: tuple[int, ...] = ()

    def encode(self) -> str:
        return json.dumps(
            {
                "broker": self.broker,
                "owner_pid": self.owner_pid,
                "expires": self.expires,
                "pids": list(self.pids),
                "pgids": list(self.pgids),
            }
        )

    @staticmethod
    def decode(text: str) -> Lease:
        body = json.loads(text)
        return Lease(
            broker=str(body["broker"]),
            owner_pid=int(body["owner_pid"]),
            expires=None if body.get("expires") is None else float(body["expires"]),
            pids=tuple(int(p) for p in body.get("pids", ())),
            pgids=tuple(int(p) for p in body.get("pgids", ())),
        )


def write_lease(path: Path, lease: Lease) -> None:
    """Atomically (write, then rename): the guard never reads half a lease."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(lease.encode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_lease(path: Path) -> Lease | None:
    """The lease in ``path``, or None if it is absent, too large, not a regular file or not a lease."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a FIFO or a device: not a lease
                return None
            data = f.read(MAX_LEASE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_LEASE_BYTES:
        return None
    try:
        return Lease.decode(data.decode())
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, UnicodeDecodeError):
        return None


class LeaseKeeper:
    """A driver's copy of its broker's lease: the deadline it ends its run by, ``lead_s`` early.

    Pure (no I/O, time given): ``update`` with what was read (None: nothing good), ``due(now)`` says whether
    the run must end now."""

    def __init__(self, broker_pid: int, lead_s: float = LEAD_S) -> None:
        self.broker_pid = broker_pid
        self.lead_s = lead_s
        self.lease: Lease | None = None

    def update(self, lease: Lease | None) -> None:
        """A renewal: only a good lease of our own broker replaces the one in force."""
        if lease is not None and lease.owner_pid == self.broker_pid:
            self.lease = lease

    def deadline(self) -> float | None:
        """The instant (monotonic) the run must have ended by; None: the broker enforces nothing now."""
        if self.lease is None or self.lease.expires is None:
            return None
        return self.lease.expires - self.lead_s

    def due(self, now: float) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline


__all__ = ["Lease", "LeaseKeeper", "read_lease", "write_lease", "LEAD_S", "MAX_LEASE_BYTES"]
