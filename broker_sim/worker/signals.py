"""A broker process's signals: SIGTERM asks for a controlled shutdown; SIGINT once does too, twice stops now."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from broker_sim.worker.core import Worker

log = logging.getLogger(__name__)


def install_signal_handlers(worker: Worker, on_exit: Callable[[], None]) -> None:
    """SIGTERM = controlled shutdown; SIGINT once = controlled shutdown, twice = immediate stop."""
    presses = {"int": 0}

    def term(_sig: int, _frame: Any) -> None:
        log.info("SIGTERM: controlled shutdown of %s", worker.id)
        threading.Thread(target=worker.request_shutdown, name=f"worker-{worker.id}-sigterm", daemon=True).start()

    def intr(_sig: int, _frame: Any) -> None:
        presses["int"] += 1
        if presses["int"] >= 2:
            log.warning("second SIGINT: stopping %s now", worker.id)
            on_exit()
        else:
            term(_sig, _frame)

    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGINT, intr)
