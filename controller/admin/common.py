"""What every admin module shares: the operator error, laying out a fresh root, and bounded waits."""

from __future__ import annotations

import logging
import time
from typing import Callable


from controller.zk.layout_io import ensure_layout  # noqa: F401  (part of the admin library)
from controller.protocol.errors import ZkcError

log = logging.getLogger(__name__)


class AdminError(ZkcError, RuntimeError):
    """An operator request that cannot be carried out (unknown task, no such broker, ...)."""


class NotFound(AdminError):
    """The task, broker, group or znode named does not exist (HTTP 404)."""

    status = 404
    code = "not_found"


class Conflict(AdminError):
    """The request clashes with the cluster's state: an id that exists, a task being deleted, a broker of
    another group (HTTP 409)."""

    status = 409
    code = "conflict"


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (bounded); returns whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)

# how long --wait operations wait by default (seconds)
WAIT_S = 30.0
