"""Operations: the operators' settings (move throttles, automatic maintenance, preferred placement checks)
and maintenance mode, read from ``/admin/settings`` and ``/admin/maintenance`` with data watches and handed
to every group's coordinator; the status watches that tell a coordinator when a moved task runs again;
and automatic maintenance when too many brokers are lost at once (a rack or network loss must not pile
every task onto the survivors)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NoAuthError, NoNodeError

from controller.daemon import events as ev
from controller.daemon.context import ControllerContext
from controller.daemon.host import Host, Watcher, context_of, writer_of
from controller.daemon.metrics import ControllerMetrics
from controller.protocol.clock import Clock
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.cluster.settings_rules import read_settings
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.throttle import combine
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ClusterSettings, MaintenanceInfo, MoveLimits
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import TaskStatus
from controller.zk.io import InterruptibleClient, WriteFailed, get_many

log = logging.getLogger(__name__)

#: a moved task's slot is free once its new owner reports one of these
DONE_STATES = frozenset({"RUNNING", "COMPLETED", "FAILED"})


def decode_settings(data: bytes | None, path: str, last: ClusterSettings | None = None) -> ClusterSettings:
    """Empty (as created with the layout) is the defaults; a field refused (out of bounds, garbage) keeps
    its last good value and is logged by name: one bad field never drops every throttle."""
    settings, refused = read_settings(data, path, last if last is not None else ClusterSettings())
    for why in refused:
        log.error("settings at %s: keeping the last good value of a refused field: %s", path, why)
    return settings


def decode_maintenance(data: bytes | None, path: str) -> MaintenanceInfo:
    """Empty is off; garbage is logged and read as off (an operator turns it on again with the CLI)."""
    if not data:
        return MaintenanceInfo()
    try:
        return codecs.decode(MaintenanceInfo, data, path)
    except PayloadError as exc:
        log.error("ignoring the maintenance mode: %s", exc)
        return MaintenanceInfo()


def offline_limit(settings: ClusterSettings, seen: int) -> int | None:
    """How many brokers may be lost at once before maintenance turns itself on (None: never)."""
    limits = []
    if settings.max_offline_brokers is not None:
        limits.append(settings.max_offline_brokers)
    if settings.max_offline_fraction is not None:
        limits.append(int(settings.max_offline_fraction * seen))
    return min(limits) if limits else None


@dataclass(frozen=True)
class SettingsRead:
    """The settings and maintenance znodes as the failover load read them: ``(data, stat)``, None if absent."""

    settings: tuple[bytes, Any] | None
    maintenance: tuple[bytes, Any] | None


class OperatorSettings:
    """Settings, maintenance mode, move completion and automatic maintenance."""

    def __init__(
        self,
        host: Host,
        zk: InterruptibleClient,
        layout: ZkLayout,
        clock: Clock,
        metrics: ControllerMetrics,
        controller_id: str,
    ) -> None:
        self._host = host
        self._zk = zk
        self._layout = layout
        self._clock = clock
        self._metrics = metrics
        self._id = controller_id

    # ---- loading ----------------------------------------------------------------------------------
    def read(self) -> SettingsRead:
        """Read both znodes with their watches (before the groups load, so each coordinator starts with them)."""
        lay = self._layout
        watch = lambda p: self._host.watch(ev.SettingsChange if p == lay.settings else ev.MaintenanceChange)
        settings, maintenance = get_many(self._zk, [lay.settings, lay.maintenance], watch=watch)
        for path, r, make in (
            (lay.settings, settings, ev.SettingsChange),
            (lay.maintenance, maintenance, ev.MaintenanceChange),
        ):
            if r is None and self._zk.exists(path, watch=self._host.watch(make)) is not None:
                self._host.put(make(self._host.token))  # created in between: read it
        return SettingsRead(settings, maintenance)

    def decode(self, ctx: ControllerContext, read: SettingsRead) -> None:
        """Garbage in either znode is logged and read as the defaults (``decode_settings``)."""
        lay = self._layout
        ctx.settings = decode_settings(read.settings[0] if read.settings else None, lay.settings, ctx.settings)
        ctx.maintenance = decode_maintenance(read.maintenance[0] if read.maintenance else None, lay.maintenance)
        if read.maintenance is not None:
            ctx.known_paths.add(lay.maintenance)

    def configure(self, g: str, coord: GroupCoordinator) -> None:
        """A new coordinator gets the settings and the maintenance mode in force."""
        ctx = context_of(self._host)
        s = ctx.settings
        next_check = self._clock.now() + s.preferred_check_s if s.preferred_check_s > 0 else None
        coord.operations.configure(
            self._group_limits(g), ctx.maintenance.on, s.max_imbalance, s.preferred_check_s, next_check
        )

    def _group_limits(self, g: str) -> MoveLimits:
        s = context_of(self._host).settings
        per_broker = MoveLimits(max_moves_per_broker=s.throttle.max_moves_per_broker)
        return combine(per_broker, s.group_throttle.get(g))

    def refresh_room(self, g: str) -> None:
        """What the cluster-wide limit leaves group ``g``, from every other group's moves in flight."""
        ctx = context_of(self._host)
        total = ctx.settings.throttle.max_moves
        coord = ctx.groups[g]
        if total is None:
            coord.operations.set_room(None)
            return
        others = sum(len(c.operations.moving) for name, c in ctx.groups.items() if name != g)
        coord.operations.set_room(max(0, total - others))

    def _offer_room(self) -> None:
        """Moves finished somewhere: groups whose next wave waits for room may go."""
        for g, coord in sorted(context_of(self._host).groups.items()):
            ops = coord.operations
            if ops.deferred and not ops.moving:
                self.refresh_room(g)
                self._host.apply(g, coord.on_settings(ops.limits, ops.preferred_check_s, ops.max_imbalance))

    # ---- event handlers ---------------------------------------------------------------------------
    def on_settings_change(self, token: int) -> None:
        if not self._host.current(token):
            return
        lay = self._layout
        try:
            data, _ = self._zk.get(lay.settings, watch=self._host.watch(ev.SettingsChange))
        except NoNodeError:
            data = None
        ctx = context_of(self._host)
        ctx.settings = s = decode_settings(data, lay.settings, ctx.settings)
        log.info(
            "controller %s: settings: throttle %s, groups %s, max offline %s/%s, preferred check %ss",
            self._id,
            s.throttle,
            s.group_throttle,
            s.max_offline_brokers,
            s.max_offline_fraction,
            s.preferred_check_s,
        )
        for g, coord in sorted(ctx.groups.items()):
            self.refresh_room(g)
            self._host.apply(g, coord.on_settings(self._group_limits(g), s.preferred_check_s, s.max_imbalance))
        self._check_offline()

    def on_maintenance_change(self, token: int) -> None:
        if not self._host.current(token):
            return
        lay = self._layout
        try:
            data, _ = self._zk.get(lay.maintenance, watch=self._host.watch(ev.MaintenanceChange))
            context_of(self._host).known_paths.add(lay.maintenance)
        except NoNodeError:
            data = None
        self._set_maintenance(decode_maintenance(data, lay.maintenance))

    def _set_maintenance(self, info: MaintenanceInfo) -> None:
        ctx = context_of(self._host)
        was = ctx.maintenance.on
        ctx.maintenance = info
        self._metrics.maintenance.set(1 if info.on else 0)
        if info.on != was:
            log.warning(
                "controller %s: maintenance mode %s (%s, by %s)",
                self._id,
                "ON" if info.on else "off",
                info.reason or "no reason given",
                info.by,
            )
        if not info.on:
            ctx.lost.clear()  # what was lost during maintenance is its own business; count afresh
        for g, coord in sorted(ctx.groups.items()):
            self.refresh_room(g)
            self._host.apply(g, coord.on_maintenance(info.on))

    def watch_moves(self, g: str, tasks: tuple[str, ...]) -> None:
        """Read the moved tasks' statuses with a watch each (at most the throttle's worth at a time)."""
        lay = self._layout

        def watch(path: str) -> Watcher:
            return self._status_watch(g, path.rsplit("/", 1)[1])

        for task, res in zip(tasks, get_many(self._zk, [lay.status(t) for t in tasks], watch=watch)):
            if res is None:  # no status yet: a get's watch is not armed on a missing znode, an exists' is
                if self._zk.exists(lay.status(task), watch=watch(lay.status(task))) is not None:
                    self._host.put(ev.MoveStatus(self._host.token, g, task))
                continue
            self._move_status(g, task, res)

    def _status_watch(self, g: str, task: str) -> Watcher:
        return self._host.watch(lambda t: ev.MoveStatus(t, g, task))

    def on_move_status(self, token: int, group: str, task: str) -> None:
        if not self._host.current(token):
            return
        coord = context_of(self._host).groups.get(group)
        if coord is None or task not in coord.operations.moving:
            return
        path = self._layout.status(task)
        watch = self._status_watch(group, task)
        try:
            res = self._zk.get(path, watch=watch)
        except NoNodeError:
            if self._zk.exists(path, watch=watch) is not None:
                self._host.put(ev.MoveStatus(self._host.token, group, task))
            res = None
        self._move_status(group, task, res)

    def _move_status(self, g: str, task: str, res: tuple[bytes, Any] | None) -> None:
        coord = context_of(self._host).groups.get(g)
        if coord is None or res is None or task not in coord.operations.moving:
            return
        try:
            status = codecs.decode(TaskStatus, res[0], self._layout.status(task))
        except PayloadError:
            return  # the new owner rewrites it; the move's timeout frees the slot otherwise
        log.debug(
            "group %s: move of %s to %s: status %s by %s",
            g,
            task,
            coord.operations.moving[task].dest,
            status.state,
            status.broker,
        )
        if status.state in DONE_STATES and status.broker == coord.operations.moving[task].dest:
            self._host.apply(g, coord.on_move_done(task, status.broker))
            if not coord.operations.moving:
                self._offer_room()

    # ---- automatic maintenance --------------------------------------------------------------------
    def note_brokers(self, joined: tuple[str, ...], left: tuple[str, ...], clean: set[str]) -> None:
        """Brokers lost without a controlled shutdown are counted for ``offline_window_s``."""
        ctx, now = context_of(self._host), self._clock.now()
        for b in joined:
            ctx.lost.pop(b, None)
        for b in left:
            if b not in clean:
                ctx.lost[b] = now
        self._check_offline()

    def _check_offline(self) -> None:
        ctx = context_of(self._host)
        s, now = ctx.settings, self._clock.now()
        m = ctx.maintenance
        if not (m.on and m.by == "auto"):
            for b in [b for b, at in ctx.lost.items() if now - at > s.offline_window_s]:
                del ctx.lost[b]
        limit = offline_limit(s, len(ctx.brokers) + len(ctx.lost))
        if m.on and m.by == "auto":
            still = sorted(b for b in m.offline if b not in ctx.brokers)
            if limit is None or len(still) <= limit:
                log.warning(
                    "controller %s: %d of the %d lost brokers are back; automatic maintenance ends",
                    self._id,
                    len(m.offline) - len(still),
                    len(m.offline),
                )
                self._write_maintenance(
                    MaintenanceInfo(
                        on=False,
                        reason=f"automatic maintenance ended: {len(still)} of {len(m.offline)} brokers still offline",
                        by="auto",
                        since=time.time(),
                    )
                )
            return
        if m.on or limit is None or len(ctx.lost) <= limit:
            return
        lost = tuple(sorted(ctx.lost))
        reason = (
            f"{len(lost)} brokers lost within {s.offline_window_s:g}s (at most {limit} may be): "
            + ", ".join(lost[:10])
            + (" ..." if len(lost) > 10 else "")
        )
        log.warning("controller %s: maintenance mode turns itself on: %s", self._id, reason)
        self._write_maintenance(MaintenanceInfo(on=True, reason=reason, by="auto", since=time.time(), offline=lost))

    def _write_maintenance(self, info: MaintenanceInfo) -> None:
        """Written fenced (a deposed controller cannot turn it on or off), then applied at once."""
        path = self._layout.maintenance
        try:
            known = context_of(self._host).known_paths
            self._host.write(lambda: writer_of(self._host).upsert([(path, codecs.encode(info))], known))
        except (WriteFailed, NoAuthError) as exc:  # e.g. a secured root laid out before this znode existed
            log.error(
                "controller %s: cannot write %s (%s); `zkctl security init` lays it out with its ACL",
                self._id,
                path,
                exc,
            )
            return
        context_of(self._host).known_paths.add(path)
        self._set_maintenance(info)
