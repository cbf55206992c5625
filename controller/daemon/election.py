"""Election and epoch: win ``/controller``, bump ``/controller_epoch`` (whose zkVersion fences every
write), resign, and the connection states (SUSPENDED holds events, CONNECTED re-checks ownership and
replays them, LOST resigns and stands again)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)

from controller.protocol import codecs
from controller.daemon import events as ev
from controller.protocol.codecs import (
    ControllerInfo,
    PayloadError,
)
from controller.daemon.context import TRANSIENT
from controller.zk.io import FencedWriter

log = logging.getLogger(__name__)


class Election:
    """The controller's election and connection-state handlers."""

    # ---- election ---------------------------------------------------------------------------------
    def elect(self) -> None:
        """Race for ``/controller``; on winning, bump the epoch conditionally and load the context."""
        if self.active or self._stopping:
            return
        try:
            try:
                self.zk.create(self.layout.controller_epoch, codecs.encode_epoch(0), makepath=True)
            except NodeExistsError:
                pass
            data, stat = self.zk.get(self.layout.controller_epoch)
            # Every election bumps the epoch and the znode's version together, so the version is never
            # below the last epoch: if the text was overwritten (garbage, or a lower number), continue
            # above the version instead of refusing to run (no controller at all) or going backwards.
            try:
                epoch = max(codecs.decode_epoch(data, self.layout.controller_epoch), stat.version)
            except PayloadError as exc:
                log.error("%s; continuing from its version %d", exc, stat.version)
                epoch = stat.version
            info = ControllerInfo(controller_id=self.id, epoch=epoch + 1, host=self.config.host, since=time.time())
            try:
                self.zk.create(self.layout.controller, codecs.encode(info), ephemeral=True)
            except NodeExistsError:
                held = self.zk.exists(self.layout.controller, watch=self._candidate_watch)
                if held is not None and held.ephemeralOwner == self.zk.client_id[0]:
                    # ours, from an election ZooKeeper cut short (the epoch bump's answer was lost): nobody
                    # else can win while it exists, so remove it and run again
                    log.warning("controller %s: removing /controller left by its own interrupted election", self.id)
                    try:
                        self.zk.delete(self.layout.controller, version=held.version)
                    except (NoNodeError, BadVersionError):
                        pass
                    self.put(ev.Reelect())
                elif held is None:
                    self.put(ev.Reelect())
                return
            try:
                new_stat = self.zk.set(self.layout.controller_epoch, codecs.encode_epoch(epoch + 1), version=stat.version)
            except BadVersionError:
                log.warning("controller %s: epoch moved while electing; retrying", self.id)
                self.zk.delete(self.layout.controller)
                self.put(ev.Reelect())
                return
            self._activate(epoch + 1, new_stat.version)
        except TRANSIENT:
            if not self._stopping:
                self._retry_later()

    def _retry_later(self, event: Any = None) -> None:
        # re-elect (or re-check, ``event``) once ZooKeeper is back: Reconnected does it; also retry on a timer
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        event = event if event is not None else ev.Reelect()
        t = threading.Timer(0.5, lambda: self.put(event))
        t.name = f"controller-{self.id}-retry"
        t.daemon = True
        self._retry_timer = t
        t.start()

    def _candidate_watch(self, _event: Any) -> None:
        self.put(ev.ControllerChange(-1))

    def on_controller_change(self, token: int) -> None:
        if not self.active:
            self.elect()
            return
        if not self._still_controller():
            self.resign("lost /controller")
            self.elect()

    def _still_controller(self) -> bool:
        try:
            data, stat = self.zk.get(self.layout.controller, watch=self._watch(ev.ControllerChange))
            info = codecs.decode(ControllerInfo, data, self.layout.controller)
        except NoNodeError:
            return False
        except PayloadError as exc:
            log.error("%s", exc)
            return False
        return (info.controller_id == self.id and info.epoch == self.epoch
                and stat.ephemeralOwner == self.zk.client_id[0])

    def _activate(self, epoch: int, epoch_zk_version: int) -> None:
        self.token += 1
        self.active = True
        self.epoch = epoch
        self.writer = FencedWriter(self.zk, self.layout.controller_epoch, epoch_zk_version)
        self.metrics.epoch.set(epoch)
        self.metrics.active.set(1)
        self.became_active_at = time.monotonic()
        log.info("controller %s is active at epoch %d", self.id, epoch)
        self.zk.exists(self.layout.controller, watch=self._watch(ev.ControllerChange))
        self._load()

    def resign(self, reason: str) -> None:
        if not self.active:
            return
        log.info("controller %s resigns (epoch %s): %s", self.id, self.epoch, reason)
        if self.ctx is not None:
            for coord in self.ctx.groups.values():
                coord.shutdown()
        self.active = False
        self.token += 1
        self._stop_watch_armer()
        try:
            self._unwatch_task_tree()
        except Exception:  # best effort: its events carry a stale token from now on
            log.exception("controller %s: removing the watch of the tasks", self.id)
        self.ctx = None
        self.writer = None
        self.held.clear()
        self.metrics.active.set(0)
        self.metrics.brokers.set(0)
        self.metrics.tasks.set(0)
        self.metrics.invalid_tasks.set(0)
        try:
            if self.zk.connected:
                stat = self.zk.exists(self.layout.controller)
                if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.delete(self.layout.controller, version=stat.version)
        except (KazooException, *TRANSIENT):
            pass

    # ---- connection states ------------------------------------------------------------------------
    def on_suspended(self) -> None:
        self.connected = False

    def on_reconnected(self) -> None:
        if not self.active:
            self.connected = True
            self.held.clear()
            self.elect()
            return
        reloading = False
        try:
            still = self._still_controller()
            if still and self.needs_reload:
                reloading = True
                self._reload()
        except TRANSIENT:
            # ZooKeeper went away again before we could check: keep holding events and check again on
            # the next CONNECTED, or on this retry if the connection is back without one
            self.needs_reload = self.needs_reload or reloading
            self._retry_later(ev.Reconnected())
            return
        except Exception:
            if not reloading:
                raise
            # a reload that failed for another reason must not leave the held events held for good:
            # resume, and _process reloads again before the next event
            log.exception("controller %s: reload after reconnecting failed; retrying before the next event", self.id)
            self.needs_reload = True
        self.connected = True
        if not still:
            self.resign("reconnected without /controller at our epoch")
            self.elect()
            return
        held, self.held = self.held, []
        self.thread.put_front(ev.coalesce(held))

    def on_expire(self) -> None:
        self.connected = False
        self.resign("ZooKeeper session expired")

    # ---- loading ----------------------------------------------------------------------------------
    def _reload(self) -> None:
        for coord in (self.ctx.groups.values() if self.ctx else ()):
            coord.shutdown()
        self.token += 1
        self.needs_reload = False
        self._load()

    # ---- views for tests and the CLI --------------------------------------------------------------
    def wait_active(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.active and self.ctx is not None:
                return True
            time.sleep(0.02)
        return False
