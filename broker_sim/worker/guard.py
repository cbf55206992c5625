"""The lease guard: ``python -m broker_sim.worker.guard LEASE_FILE``, one per broker process that runs tasks
in processes of their own (a Spark driver JVM, Declarative Pipelines runs).

It enforces the fence deadline when the broker cannot: a broker paused by SIGSTOP (or a VM pause) runs no
thread, while its Spark driver JVM, a process of its own, would go on committing micro-batches. The broker's
watchdog renews the lease (``deadline.Lease``: an expiry on ``CLOCK_MONOTONIC``, which every process of a
Linux host shares, and the processes that run its tasks); once ``now >= expires`` the guard SIGKILLs those
processes and everything they started. It runs in a session of its own, so a signal to the broker's process
group does not reach it, and it exits when the lease file is removed (a clean stop) or when the broker is gone
(after killing what the broker left behind).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

from broker_sim.runners.lease import Lease
from broker_sim.runners.procs import kill_processes, process_alive

log = logging.getLogger("broker_sim.worker.guard")

PERIOD_S = 0.02


def run(path: Path) -> int:
    """Watch ``path`` until it is removed or its broker is gone; kill at expiry. The loop ends with the broker."""
    lease: Lease | None = None
    killed_at: float | None = None
    while True:
        try:
            lease = Lease.decode(path.read_text())
        except FileNotFoundError:
            return 0  # a clean stop removed it
        except (OSError, ValueError, KeyError, TypeError):
            pass  # keep the last good lease
        if lease is None:
            time.sleep(PERIOD_S)
            continue
        now = time.monotonic()
        if not process_alive(lease.owner_pid):
            kill_processes(lease.pids, lease.pgids)
            log.warning("guard: broker %s (pid %d) is gone; killed what it left running", lease.broker, lease.owner_pid)
            try:
                path.unlink()
            except OSError:
                pass
            return 0
        if lease.expires is not None and now >= lease.expires and (lease.pids or lease.pgids):
            if killed_at is None or now - killed_at > 1.0:
                victims = kill_processes(lease.pids, lease.pgids)
                killed_at = now
                log.critical(
                    "guard: the lease of broker %s (pid %d) ran out %.3fs ago unrenewed: killed %s and "
                    "process groups %s",
                    lease.broker,
                    lease.owner_pid,
                    now - lease.expires,
                    victims,
                    list(lease.pgids),
                )
        time.sleep(PERIOD_S)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m broker_sim.worker.guard LEASE_FILE", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
