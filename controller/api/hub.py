"""Event streams as a fan-out: one watch of the cluster per API process (``ClusterWatch`` on one named
thread) feeds every open ``/api/v1/events`` stream through a bounded queue of its own. A stream costs no
thread and no ZooKeeper watch; a closed one frees its queue; a reader still a whole buffer behind when more
events come is dropped (its browser reconnects and starts from a fresh summary), while a burst larger than the
buffer (one refresh of many changes) reaches a reader that had caught up whole; past ``max_streams`` a new one
is refused with the reason. The watch itself is built once and kept: its ZooKeeper watches are one set per process."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from controller.admin import to_dict
from controller.admin.views import ClusterEvent
from controller.admin.watch import ClusterWatch
from controller.protocol.errors import ZkcError

log = logging.getLogger(__name__)

WAKE = ("wake",)  # a key that only wakes the watch thread (a new stream waits for its summary)
RETRY_S = 1.0  # after the watch fails (ZooKeeper away), wait this long before building it again


class StreamsFull(ZkcError):
    """The cap on open streams is reached: the client may retry later."""

    status = 503
    code = "too_many_streams"


@dataclass(frozen=True)
class Item:
    """What a stream sends next: the SSE frames of one refresh (shared by every stream), whether they count
    towards ``max_events``, or the end."""

    texts: tuple[str, ...]
    counts: bool = True
    end: bool = False


@dataclass(eq=False)
class Stream:
    """One open ``/events`` response: its queue of refreshes, the frames in it not yet written (``pending``,
    the measure of how far behind its reader is), and whether it has had its summary yet."""

    queue: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    pending: int = 0
    welcomed: bool = False
    opened: float = field(default_factory=time.monotonic)

    def sent(self) -> None:
        """One frame written to the reader's connection."""
        self.pending = max(0, self.pending - 1)


def frame(event: ClusterEvent) -> str:
    return f"data: {json.dumps(to_dict(event), default=str, separators=(',', ':'))}\n\n"


def summary(w: ClusterWatch) -> ClusterEvent:
    """The ``watching`` event a new stream starts with: the state the shared watch holds now."""
    ctl = f"controller {w.controller[0]} (epoch {w.controller[1]})" if w.controller else "no controller"
    running = sum(1 for o in w.owners.values() if o)
    msg = (
        f"watching {w.layout.root}: {ctl}, {len(w.brokers)} brokers, {len(w.groups)} groups, "
        f"{len(w.tasks)} tasks ({running} owned)"
    )
    on = w.maintenance is not None and w.maintenance.on
    if on and w.maintenance is not None:
        msg += f"; MAINTENANCE MODE ({w.maintenance.by}): {w.maintenance.reason}"
    return ClusterEvent(
        time.time(),
        "watching",
        w.layout.root,
        msg,
        {
            "maintenance": on,
            "controller": w.controller[0] if w.controller else None,
            "epoch": w.controller[1] if w.controller else None,
            "brokers": dict(w.brokers),
            "groups": {g: s.state for g, s in w.groups.items()},
            "tasks": len(w.tasks),
            "owned": running,
        },
    )


class EventHub:
    """The shared watch and its streams. ``subscribe``/``unsubscribe``/``close`` run on the event loop; the
    watch thread hands it frames with ``call_soon_threadsafe`` (the streams' set is the loop's alone)."""

    def __init__(self, make_watch: Callable[[], ClusterWatch], max_streams: int, buffer: int) -> None:
        self.make_watch = make_watch
        self.max_streams = max_streams
        self.buffer = buffer
        self.streams: set[Stream] = set()
        self.dropped = 0
        self._pending: list[Stream] = []
        self._lock = threading.Lock()
        self._watch: ClusterWatch | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._wanted = threading.Event()

    # ---- the loop's side --------------------------------------------------------------------------
    def subscribe(self) -> Stream:
        if self._stopping.is_set():
            raise StreamsFull("this API server is shutting down")
        if len(self.streams) >= self.max_streams:
            raise StreamsFull(
                f"{len(self.streams)} event streams are open, the most this server serves "
                f"(--max-streams {self.max_streams}); retry later or use another API server"
            )
        self._loop = asyncio.get_running_loop()
        stream = Stream()
        self.streams.add(stream)
        with self._lock:
            self._pending.append(stream)
            w = self._watch
        if w is not None:
            w.queue.put(WAKE)
        self._wanted.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zkc-api-events", daemon=True)
            self._thread.start()
        return stream

    def unsubscribe(self, stream: Stream) -> None:
        self.streams.discard(stream)
        with self._lock:
            if stream in self._pending:
                self._pending.remove(stream)
        if not self.streams:
            self._wanted.clear()

    def close(self) -> None:
        """Shutting down: every stream ends now (not cancelled mid-write), no new one opens."""
        self._stopping.set()
        self._wanted.set()
        self._end_all("this API server is shutting down")

    def _deliver(self, frames: list[str], welcome: str | None, joined: list[Stream]) -> None:
        if frames:
            item = Item(tuple(frames))
            for s in list(self.streams):
                if s.welcomed:
                    self._offer(s, item)
        for s in joined:
            if s in self.streams and welcome is not None:
                s.welcomed = True
                self._offer(s, Item((welcome,), counts=False))

    def _offer(self, s: Stream, item: Item) -> None:
        if s.pending >= self.buffer:
            self.dropped += 1
            self._end(s, f"this reader fell {self.buffer} events behind and was dropped; reconnect for a fresh summary")
            return
        s.queue.put_nowait(item)
        s.pending += len(item.texts)

    def _end(self, s: Stream, reason: str) -> None:
        self.unsubscribe(s)
        while not s.queue.empty():
            s.queue.get_nowait()
        s.pending = 0
        end = f"event: end\ndata: {json.dumps({'reason': reason})}\n\n"
        s.queue.put_nowait(Item((end,), counts=False, end=True))

    def _end_all(self, reason: str) -> None:
        for s in list(self.streams):
            self._end(s, reason)

    # ---- the watch thread -------------------------------------------------------------------------
    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    def _take_joined(self) -> list[Stream]:
        with self._lock:
            joined, self._pending = self._pending, []
        return joined

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wanted.wait()
            if self._stopping.is_set():
                return
            w = None
            try:
                w = self.make_watch()
                w.start()
                with self._lock:
                    self._watch = w
                self._follow(w)
            except Exception as exc:  # ZooKeeper away or the session lost: streams end, browsers reconnect
                log.warning("the event streams' watch failed (%s: %s); ending the streams", type(exc).__name__, exc)
                self._post(self._end_all, "the cluster watch was lost (ZooKeeper unreachable?); reconnect")
                with self._lock:
                    self._watch = None
                self._stopping.wait(RETRY_S)
            finally:
                if w is not None:
                    w.close()

    def _follow(self, w: ClusterWatch) -> None:
        while not self._stopping.is_set():
            joined = self._take_joined()
            if joined:
                self._post(self._deliver, [], frame(summary(w)), joined)
            try:
                keys = [w.queue.get(timeout=0.25)]
            except queue.Empty:
                continue
            while True:
                try:
                    keys.append(w.queue.get_nowait())
                except queue.Empty:
                    break
            real = [k for k in dict.fromkeys(keys) if k != WAKE]
            frames = [frame(e) for e in w.refresh(real)] if real else []
            joined = self._take_joined()
            if frames or joined:
                self._post(self._deliver, frames, frame(summary(w)) if joined else None, joined)
