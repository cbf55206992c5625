"""Persistent (and recursive) watches for kazoo: ZooKeeper 3.6's ``addWatch``, which kazoo 2.11 has no call for.

A one-shot watch costs a read per firing and a watch per znode; one PERSISTENT_RECURSIVE watch on ``/tasks``
replaces one data watch per task, stays armed after it fires, and reports every create, change and delete
below it. ``AddWatch`` goes through kazoo's own request path, like ``zkio.MultiRead``.

kazoo does not know the events such a watch produces: its connection thread looks up one-shot watchers by
the event's exact path and forgets them. ``PersistentWatches`` therefore wraps the connection's event reader
once per client: every event is first offered to the persistent watches whose path covers it, then to
kazoo as before (a one-shot watcher on the same path still fires once; the server sends one notification
per connection and event, whatever watches asked for it).

Re-arming: the server keeps watches per connection and kazoo never re-registers any on reconnect (it fires
every one-shot watcher with a NONE event on SUSPENDED and forgets them). So on SUSPENDED or LOST each
persistent watcher gets a NONE event (path None): what it watched may change unseen from now on, and its
owner must read it all again once the connection is back. On CONNECTED the registry re-adds every watch;
``ensure`` lets the owner wait for that before its re-read, so nothing between the two is missed.

A server without ``addWatch`` (< 3.6) answers UNIMPLEMENTED: ``add`` returns False and the caller keeps its
one-shot watches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

from kazoo.client import KazooClient
from kazoo.exceptions import UnimplementedError
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Watch, int_struct, write_string
from kazoo.protocol.states import EVENT_TYPE_MAP, Callback, EventType, KazooState, WatchedEvent

log = logging.getLogger(__name__)

ADD_WATCH_OPCODE = 106  # ZooKeeper's OpCode.addWatch (3.6+)
REMOVE_WATCHES_OPCODE = 18  # OpCode.removeWatches
WAIT_S = 10.0


class WatchMode(IntEnum):
    """``ZooDefs.AddWatchModes``."""

    PERSISTENT = 0  # the znode itself: created, changed, deleted, children changed
    PERSISTENT_RECURSIVE = 1  # the znode and every descendant: created, changed, deleted (no child events)


# ``Watcher.WatcherType`` codes of a removeWatches request, per mode
_REMOVE_TYPE = {WatchMode.PERSISTENT: 4, WatchMode.PERSISTENT_RECURSIVE: 5}


def _path_and_code(path: str, code: int) -> bytes:
    """The body of a request made of a path and an int (kazoo's serializers are untyped)."""
    body: bytes = write_string(path) + int_struct.pack(code)
    return body


@dataclass(frozen=True)
class AddWatch:
    """``AddWatchRequest``: path, mode. The reply is an ``ErrorResponse`` (its code is in the header too)."""

    path: str
    mode: int
    type: ClassVar[int] = ADD_WATCH_OPCODE

    def serialize(self) -> bytes:
        return _path_and_code(self.path, self.mode)

    def deserialize(self, buffer: bytes, offset: int) -> None:
        return None


@dataclass(frozen=True)
class RemoveWatches:
    """``RemoveWatchesRequest``: path, watcher type."""

    path: str
    watcher_type: int
    type: ClassVar[int] = REMOVE_WATCHES_OPCODE

    def serialize(self) -> bytes:
        return _path_and_code(self.path, self.watcher_type)

    def deserialize(self, buffer: bytes, offset: int) -> None:
        return None


Watcher = Callable[[WatchedEvent], None]


@dataclass
class _Entry:
    mode: WatchMode
    watcher: Watcher
    armed: bool = False


class PersistentWatches:
    """The persistent watches of one kazoo client (``for_client`` gives the one registry per client).

    ``add(path, watcher, mode)`` arms a watch and waits for the server's answer; one watcher per path (adding
    again replaces the watcher and re-arms). Watchers run on kazoo's callback thread, like kazoo's own: they
    should only note or enqueue. Paths are the client's paths (kazoo's chroot is added and removed here).
    """

    _ATTR = "_zkc_persistent_watches"

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # full path (chroot included) -> entry
        self.supported: bool | None = None  # None until the server has answered an addWatch
        self.events = 0  # events dispatched to persistent watchers (read by tests and benchmarks)
        self._hook()
        client.add_listener(self._on_state)

    @classmethod
    def for_client(cls, client: Any) -> PersistentWatches:
        raw = getattr(client, "_client", client)  # an InterruptibleClient wraps the kazoo client
        with _REGISTRY_LOCK:
            registry = getattr(raw, cls._ATTR, None)
            if registry is None:
                registry = cls(raw)
                setattr(raw, cls._ATTR, registry)
            return registry

    # ---- the caller's side ------------------------------------------------------------------------
    def add(self, path: str, watcher: Watcher, mode: WatchMode = WatchMode.PERSISTENT_RECURSIVE) -> bool:
        """Arm a persistent watch on ``path`` (it need not exist); False if the server has no ``addWatch``.
        Raises what the request raised otherwise (connection loss, NoAuth): the caller decides."""
        if self.supported is False:
            return False
        full = self._full(path)
        with self._lock:
            self._entries[full] = _Entry(mode, watcher)
        try:
            self._arm(full)
        except UnimplementedError:
            log.warning("ZooKeeper has no addWatch (a server older than 3.6): using one-shot watches")
            self.supported = False
            with self._lock:
                self._entries.pop(full, None)
            return False
        return True  # any other error is raised: the watch stays registered, re-armed on CONNECTED or by ensure()

    def ensure(self, path: str) -> None:
        """Make sure ``path``'s watch is armed on the current connection (after a reconnect, before reading
        again what it watches); raises what the request raised."""
        full = self._full(path)
        with self._lock:
            entry = self._entries.get(full)
            if entry is None or entry.armed:
                return
        self._arm(full)

    def remove(self, path: str) -> None:
        """Stop watching ``path``: forgotten here at once, removed on the server if connected (best effort:
        an event already on its way finds no watcher)."""
        full = self._full(path)
        with self._lock:
            entry = self._entries.pop(full, None)
        if entry is None or not self._client.connected:
            return
        try:
            self._send(RemoveWatches(full, _REMOVE_TYPE[entry.mode])).get(timeout=WAIT_S)
        except Exception as exc:  # NoWatcher after a reconnect, connection loss: nothing left to remove
            log.debug("removing the persistent watch of %s: %s", path, exc)

    def armed(self, path: str) -> bool:
        with self._lock:
            entry = self._entries.get(self._full(path))
            return entry is not None and entry.armed

    # ---- requests ---------------------------------------------------------------------------------
    def _send(self, request: Any) -> Any:
        result = self._client.handler.async_result()
        self._client._call(request, result)
        return result

    def _arm(self, full: str) -> None:
        with self._lock:
            entry = self._entries.get(full)
            if entry is None:
                return
            mode = entry.mode
        self._send(AddWatch(full, int(mode))).get(timeout=WAIT_S)
        self.supported = True
        with self._lock:
            if self._entries.get(full) is entry:
                entry.armed = True

    def _rearm_all(self) -> None:
        """After CONNECTED (kazoo's connection thread: send, never wait)."""
        with self._lock:
            entries = [(full, e) for full, e in self._entries.items() if not e.armed]
        for full, entry in entries:
            result = self._send(AddWatch(full, int(entry.mode)))
            result.rawlink(lambda r, full=full, entry=entry: self._armed_async(full, entry, r))

    def _armed_async(self, full: str, entry: _Entry, result: Any) -> None:
        if not result.successful():
            log.info(
                "re-arming the persistent watch of %s: %s (re-read then re-armed by its owner)",
                full,
                type(result.exception).__name__,
            )
            return
        with self._lock:
            if self._entries.get(full) is entry:
                entry.armed = True

    # ---- connection states ------------------------------------------------------------------------
    def _on_state(self, state: str) -> None:
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with self._lock:
                entries = list(self._entries.values())
                for e in entries:
                    e.armed = False
            lost = WatchedEvent(EventType.NONE, state, None)
            for e in entries:
                self._client.handler.dispatch_callback(Callback("watch", e.watcher, (lost,)))
        elif state == KazooState.CONNECTED:
            self._rearm_all()

    # ---- events -----------------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        chroot = (self._client.chroot or "").rstrip("/")
        return chroot + path if chroot else path

    def _hook(self) -> None:
        """Wrap the connection's event reader (once per client; the connection object lives as long)."""
        conn: ConnectionHandler = self._client._connection
        original = conn._read_watch_event

        def read_watch_event(buffer: bytes, offset: int) -> Any:
            try:
                self._dispatch(buffer, offset)
            except Exception:  # never break kazoo's connection thread
                log.exception("dispatching a ZooKeeper event to the persistent watches")
            return original(buffer, offset)

        conn._read_watch_event = read_watch_event

    def _dispatch(self, buffer: bytes, offset: int) -> None:
        watch, _ = Watch.deserialize(buffer, offset)
        if watch.type not in EVENT_TYPE_MAP or not self._entries:
            return
        path = watch.path
        with self._lock:
            targets = [
                e.watcher
                for full, e in self._entries.items()
                if path == full
                or (e.mode is WatchMode.PERSISTENT_RECURSIVE and path.startswith(full.rstrip("/") + "/"))
            ]
        if not targets or self._client._stopped.is_set():
            return
        self.events += 1
        event = WatchedEvent(EVENT_TYPE_MAP[watch.type], self._client._state, self._client.unchroot(path))
        for w in targets:
            self._client.handler.dispatch_callback(Callback("watch", w, (event,)))


_REGISTRY_LOCK = threading.Lock()
