"""What a part of the controller sees of it: ``Host``, the current activation (token, epoch, fenced writer,
context) and the few operations a part calls back. A part holds a ``Host``, never the ``Controller``, as a
kazoo recipe uses only its client's public API; what else it needs (the ZooKeeper client, the layout, the
clock, a sibling part) it receives as a plain value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from controller.daemon.context import ControllerContext
from controller.daemon.events import ControllerEvent
from controller.protocol.errors import InternalError
from controller.zk.io import FencedWriter

T = TypeVar("T")

#: a kazoo watch callback: runs on kazoo's thread and only enqueues
Watcher = Callable[[Any], None]


class NotActive(InternalError, RuntimeError):
    """A handler reached for the activation of a controller that has none (it checks ``current`` first)."""


class Host(Protocol):
    """The controller as its parts see it; every call is made on the event thread."""

    @property
    def token(self) -> int:
        """The activation token: moves on at every activation, reload and resign."""
        ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def ctx(self) -> ControllerContext | None: ...

    @property
    def writer(self) -> FencedWriter | None: ...

    def current(self, token: int) -> bool:
        """The controller is active and ``token`` is its activation's: else the event is stale, dropped."""
        ...

    def put(self, event: ControllerEvent) -> None: ...

    def watch(self, make: Callable[[int], ControllerEvent]) -> Watcher:
        """A watch callback that enqueues ``make(token)`` with the token of the activation arming it."""
        ...

    def bucket_watch(self, make: Callable[[int, str | None], ControllerEvent]) -> Watcher:
        """A children watch of buckets: the event names the bucket that fired (None: the connection dropped)."""
        ...

    def write(self, fn: Callable[[], T]) -> T:
        """Run one fenced write (behind the test hook that can stall it)."""
        ...

    def apply(self, group: str, decisions: list[Any]) -> None:
        """Carry out a group coordinator's decisions (``groups.GroupDriver.apply``)."""
        ...


def context_of(host: Host) -> ControllerContext:
    """The context of the active controller (a handler calls this once ``current`` said yes)."""
    ctx = host.ctx
    if ctx is None:
        raise NotActive("the controller has no context: it is not active")
    return ctx


def writer_of(host: Host) -> FencedWriter:
    """The fenced writer of the active controller."""
    writer = host.writer
    if writer is None:
        raise NotActive("the controller has no fenced writer: it is not active")
    return writer
