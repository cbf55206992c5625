"""What each live setting accepts, with bounds: one table for every place a setting enters (the CLI, the API,
the admin library) and for the controller's reader, which keeps the last good value of a field it refuses
instead of dropping every throttle at once. Every interval has a floor: a check every nanosecond is a
controller spinning a core, not a setting."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs, payload_validation
from controller.protocol.records.admin_records import ClusterSettings, MoveLimits

MAX_COUNT = 1_000_000  # moves, brokers, tasks of imbalance: far past any real cluster
MIN_INTERVAL_S = 1.0  # no check or window shorter than a second
MAX_INTERVAL_S = 7 * 86_400.0  # nor longer than a week


@dataclass(frozen=True)
class Rule:
    """A setting's accepted values: a whole number or seconds, within [low, high]; ``none`` (no limit) and
    ``zero_is_off`` (0: never) where the setting has them."""

    kind: str  # "count", "fraction" or "seconds"
    low: float
    high: float
    nullable: bool = False
    zero_is_off: bool = False

    def describe(self) -> str:
        if self.kind == "count":
            text = f"a whole number >= {self.low:g} (at most {self.high:,.0f})"
        elif self.kind == "fraction":
            text = "a fraction in (0, 1]"
        else:
            text = f"seconds from {self.low:g} to {self.high:g}" + (", or 0: never" if self.zero_is_off else "")
        return text + (", or none" if self.nullable else "")


RULES: dict[str, Rule] = {
    "max_moves": Rule("count", 1, MAX_COUNT, nullable=True),
    "max_moves_per_broker": Rule("count", 1, MAX_COUNT, nullable=True),
    "max_offline_brokers": Rule("count", 0, MAX_COUNT, nullable=True),
    "max_offline_fraction": Rule("fraction", 0, 1, nullable=True),
    "offline_window_s": Rule("seconds", MIN_INTERVAL_S, MAX_INTERVAL_S),
    "preferred_check_s": Rule("seconds", MIN_INTERVAL_S, MAX_INTERVAL_S, zero_is_off=True),
    "max_imbalance": Rule("count", 0, MAX_COUNT),
}
THROTTLE_KEYS = ("max_moves", "max_moves_per_broker")

#: the settings an operator may change, with what each accepts (the CLI and the API say the same)
SETTING_RULES: dict[str, str] = {name: rule.describe() for name, rule in RULES.items()}


class SettingValueError(ZkcError, ValueError):
    """A value a setting does not accept; the message names the setting and what it accepts."""


def check_setting(name: str, value: Any) -> Any:
    """``value`` as the setting stores it (an int, a float or None), or SettingValueError."""
    rule = RULES.get(name)
    if rule is None:
        raise SettingValueError(f"unknown setting {name!r} (settings: {', '.join(RULES)})")
    bad = SettingValueError(f"{name}: {_shown(value)} is not {rule.describe()}")
    if value is None:
        if rule.nullable:
            return None
        raise bad
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad
    if isinstance(value, float) and value != value:  # NaN compares false with every bound
        raise bad
    if rule.kind == "count":
        if isinstance(value, float) and not value.is_integer():
            raise bad
        if not rule.low <= value <= rule.high:
            raise bad
        return int(value)
    number = float(value)
    if rule.kind == "fraction":
        if not 0 < number <= 1:
            raise bad
        return number
    if rule.zero_is_off and number == 0:
        return 0.0
    if not rule.low <= number <= rule.high:
        raise bad
    return number


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def salvage_settings(body: Any, last: ClusterSettings) -> tuple[ClusterSettings, list[str]]:
    """Settings from a JSON object field by field: a field that is missing keeps the default, one that is
    refused keeps its value in ``last`` (the last good settings) and is named in the second result."""
    defaults = ClusterSettings()
    if not isinstance(body, dict):
        return last, ["the settings are not a JSON object"]
    refused: list[str] = []

    def field(name: str, raw: dict[str, Any], fallback: Any, where: str = "") -> Any:
        if name not in raw:
            return getattr(defaults.throttle if name in THROTTLE_KEYS else defaults, name)
        try:
            return check_setting(name, raw[name])
        except SettingValueError as exc:
            refused.append(f"{where}{exc}")
            return fallback

    def limits(raw: Any, fallback: MoveLimits, where: str) -> MoveLimits:
        if not isinstance(raw, dict):
            refused.append(f"{where}throttle: not a JSON object")
            return fallback
        return MoveLimits(**{k: field(k, raw, getattr(fallback, k), where) for k in THROTTLE_KEYS})

    throttle = limits(body.get("throttle", {}), last.throttle, "")
    groups: dict[str, MoveLimits] = {}
    raw_groups = body.get("group_throttle", {})
    if isinstance(raw_groups, dict):
        for g, raw in raw_groups.items():
            groups[str(g)] = limits(raw, last.group_throttle.get(str(g), MoveLimits()), f"group {g}: ")
    else:
        refused.append("group_throttle: not a JSON object")
        groups = dict(last.group_throttle)
    rest = {k: field(k, body, getattr(last, k)) for k in RULES if k not in THROTTLE_KEYS}
    return ClusterSettings(throttle=throttle, group_throttle=groups, **rest), refused


def checked_settings(settings: ClusterSettings, last: ClusterSettings) -> tuple[ClusterSettings, list[str]]:
    """``settings`` (already decoded) with every field within its bounds, as :func:`salvage_settings`."""
    return salvage_settings(json.loads(json.dumps(dataclasses.asdict(settings))), last)


def read_settings(data: bytes | None, path: str, last: ClusterSettings) -> tuple[ClusterSettings, list[str]]:
    """The settings znode's bytes as settings in force: empty is the defaults; a field refused (out of
    bounds, the wrong type) keeps its value in ``last`` and is named; bytes that are no JSON object at all
    keep ``last`` whole."""
    if not data:
        return ClusterSettings(), []
    try:
        return checked_settings(codecs.decode(ClusterSettings, data, path), last)
    except payload_validation.PayloadError as exc:
        strict = str(exc)
    try:
        body = json.loads(codecs.inflate(data, path).decode("utf-8"))
    except (
        payload_validation.PayloadError,
        ValueError,
        RecursionError,
    ):  # ValueError: also not UTF-8, digits past the limit
        return last, [strict]
    return salvage_settings(body, last)
