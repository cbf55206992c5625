"""``zkctl maintenance on|off|status`` and ``zkctl settings show|set|reset``: operating a live cluster."""

from __future__ import annotations

import json
from typing import Any

import click

from cli.common import Ctx, UserError, pass_ctx, table, when
from controller.protocol.cluster.settings_rules import SETTING_RULES
from controller.protocol.records.codecs import to_jsonable


@click.group("maintenance")
def maintenance() -> None:
    """Maintenance mode: freeze placement cluster-wide while people work (nothing moves, nothing gains an
    owner; a lost broker's tasks wait for it)."""


def _describe(m: Any) -> str:
    if not m.on:
        return "Maintenance mode is off" + (f" ({m.reason}, {when(m.since)})" if m.since else "")
    offline = f"; brokers lost: {', '.join(m.offline)}" if m.offline else ""
    return f"Maintenance mode is ON since {when(m.since)}, by {m.by}: {m.reason}{offline}"


@maintenance.command("on")
@click.option("--reason", default="", help="why (shown by status, watch and the console)")
@pass_ctx
def maintenance_on(ctx: Ctx, reason: str) -> None:
    """Turn maintenance mode on."""
    m = ctx.admin().set_maintenance(True, reason)
    ctx.emit(to_jsonable(m), _describe(m))


@maintenance.command("off")
@click.option("--reason", default="", help="why (kept in the znode)")
@pass_ctx
def maintenance_off(ctx: Ctx, reason: str) -> None:
    """Turn maintenance mode off: what waited moves now, in waves if a throttle is set."""
    m = ctx.admin().set_maintenance(False, reason)
    ctx.emit(to_jsonable(m), _describe(m))


@maintenance.command("status")
@pass_ctx
def maintenance_status(ctx: Ctx) -> None:
    """Whether maintenance mode is on, since when, by whom and why."""
    m = ctx.admin().maintenance()
    ctx.emit(to_jsonable(m), _describe(m))


@maintenance.command("auto")
@click.option(
    "--max-offline-brokers",
    type=click.IntRange(0),
    default=None,
    help="turn maintenance on by itself when more brokers than this are lost at once",
)
@click.option(
    "--max-offline-fraction",
    type=click.FloatRange(0, 1, min_open=True),
    default=None,
    help="... or more than this fraction of the brokers seen",
)
@click.option(
    "--window",
    "offline_window_s",
    type=click.FloatRange(0, min_open=True),
    default=None,
    show_default="60",
    help="'at once': within this many seconds",
)
@click.option("--off", "disable", is_flag=True, help="never turn maintenance on by itself")
@pass_ctx
def maintenance_auto(
    ctx: Ctx,
    max_offline_brokers: int | None,
    max_offline_fraction: float | None,
    offline_window_s: float | None,
    disable: bool,
) -> None:
    """Automatic maintenance: when too many brokers are lost at once (a rack, a network), freeze placement
    instead of piling every task onto the survivors; it ends by itself once enough are back."""
    if disable:
        changes: dict[str, Any] = {"max_offline_brokers": None, "max_offline_fraction": None}
    else:
        changes = {
            k: v
            for k, v in (
                ("max_offline_brokers", max_offline_brokers),
                ("max_offline_fraction", max_offline_fraction),
                ("offline_window_s", offline_window_s),
            )
            if v is not None
        }
        if not changes:
            raise UserError("give --max-offline-brokers N, --max-offline-fraction F (and --window S), or --off")
    admin = ctx.admin()
    from controller.admin.operations import SettingError

    try:
        s = admin.update_settings(changes)
    except SettingError as exc:
        raise UserError(str(exc)) from None
    ctx.emit(to_jsonable(s), _show(s))


# ---- settings -------------------------------------------------------------------------------------
@click.group("settings")
def settings() -> None:
    """Settings the controller honours live: move throttles, automatic maintenance, preferred placement."""


def _show(s: Any) -> str:
    t = s.throttle
    rows = [
        ["max_moves", "cluster", t.max_moves if t.max_moves is not None else "none"],
        ["max_moves_per_broker", "cluster", t.max_moves_per_broker if t.max_moves_per_broker is not None else "none"],
    ]
    for g, lim in sorted(s.group_throttle.items()):
        rows += [
            ["max_moves", f"group {g}", lim.max_moves if lim.max_moves is not None else "none"],
            [
                "max_moves_per_broker",
                f"group {g}",
                lim.max_moves_per_broker if lim.max_moves_per_broker is not None else "none",
            ],
        ]
    for k in ("max_offline_brokers", "max_offline_fraction", "offline_window_s", "preferred_check_s", "max_imbalance"):
        v = getattr(s, k)
        rows.append([k, "cluster", "none" if v is None else v])
    return table(["SETTING", "SCOPE", "VALUE"], rows)


def _value(raw: str) -> Any:
    if raw.lower() in ("none", "off", "null", ""):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # refused by the check, which says what the setting accepts


@settings.command("show")
@pass_ctx
def settings_show(ctx: Ctx) -> None:
    """The settings as stored; a field stored out of bounds is shown at its default, with a line saying why."""
    stored = ctx.admin().stored_settings()
    s = stored.settings
    refusals = "".join(f"\nrefused (shown at its default): {why}" for why in stored.refused)
    ctx.emit({**to_jsonable(s), "refused": list(stored.refused)}, _show(s) + refusals)


_SET_HELP = "Change settings, e.g. max_moves=10 max_moves_per_broker=2; none removes a limit.\n\n\b\n" + "\n".join(
    f"{k}: {v}" for k, v in SETTING_RULES.items()
)


@settings.command("set", help=_SET_HELP)
@click.argument("pairs", nargs=-1, required=True, metavar="NAME=VALUE...")
@click.option("--group", "group_name", default=None, help="a group's own throttle (max_moves, max_moves_per_broker)")
@pass_ctx
def settings_set(ctx: Ctx, pairs: tuple[str, ...], group_name: str | None) -> None:
    changes: dict[str, Any] = {}
    for p in pairs:
        name, sep, raw = p.partition("=")
        if not sep:
            raise UserError(f"{p!r}: expected NAME=VALUE (settings: {', '.join(SETTING_RULES)})")
        changes[name.strip().replace("-", "_")] = _value(raw.strip())
    admin = ctx.admin()
    from controller.admin.operations import SettingError

    try:
        s = admin.update_settings(changes, group=group_name)
    except SettingError as exc:
        raise UserError(str(exc)) from None
    ctx.emit(to_jsonable(s), _show(s))


@settings.command("reset")
@pass_ctx
def settings_reset(ctx: Ctx) -> None:
    """Back to the defaults: no throttle, no automatic maintenance."""
    s = ctx.admin().reset_settings()
    ctx.emit(to_jsonable(s), _show(s))
