"""What every admin module shares: the operator error, laying out a fresh root, filing a request, and
bounded waits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.zk.layout_io import ensure_layout as ensure_layout  # part of the admin library

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


#: told (done, total) while a ``--wait`` request waits (the CLI draws it; the API passes none)
Progress = Callable[[int, int], None]
#: what a ``wait_watched`` check arms on what it reads: called when a ZooKeeper watch fires
Watch = Callable[[Any], None]


def wait_watched(
    check: Callable[[Watch], bool | tuple[int, int]],
    timeout: float,
    interval: float = 0.25,
    progress: Progress | None = None,
) -> bool:
    """Wait until ``check(watch)`` is done: it arms ``watch`` on what it reads, and is re-run when a watch
    fires or at least every ``interval`` (bounded by ``timeout``). A check returns True/False, or (done,
    total), done when equal, which ``progress`` is told at every look."""
    fired = threading.Event()
    watch: Watch = lambda _event: fired.set()  # one callable: kazoo keeps a set, so re-arming does not pile up
    deadline = time.monotonic() + timeout
    while True:
        fired.clear()
        got = check(watch)
        done, total = got if isinstance(got, tuple) else (int(bool(got)), 1)
        if progress is not None:
            progress(done, total)
        if done >= total:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        fired.wait(min(remaining, interval))


def file_request(client: KazooClient, path: str, payload: Any) -> bool:
    """Create an admin request znode once; True if the same request was already pending."""
    try:
        data = payload if isinstance(payload, bytes) else codecs.encode(payload)
        client.create(path, data, makepath=True)
        return False
    except NodeExistsError:
        return True
