"""What every admin module shares: the operator error, laying out a fresh root, and bounded waits."""

from __future__ import annotations

import logging
import time
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from controller.layout import ZkLayout
from controller.layout_io import LayoutError, check_root, lay_out_buckets

log = logging.getLogger(__name__)


class AdminError(RuntimeError):
    """An operator request that cannot be carried out (unknown task, no such broker, ...)."""


class NotFound(AdminError):
    """The task, broker, group or znode named does not exist (HTTP 404)."""


class Conflict(AdminError):
    """The request clashes with the cluster's state: an id that exists, a task being deleted, a broker of
    another group (HTTP 409)."""


def ensure_layout(client: KazooClient, layout: ZkLayout) -> None:
    """Create the persistent containers and buckets of the layout (idempotent); a root in the flat layout of
    an earlier release raises LayoutError (``zkctl layout migrate`` converts it) before anything is written."""
    laid_out = check_root(client, layout)
    client.ensure_path(layout.root)
    optional = {layout.settings, layout.maintenance}  # absent: the defaults (no throttle, maintenance off)
    for path in layout.persistent_roots():
        try:
            client.ensure_path(path)
        except NoAuthError:
            if path not in optional:
                raise
            # a secured root laid out by an earlier release: only the admin role may create these, and
            # `zkctl security init` (idempotent) does; until then they read as their defaults
            log.warning("%s is missing and these credentials may not create it; run `zkctl security init`", path)
    if laid_out:
        return
    try:
        lay_out_buckets(client, layout)
    except NoAuthError:
        raise LayoutError(f"{layout.root} is not laid out in buckets yet and these credentials may not create them: "
                          "run `zkctl security init` with admin credentials") from None


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
