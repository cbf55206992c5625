"""A connection whose reader stops reading is cut. The server's writes to it wait once its socket and a
transport buffer are full (asyncio pauses the writer); a reader that lets them wait ``stall_s`` holds a
response, its buffers and a connection for nothing. Closing it politely would wait for the unread bytes to be
sent first (for ever, in asyncio's buffer, then in the kernel's), so it is reset: no linger, then aborted. Composed around any HTTP protocol (uvicorn's among them): it forwards
every event and only watches the pause."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class StalledWriteGuard(asyncio.Protocol):
    """Forwards to ``inner``; aborts the transport when its writes stay paused for ``stall_s`` seconds."""

    def __init__(self, inner: asyncio.Protocol, stall_s: float) -> None:
        self.inner = inner
        self.stall_s = stall_s
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.stall_s, self._cut)

    def resume_writing(self) -> None:
        self._cancel()
        self.inner.resume_writing()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cut(self) -> None:
        self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            peer = self.transport.get_extra_info("peername")
            log.warning("closing the connection of %s: it has read nothing for %g s", peer, self.stall_s)
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:  # a reset: the kernel drops the unsent bytes instead of retrying them to a closed window
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()


def guarded(protocol: Callable[..., asyncio.Protocol], stall_s: float) -> Callable[..., asyncio.Protocol]:
    """A protocol factory like ``protocol`` whose connections are cut once their reader stalls ``stall_s``."""

    def make(*args: Any, **kwargs: Any) -> asyncio.Protocol:
        return StalledWriteGuard(protocol(*args, **kwargs), stall_s)

    return make
