"""kazoo's threading handler, waiting on its sockets with one ``poll(2)`` call instead of a new epoll set.

kazoo's connection thread waits for every message it reads or writes through ``handler.select``, and its
``selector_select`` builds an epoll set for each call: epoll_create, a registration per socket, the wait,
close — five system calls and a few Python objects per wait, so several per request. On a broker that
is most of what a round trip costs the client: a synchronous read took 189 µs of the process's CPU with
it and 78-110 µs with ``poll`` (local ZooKeeper, 3,000 reads), pipelined reads 107-148 µs against 70-89 µs.
On a machine running many brokers (the simulator's farms, a worker pool), that CPU is what every
broker's round trips queue for.

``poll`` has no descriptor-number limit either (the reason kazoo left ``select.select``), so the
semantics are kazoo's own: the ready objects of ``rlist`` and ``wlist``, nothing in ``xlist``; an error or
hang-up on a descriptor counts as ready, as ``select`` reports it, so the read or write that follows raises.
"""

from __future__ import annotations

import math
import select
from collections.abc import Sequence
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

_HAS_POLL = hasattr(select, "poll")
_READ = select.POLLIN | select.POLLPRI if _HAS_POLL else 0
_WRITE = select.POLLOUT if _HAS_POLL else 0
_TROUBLE = select.POLLERR | select.POLLHUP | select.POLLNVAL if _HAS_POLL else 0  # reported as ready, as select does


def _fd(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else int(obj.fileno())
    if fd < 0:
        raise ValueError(f"invalid file descriptor: {obj!r}")
    return fd


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s contract (the objects ready to read, to write; ``xlist`` is never reported, as in
    kazoo's own), with one ``poll`` call: ``timeout`` in seconds, None to wait for ever."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    wanted = [(_fd(obj), obj, _READ) for obj in rlist] + [(_fd(obj), obj, _WRITE) for obj in wlist]
    masks: dict[int, int] = {}
    for fd, _, mask in wanted:
        masks[fd] = masks.get(fd, 0) | mask
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1000))
    if not ready:
        return [], [], []
    events = dict(ready)
    readable = [obj for fd, obj, mask in wanted if mask == _READ and events.get(fd, 0) & (_READ | _TROUBLE)]
    writable = [obj for fd, obj, mask in wanted if mask == _WRITE and events.get(fd, 0) & (_WRITE | _TROUBLE)]
    return readable, writable, []


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo ships no types: its classes are Any
    """``SequentialThreadingHandler`` whose ``select`` is :func:`poll_select` (where the platform has
    ``poll``; elsewhere kazoo's own)."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return poll_select(*args, **kwargs)


def make_handler() -> SequentialThreadingHandler:
    return PollingHandler() if _HAS_POLL else SequentialThreadingHandler()
