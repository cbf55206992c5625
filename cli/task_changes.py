"""``zkctl task apply | history | rollback | wait``: change tasks' specs in place, see and undo the changes, and
wait for tasks to be running, stopped or deleted. Commands parse and print; ``controller.admin`` does the work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from cli.common import Ctx, UserError, clip, complete_names, pass_ctx, table, to_dict, when
from cli.progress import waiting
from cli.task_cmd import read_specs, task

if TYPE_CHECKING:
    from controller.admin.task_apply import ApplyItem

WAIT_S = 60.0
CONDITIONS = ("running", "stopped", "deleted")


def wait_for(ctx: Ctx, ids: Sequence[str], condition: str, timeout: float) -> None:
    """Wait for ``ids`` to meet ``condition``; a UserError (exit 1) naming what each still waits for if not."""
    if not ids:
        return
    with waiting(f"waiting for {len(ids)} task(s) to be {condition}", timeout, condition, True, ctx.json_out) as p:
        res = ctx.admin().wait(ids, condition, timeout, progress=p)
    if not res.reached:
        raise UserError(
            f"not {condition} within {timeout:g}s: " + "; ".join(f"{t} is waiting for {why}" for t, why in res.waiting)
        )


def _item_lines(i: ApplyItem, dry_run: bool) -> list[str]:
    verb = {"create": "would be created", "update": "would change", "unchanged": "unchanged"}
    done = {"create": "created", "update": "changed", "unchanged": "unchanged"}
    head = f"{i.task_id}: {(verb if dry_run else done)[i.action]}"
    if i.action == "update":
        head += f" (spec version {i.from_revision} -> {i.to_revision})"
    lines = [head] + [f"  {c.path}: {clip(c.old, 120)} -> {clip(c.new, 120)}" for c in i.changes]
    return lines + [f"  note: {n}" for n in i.notes if n != "unchanged"]


def _wait_after_apply(ctx: Ctx, items: Sequence[ApplyItem], timeout: float) -> None:
    """After an apply: the RUNNING tasks it created or changed running their new spec, the STOPPED ones stopped."""
    touched = [i for i in items if i.action != "unchanged"]
    wait_for(ctx, [i.task_id for i in touched if i.state == "RUNNING"], "running", timeout)
    wait_for(ctx, [i.task_id for i in touched if i.state == "STOPPED"], "stopped", timeout)


@task.command("apply")
@click.option("-f", "--file", "spec_file", required=True, help="YAML or JSON file of task specs ('-': standard input)")
@click.option("--dry-run", is_flag=True, help="print the difference per task; write nothing")
@click.option(
    "--if-version", type=click.IntRange(min=1), default=None, help="refuse unless the task is at spec version N"
)
@click.option(
    "--reset", is_flag=True, help="a STOPPED task: also reset its checkpoint (allows what Spark cannot resume)"
)
@click.option("--wait", is_flag=True, help="wait until each task changed runs its new spec (or is stopped)")
@click.option("--timeout", type=click.FloatRange(min=0), default=WAIT_S, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_apply(
    ctx: Ctx, spec_file: str, dry_run: bool, if_version: int | None, reset: bool, wait: bool, timeout: float
) -> None:
    """Create the tasks of FILE that do not exist and update those that do (a same file twice changes nothing).

    A RUNNING task's owner restarts it in place from its checkpoint with the new spec. A change Spark cannot
    resume from the checkpoint (another source or sink, a changed stateful query) is refused with the reason,
    unless the task is STOPPED and --reset is given. Every change is recorded in the task's history."""
    specs = read_specs(spec_file)
    res = ctx.admin().apply(specs, dry_run=dry_run, if_version=if_version, reset=reset)
    lines = ["Dry run: nothing written" if dry_run else ("Applied" if res.changed else "Nothing to change")]
    for i in res.items:
        lines += _item_lines(i, dry_run)
    ctx.emit(to_dict(res), "\n".join(lines))
    if wait and not dry_run:
        _wait_after_apply(ctx, res.items, timeout)


@task.command("history")
@click.argument("task_id", shell_complete=complete_names("task"))
@pass_ctx
def task_history(ctx: Ctx, task_id: str) -> None:
    """A task's recorded changes (when, who, spec versions, what changed) and stops and resets, oldest first,
    and the spec versions kept for task rollback."""
    admin = ctx.admin()
    h = admin.history(task_id)
    if not h.events and admin.client.exists(admin.layout.task(task_id)) is None:
        raise UserError(f"unknown task {task_id!r}")
    if ctx.json_out:
        ctx.emit(to_dict(h))
        return
    if not h.events:
        click.echo(f"No history for {task_id}.")
    else:
        rows = [
            [
                when(e.at),
                e.action,
                e.who or "-",
                "-" if e.to_revision is None else f"{e.from_revision} -> {e.to_revision}",
                clip(e.detail, 200),
            ]
            for e in h.events
        ]
        click.echo(table(["WHEN", "ACTION", "WHO", "VERSION", "WHAT"], rows))
    if h.specs:
        click.echo("Spec versions kept for rollback: " + ", ".join(str(r.revision) for r in h.specs))


@task.command("rollback")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--to-version", type=click.IntRange(min=1), required=True, help="a spec version the history keeps")
@click.option("--dry-run", is_flag=True, help="print the difference; write nothing")
@click.option("--reset", is_flag=True, help="a STOPPED task: also reset its checkpoint")
@click.option("--wait", is_flag=True, help="wait until it runs the spec again (or is stopped)")
@click.option("--timeout", type=click.FloatRange(min=0), default=WAIT_S, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_rollback(
    ctx: Ctx, task_id: str, to_version: int, dry_run: bool, reset: bool, wait: bool, timeout: float
) -> None:
    """Apply again the spec a task had at an earlier version (as a new version, by the rules of task apply)."""
    item = ctx.admin().rollback(task_id, to_version, dry_run=dry_run, reset=reset)
    lines = ["Dry run: nothing written"] if dry_run else []
    ctx.emit(to_dict(item), "\n".join(lines + _item_lines(item, dry_run)))
    if wait and not dry_run:
        _wait_after_apply(ctx, [item], timeout)


@task.command("wait")
@click.argument("task_ids", nargs=-1, required=True, shell_complete=complete_names("task"))
@click.option("--for", "condition", type=click.Choice(CONDITIONS), required=True, help="the condition to wait for")
@click.option("--timeout", type=click.FloatRange(min=0), default=WAIT_S, show_default=True, help="seconds")
@pass_ctx
def task_wait(ctx: Ctx, task_ids: tuple[str, ...], condition: str, timeout: float) -> None:
    """Wait until every task named is running (its owner runs its current spec), stopped (confirmed to run
    nowhere) or deleted. Exit 0 when they are; exit 1 saying what each task still waits for when not."""
    with waiting(f"waiting for {len(task_ids)} task(s) to be {condition}", timeout, condition, True, ctx.json_out) as p:
        res = ctx.admin().wait(list(task_ids), condition, timeout, progress=p)
    if ctx.json_out:
        ctx.emit(to_dict(res))
    if not res.reached:
        raise UserError(
            f"not {condition} within {timeout:g}s: " + "; ".join(f"{t} is waiting for {why}" for t, why in res.waiting)
        )
    if not ctx.json_out:
        click.echo(f"{', '.join(res.tasks)}: {condition}")
