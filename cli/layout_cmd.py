"""``zkctl layout ...``: what layout a root has (version, buckets, how full the largest is), and the
migration of a flat root of an earlier release to buckets (offline: controllers and brokers stopped)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from cli.common import Ctx, UserError, pass_ctx
from controller.admin.migration import migrate
from controller.protocol.cluster.layout import BUCKETS, LAYOUT_VERSION
from controller.zk.layout_io import LayoutError, flat_entries, read_layout_info
from controller.zk.multi_read import multi_children


@click.group("layout")
def layout() -> None:
    """The root's ZooKeeper layout: task specs and statuses in 256 buckets each, so that no listing grows
    past what a ZooKeeper client accepts (1 MiB) at 100,000 tasks and more."""


@layout.command("show")
@pass_ctx
def layout_show(ctx: Ctx) -> None:
    """Show the root's layout: its version, and the entries of the fullest buckets (exit 1 if it is flat,
    i.e. from an earlier release, and must be migrated)."""
    client, lay = ctx.client(), ctx.layout
    started = time.monotonic()
    try:
        info = read_layout_info(client, lay)
    except LayoutError as exc:
        raise UserError(str(exc)) from None
    if info is None:
        tasks, statuses = flat_entries(client, lay)
        # a migration stopped half-way has moved some entries into buckets already: count both
        moved_tasks = sum(len(x or ()) for x in multi_children(client, lay.task_buckets))
        moved_statuses = sum(len(x or ()) for x in multi_children(client, lay.status_buckets))
        flat = bool(tasks or statuses)
        state = ("half-migrated" if moved_tasks or moved_statuses else "flat") if flat else "fresh"
        out: dict[str, Any] = {
            "root": lay.root,
            "layout": 1 if flat else None,
            "state": state,
            "flat_tasks": len(tasks),
            "flat_statuses": len(statuses),
            "bucketed_tasks": moved_tasks,
            "bucketed_statuses": moved_statuses,
            "tasks": len(tasks) + moved_tasks,
            "statuses": len(statuses) + moved_statuses,
        }
        if state == "half-migrated":
            human = (
                f"{lay.root}: half-migrated: {out['tasks']} tasks and {out['statuses']} statuses, of which "
                f"{len(tasks)} tasks and {len(statuses)} statuses are still flat; run `zkctl layout migrate` "
                "again to finish"
            )
        elif flat:
            human = (
                f"{lay.root}: flat layout of an earlier release, {len(tasks)} tasks and {len(statuses)} statuses; "
                f"stop its controllers and brokers, then run `zkctl layout migrate`"
            )
        else:
            human = f"{lay.root}: not laid out yet (zkctl init, or its first controller or broker, lays it out)"
        ctx.emit(out, human)
        if flat:
            raise SystemExit(1)
        return
    task_lists = multi_children(client, lay.task_buckets)
    status_lists = multi_children(client, lay.status_buckets)
    sizes = [len(x or ()) for x in task_lists]
    name_bytes = [sum(len(n) + 4 for n in x or ()) for x in task_lists + status_lists]
    out = {
        "root": lay.root,
        "layout": info.layout,
        "state": "bucketed",
        "buckets": info.buckets,
        "tasks": sum(sizes),
        "statuses": sum(len(x or ()) for x in status_lists),
        "largest_bucket": max(sizes, default=0),
        "largest_listing_bytes": max(name_bytes, default=0),
        "missing_buckets": sum(1 for x in task_lists + status_lists if x is None),
        "read_s": round(time.monotonic() - started, 3),
    }
    ctx.emit(
        out,
        f"{lay.root}: layout {info.layout}, {info.buckets} buckets; {out['tasks']} tasks, {out['statuses']} "
        f"statuses; the fullest bucket holds {out['largest_bucket']} tasks, the largest listing is "
        f"{out['largest_listing_bytes']} bytes"
        + (f"; {out['missing_buckets']} buckets missing" if out["missing_buckets"] else ""),
    )


@layout.command("migrate")
@click.option("--dry-run", is_flag=True, help="read and report what would move; write nothing")
@pass_ctx
def layout_migrate(ctx: Ctx, dry_run: bool) -> None:
    """Move a flat root's task specs and statuses into buckets (layout 1 -> 2). Stop every controller and
    broker of the root first (it refuses otherwise): a running task's owner znode belongs to its broker's
    session. Each znode moves in a multi with its data and ACL; an interrupted migration is finished by
    running it again. Exit 1 if anything could not move (each listed, with why)."""
    try:
        r = migrate(ctx.client(), ctx.layout, dry_run=dry_run, session_timeout_s=ctx.settings.session_timeout_s)
    except LayoutError as exc:
        raise UserError(str(exc)) from None
    out = dataclasses.asdict(r) | {
        "blocked": [{"path": p, "why": w} for p, w in r.blocked],
        "layout": LAYOUT_VERSION if r.done else 1,
        "buckets": BUCKETS,
    }
    if r.already:
        human = f"{r.root} is laid out in buckets already (layout {LAYOUT_VERSION}): nothing to do"
    elif dry_run:
        human = (
            f"dry run: {r.tasks} tasks and {r.statuses} statuses of {r.root} would move into {BUCKETS} buckets"
            + (f"; {len(r.blocked)} cannot move" if r.blocked else "")
            + "; nothing was written"
        )
    else:
        human = f"migrated {r.root}: {r.moved} znodes moved in {r.multis} multis in {r.seconds:.1f}s; " + (
            f"layout {LAYOUT_VERSION}, ready for this release"
            if r.done
            else f"{len(r.blocked)} cannot move: the root stays flat until they are dealt with"
        )
    human += "".join(f"\n  {p}: {w}" for p, w in r.blocked[:50])
    ctx.emit(out, human)
    if r.blocked or not (r.done or dry_run):
        raise SystemExit(1)
