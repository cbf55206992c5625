"""Operating a live cluster: maintenance mode and the settings the controller honours live (move
throttles, automatic maintenance, preferred placement checks). Both live in one znode each, written
with a version check so two operators (or an operator and the controller) never overwrite each other's
change unseen."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from controller.admin.common import AdminError, NotFound
from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.cluster.settings_rules import SETTING_RULES, SettingValueError, check_setting, read_settings
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import ClusterSettings, MaintenanceInfo, MoveLimits
from controller.protocol.records.payload_validation import PayloadError

T = TypeVar("T")
__all__ = ["SettingsAdmin", "SettingError", "SETTING_RULES", "StoredSettings"]


class SettingError(AdminError):
    """A setting refused before anything is written: names the setting and what it accepts."""


def _check(name: str, value: Any) -> Any:
    try:
        return check_setting(name, value)
    except SettingValueError as exc:
        raise SettingError(str(exc)) from None


@dataclass(frozen=True)
class StoredSettings:
    """The settings znode as read: every field as stored but those refused (out of bounds, written by hand or by
    an earlier release), which are their defaults here and named in ``refused`` with why, so a reader is never
    shown a default it did not ask for without saying so."""

    settings: ClusterSettings
    refused: tuple[str, ...] = ()


def _stored(data: bytes, path: str) -> StoredSettings:
    settings, refused = read_settings(data, path, ClusterSettings())
    return StoredSettings(settings, tuple(refused))


def _in_force(data: bytes, path: str) -> ClusterSettings:
    """The settings as the controller reads them: a field refused is its default here, never a reason to
    refuse the whole znode."""
    return _stored(data, path).settings


class SettingsAdmin:
    """The maintenance and settings part of ``AdminClient``: one znode each, rewritten at the version read."""

    def __init__(self, client: KazooClient, layout: ZkLayout, *, retries: int = 5) -> None:
        self.client = client
        self.layout = layout
        self.retries = retries

    def _read_setting(self, path: str, decode: Callable[[bytes], T], empty: T) -> tuple[T, int]:
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return empty, -2  # -2: create it
        if not data:
            return empty, stat.version
        return decode(data), stat.version

    def _rewrite(self, path: str, decode: Callable[[bytes], T], empty: T, change: Callable[[T], T]) -> T:
        """Read, change, write back at the version read; again if someone wrote in between (bounded)."""
        for _ in range(max(1, self.retries) * 4):
            current, version = self._read_setting(path, decode, empty)
            new = change(current)
            try:
                if version == -2:
                    self.client.create(path, codecs.encode(new), makepath=True)
                else:
                    self.client.set(path, codecs.encode(new), version=version)
                return new
            except (BadVersionError, NoNodeError):
                continue
        raise AdminError(f"{path} kept changing under this request; try again")

    # ---- maintenance ------------------------------------------------------------------------------
    def maintenance(self) -> MaintenanceInfo:
        path = self.layout.maintenance
        try:
            return self._read_setting(path, lambda d: codecs.decode(MaintenanceInfo, d, path), MaintenanceInfo())[0]
        except PayloadError as exc:
            raise AdminError(f"{exc}; `zkctl maintenance off` rewrites it") from None

    def set_maintenance(self, on: bool, reason: str = "") -> MaintenanceInfo:
        """Turn maintenance mode on (nothing moves or gains an owner) or off (what waited moves now)."""
        path = self.layout.maintenance

        def decode(d: bytes) -> MaintenanceInfo:
            try:
                return codecs.decode(MaintenanceInfo, d, path)
            except PayloadError:
                return MaintenanceInfo()  # garbage is replaced by what the operator asks for

        def change(cur: MaintenanceInfo) -> MaintenanceInfo:
            if on:
                return MaintenanceInfo(
                    on=True,
                    # a second `maintenance on` without a reason keeps the one given (by an operator or
                    # the automatic trigger): it must not be replaced by the generic text
                    reason=reason or (cur.reason if cur.on and cur.reason else "turned on by an operator"),
                    by="operator",
                    since=cur.since if cur.on else time.time(),
                    offline=cur.offline,
                )
            return MaintenanceInfo(
                on=False, reason=reason or "turned off by an operator", by="operator", since=time.time()
            )

        return self._rewrite(path, decode, MaintenanceInfo(), change)

    # ---- settings ---------------------------------------------------------------------------------
    def settings(self) -> ClusterSettings:
        return self.stored_settings().settings

    def stored_settings(self) -> StoredSettings:
        """The settings with the fields refused on reading named (see :class:`StoredSettings`)."""
        path = self.layout.settings
        return self._read_setting(path, lambda d: _stored(d, path), StoredSettings(ClusterSettings()))[0]

    def update_settings(self, changes: dict[str, Any], group: str | None = None) -> ClusterSettings:
        """Change some settings (all checked before anything is written). ``max_moves`` and
        ``max_moves_per_broker`` with ``group`` are that group's throttle; without, the cluster's. A group's
        throttle is stored only for a group that exists (under ``/groups``) or has one stored already (which
        may then be changed or cleared): the settings znode does not grow with names nobody uses."""
        checked = {k: _check(k, v) for k, v in changes.items()}
        exists = True
        if group is not None:
            check_name("group", group)
            if set(checked) - {"max_moves", "max_moves_per_broker"}:
                raise SettingError("only max_moves and max_moves_per_broker are set per group")
            exists = self.client.exists(self.layout.group(group)) is not None
        path = self.layout.settings

        def change(cur: ClusterSettings) -> ClusterSettings:
            throttle_keys = {k: v for k, v in checked.items() if k.startswith("max_moves")}
            others = {k: v for k, v in checked.items() if not k.startswith("max_moves")}
            if group is not None:
                if not exists and group not in cur.group_throttle:
                    raise NotFound(f"unknown group {group!r}: nothing was stored")
                groups = dict(cur.group_throttle)
                limits = dataclasses.replace(groups.get(group, MoveLimits()), **throttle_keys)
                if limits == MoveLimits():
                    groups.pop(group, None)
                else:
                    groups[group] = limits
                return dataclasses.replace(cur, group_throttle=groups)
            return dataclasses.replace(cur, throttle=dataclasses.replace(cur.throttle, **throttle_keys), **others)

        return self._rewrite(path, lambda d: _in_force(d, path), ClusterSettings(), change)

    def reset_settings(self) -> ClusterSettings:
        """Back to the defaults (no throttle, no automatic maintenance)."""
        return self._rewrite(
            self.layout.settings, lambda d: ClusterSettings(), ClusterSettings(), lambda _cur: ClusterSettings()
        )
