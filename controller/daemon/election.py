"""Election and epoch: win ``/controller``, bump ``/controller_epoch`` (whose zkVersion fences every
write), give the seat up, and the connection states (SUSPENDED holds events, CONNECTED re-checks ownership
and replays them, LOST resigns and stands again)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)

from controller.daemon import events as ev
from controller.daemon.context import TRANSIENT
from controller.daemon.events import ControllerEvent
from controller.daemon.host import Watcher
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.registration_records import ControllerInfo
from controller.zk.io import InterruptibleClient

log = logging.getLogger(__name__)

# After a failed activation the controller stands aside this long (doubling per failure in a row, up to the
# maximum): a standby can take the seat, and a controller that cannot load never holds it without a context.
ACTIVATION_BACKOFF_S = 1.0
ACTIVATION_BACKOFF_MAX_S = 60.0


class Seat(Protocol):
    """The controller as its election sees it: whether it holds the seat, the activation it starts or ends,
    and the connection state its event thread dispatches by (held events while SUSPENDED)."""

    @property
    def active(self) -> bool: ...

    @property
    def epoch(self) -> int | None: ...

    @property
    def stopping(self) -> bool: ...

    connected: bool
    needs_reload: bool
    held: list[Any]

    def put(self, event: ControllerEvent) -> None: ...

    def put_front(self, events: list[Any]) -> None:
        """Re-queue held events ahead of newer ones."""
        ...

    def watch(self, make: Callable[[int], ControllerEvent]) -> Watcher: ...

    def activate(self, epoch: int, epoch_zk_version: int) -> None: ...

    def resign(self, reason: str) -> None: ...

    def reload(self) -> None: ...


class Election:
    """The controller's election and connection-state handlers."""

    def __init__(self, seat: Seat, zk: InterruptibleClient, layout: ZkLayout, controller_id: str, machine: str) -> None:
        self._seat = seat
        self._zk = zk
        self._layout = layout
        self._id = controller_id
        self._machine = machine  # the host name written into /controller
        self.retry_timer: threading.Timer | None = None
        self.failed_activations = 0  # in a row; reset by an activation that loads
        self._aside_until = 0.0  # (monotonic) no election before this: a failed activation backs off

    # ---- election ---------------------------------------------------------------------------------
    def elect(self) -> None:
        """Race for ``/controller``; on winning, bump the epoch conditionally and load the context."""
        if self._seat.active or self._seat.stopping or time.monotonic() < self._aside_until:
            return  # (standing aside: the back-off's timer runs for election again)
        zk, lay = self._zk, self._layout
        try:
            try:
                zk.create(lay.controller_epoch, codecs.encode_epoch(0), makepath=True)
            except NodeExistsError:
                pass
            data, stat = zk.get(lay.controller_epoch)
            # Every election bumps the epoch and the znode's version together, so the version is never
            # below the last epoch: if the text was overwritten (garbage, or a lower number), continue
            # above the version instead of refusing to run (no controller at all) or going backwards.
            try:
                epoch = max(codecs.decode_epoch(data, lay.controller_epoch), stat.version)
            except PayloadError as exc:
                log.error("%s; continuing from its version %d", exc, stat.version)
                epoch = stat.version
            info = ControllerInfo(controller_id=self._id, epoch=epoch + 1, host=self._machine, since=time.time())
            try:
                zk.create(lay.controller, codecs.encode(info), ephemeral=True)
            except NodeExistsError:
                held = zk.exists(lay.controller, watch=self._candidate_watch)
                if held is not None and held.ephemeralOwner == zk.client_id[0]:
                    # ours, from an election ZooKeeper cut short (the epoch bump's answer was lost): nobody
                    # else can win while it exists, so remove it and run again
                    log.warning("controller %s: removing /controller left by its own interrupted election", self._id)
                    try:
                        zk.delete(lay.controller, version=held.version)
                    except (NoNodeError, BadVersionError):
                        pass
                    self._seat.put(ev.Reelect())
                elif held is None:
                    self._seat.put(ev.Reelect())
                return
            try:
                new_stat = zk.set(lay.controller_epoch, codecs.encode_epoch(epoch + 1), version=stat.version)
            except BadVersionError:
                log.warning("controller %s: epoch moved while electing; retrying", self._id)
                zk.delete(lay.controller)
                self._seat.put(ev.Reelect())
                return
            self._seat.activate(epoch + 1, new_stat.version)
        except TRANSIENT:
            if not self._seat.stopping:
                self.retry_later()

    def activation_failed(self, exc: BaseException) -> float:
        """The context could not be loaded: give the seat up (the seat's ``resign`` deletes our ``/controller``,
        checked against our session) and stand aside for a growing back-off, then run again. Returns the
        back-off in seconds."""
        self.failed_activations += 1
        delay = float(min(ACTIVATION_BACKOFF_MAX_S, ACTIVATION_BACKOFF_S * 2 ** (self.failed_activations - 1)))
        log.error(
            "controller %s: activation failed (%s: %s); resigning, standing aside %.0fs",
            self._id,
            type(exc).__name__,
            str(exc)[:500],
            delay,
        )
        self._seat.resign(f"activation failed ({type(exc).__name__})")
        self._aside_until = time.monotonic() + delay
        self.retry_later(delay=delay + 0.01)
        return delay

    def activated(self) -> None:
        """An activation loaded its context: the next failure backs off from the start again."""
        self.failed_activations = 0

    def retry_later(self, event: Any = None, delay: float = 0.5) -> None:
        """Re-elect (or re-check, ``event``) once ZooKeeper is back: Reconnected does it; also retry on a timer."""
        if self.retry_timer is not None:
            self.retry_timer.cancel()
        event = event if event is not None else ev.Reelect()
        t = threading.Timer(delay, lambda: self._seat.put(event))
        t.name = f"controller-{self._id}-retry"
        t.daemon = True
        self.retry_timer = t
        t.start()

    def cancel_retry(self) -> None:
        if self.retry_timer is not None:
            self.retry_timer.cancel()

    def _candidate_watch(self, _event: Any) -> None:
        self._seat.put(ev.ControllerChange(-1))

    def watch_seat(self) -> None:
        """The active controller watches ``/controller``: losing it (or its content changing) is an event."""
        self._zk.exists(self._layout.controller, watch=self._seat.watch(ev.ControllerChange))

    def on_controller_change(self, token: int) -> None:
        if not self._seat.active:
            self.elect()
            return
        if not self.still_controller():
            self._seat.resign("lost /controller")
            self.elect()

    def still_controller(self) -> bool:
        try:
            data, stat = self._zk.get(self._layout.controller, watch=self._seat.watch(ev.ControllerChange))
            info = codecs.decode(ControllerInfo, data, self._layout.controller)
        except NoNodeError:
            return False
        except PayloadError as exc:
            log.error("%s", exc)
            return False
        return (
            info.controller_id == self._id
            and info.epoch == self._seat.epoch
            and stat.ephemeralOwner == self._zk.client_id[0]
        )

    def give_up_seat(self) -> None:
        """Delete ``/controller`` if this session holds it (best effort: ZooKeeper may be gone)."""
        zk = self._zk
        try:
            if zk.connected:
                stat = zk.exists(self._layout.controller)
                if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
                    zk.delete(self._layout.controller, version=stat.version)
        except (KazooException, *TRANSIENT):
            pass

    # ---- connection states ------------------------------------------------------------------------
    def on_suspended(self) -> None:
        self._seat.connected = False

    def on_reconnected(self) -> None:
        seat = self._seat
        if not seat.active:
            seat.connected = True
            seat.held.clear()
            self.elect()
            return
        reloading = False
        try:
            still = self.still_controller()
            if still and seat.needs_reload:
                reloading = True
                seat.reload()
        except TRANSIENT:
            # ZooKeeper went away again before we could check: keep holding events and check again on
            # the next CONNECTED, or on this retry if the connection is back without one
            seat.needs_reload = seat.needs_reload or reloading
            self.retry_later(ev.Reconnected())
            return
        except Exception:
            if not reloading:
                raise
            # a reload that failed for another reason must not leave the held events held for good:
            # resume, and the event thread reloads again before the next event
            log.exception("controller %s: reload after reconnecting failed; retrying before the next event", self._id)
            seat.needs_reload = True
        seat.connected = True
        if not still:
            seat.resign("reconnected without /controller at our epoch")
            self.elect()
            return
        held, seat.held = seat.held, []
        seat.put_front(ev.coalesce(held))

    def on_expire(self) -> None:
        self._seat.connected = False
        self._seat.resign("ZooKeeper session expired")
