"""``zkctl task ...``: create, list, describe, delete, pause, resume, restart and reassign tasks, and the spec
schema."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from cli.common import Ctx, UserError, clip, complete_names, pass_ctx, printable, table, to_dict, when
from cli.progress import waiting
from controller.protocol.tasks.pipeline_metrics import figures, load_text, rate_text

if TYPE_CHECKING:  # the admin library and the spec models are imported by the commands that use them
    from controller.admin import RestartProgress, TaskRow

WAIT_HELP = "wait until it is done (bounded by --timeout); exit 1 if it is not"


@click.group("task")
def task() -> None:
    """Create, inspect and control tasks (pipelines)."""


SCREENFUL_IDS = 20


def id_summary(ids: Sequence[str], limit: int = SCREENFUL_IDS) -> str:
    """The ids, or past a screenful the first and last few and how many between (``--json`` has them all)."""
    if len(ids) <= limit:
        return ", ".join(ids)
    head, tail = ids[: limit - 5], ids[-3:]
    return f"{', '.join(head)}, ... ({len(ids) - len(head) - len(tail)} more; --json lists every id) ..., {', '.join(tail)}"


#: what ``--state`` filters on: a spec's state, a status an owner reports, or what ``task list`` shows
TASK_STATES = (
    "RUNNING",
    "PAUSED",
    "STOPPED",
    "STARTING",
    "RESTARTING",
    "FAILED",
    "COMPLETED",
    "STALE",
    "UNASSIGNED",
    "INVALID",
)
#: the most a spec document read from stdin may hold
MAX_STDIN_BYTES = 16 * 1024 * 1024


def read_specs(spec_file: str) -> list[Any]:
    """The specs in a file, or with ``-`` on stdin (YAML, so JSON too); SpecError names the line and column."""
    from controller.protocol.tasks.spec import SpecError, load_specs, parse_specs_text

    if spec_file != "-":
        return load_specs(spec_file)
    data = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise SpecError(f"<stdin>: over {MAX_STDIN_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"<stdin>: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_specs_text(text, "<stdin>")


@task.command("create")
@click.option(
    "-f",
    "--file",
    "spec_file",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="YAML or JSON file with one task spec or a list of them; - reads stdin",
)
@click.option("--dry-run", is_flag=True, help="validate everything, write nothing")
@click.option(
    "--wait", is_flag=True, help="wait until the RUNNING tasks created run (bounded by --timeout); exit 1 if not"
)
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_create(ctx: Ctx, spec_file: str, dry_run: bool, wait: bool, timeout: float) -> None:
    """Validate every spec in the file, then create them all at once (one ZooKeeper multi).

    Nothing is written if any spec is malformed or any id exists already.
    """
    specs = read_specs(spec_file)  # SpecError (exit 1) before we even connect
    result = ctx.admin().create_tasks(specs, dry_run=dry_run)
    lines = []
    if dry_run:
        lines.append(
            f"Dry run: {len(result.tasks)} task spec{'s' if len(result.tasks) != 1 else ''} valid, nothing written"
        )
        lines.append(
            table(
                ["ID", "GROUP", "STATE", "KIND", "WEIGHT"],
                [[s["id"], s["group"], s["state"], s["pipeline"]["kind"], s["weight"]] for s in result.specs],
            )
        )
    else:
        lines.append(
            f"Created {len(result.tasks)} task{'s' if len(result.tasks) != 1 else ''}: {id_summary(result.tasks)}"
        )
    lines += [f"note: {n}" for n in result.notes if not n.startswith("dry run")]
    ctx.emit(to_dict(result), "\n".join(lines))
    if wait and not dry_run:
        from cli.task_changes import wait_for

        wait_for(ctx, [s.id for s in specs if s.state == "RUNNING"], "running", timeout)


@task.command("list")
@click.option("--group", default=None, shell_complete=complete_names("group"), help="only this group's tasks")
@click.option(
    "--state",
    type=click.Choice(TASK_STATES, case_sensitive=False),
    default=None,
    help="only tasks whose spec state or shown status is this",
)
@click.option("--broker", default=None, shell_complete=complete_names("broker"), help="only tasks this broker owns")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="one page of at most N tasks, read at the source (bucket order); prints the next cursor",
)
@click.option("--cursor", default=None, help="the page after this cursor (printed by the previous page)")
@pass_ctx
def task_list(
    ctx: Ctx, group: str | None, state: str | None, broker: str | None, limit: int | None, cursor: str | None
) -> None:
    """Tasks: spec state, owner, and what the owner reports. All of them sorted by id, or with --limit one
    page that reads only the tasks it shows (and, filtered, those it skips)."""
    next_cursor = None
    if limit is not None or cursor is not None:
        page = ctx.admin().list_page(
            group=group, state=state.upper() if state else None, broker=broker, limit=limit or 50, cursor=cursor
        )
        rows, next_cursor = list(page.rows), page.next_cursor
        if ctx.json_out:
            ctx.emit(to_dict(page))
            return
    else:
        wanted = state.upper() if state else None
        rows = [
            r
            for r in ctx.admin().list_tasks(group=group)
            if (wanted is None or wanted in (r.state, r.status, r.shown)) and (broker is None or r.owner == broker)
        ]
        if ctx.json_out:
            ctx.emit(to_dict(rows))
            return
    if not rows:
        click.echo("No tasks.")
    else:
        now = time.time()
        wide = ["WEIGHT", "STATUS-BY", "OWNER-SINCE"] if ctx.wide else []
        click.echo(
            table(
                [
                    "ID",
                    "GROUP",
                    "STATE",
                    "KIND",
                    "OWNER",
                    "GEN",
                    "STATUS",
                    "RESTARTS",
                    "RATE",
                    "BACKLOG",
                    *wide,
                    "ERROR",
                ],
                [
                    [
                        r.task_id,
                        r.group,
                        (r.state or "INVALID") + (" (deleting)" if r.deleting else ""),
                        r.kind,
                        r.owner,
                        r.owner_generation,
                        shown_status(r.shown, r.status, r.status_broker, r.status_updated, r.unassigned_since, now),
                        r.restarts,
                        *_what_it_does(r),
                        *([r.weight, r.status_broker, when(r.owner_since)] if ctx.wide else []),
                        clip(r.error or r.invalid, 200 if ctx.wide else 50),
                    ]
                    for r in rows
                ],
            )
        )
    if next_cursor is not None:
        click.echo(f"next page: --cursor {next_cursor}")


def _what_it_does(r: TaskRow) -> list[str]:
    """RATE and BACKLOG: the input rate with a sparkline of the last batches' rates, the files not yet read
    (where the source can say it); empty for a task nobody runs (its last figures are not what it does)."""
    if not r.owner or r.shown == "STALE":
        return ["", ""]
    f = figures(r.metrics)
    return [rate_text(f), "" if f.backlog_files is None else f"{f.backlog_files} files"]


def _ago(t: float | None, now: float) -> str:
    return "?" if t is None else f"{max(0.0, now - t):.0f}s"


def shown_status(
    shown: str | None,
    reported: str | None,
    broker: str | None,
    updated: float | None,
    unassigned_since: float | None,
    now: float,
) -> str | None:
    """STALE and UNASSIGNED say what they stand for: the last report and its age, how long nobody held it."""
    if shown == "UNASSIGNED":
        return f"UNASSIGNED {_ago(unassigned_since, now)}"
    if shown == "STALE":
        return f"STALE (last {reported} by {broker}, {_ago(updated, now)} ago)"
    return shown


TRACE_LINES = 40  # lines of the last failure's stack trace shown without --trace


@task.command("describe")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--trace", "full_trace", is_flag=True, help="the last failure's whole stack trace (else its last lines)")
@pass_ctx
def task_describe(ctx: Ctx, task_id: str, full_trace: bool) -> None:
    """One task: its spec, owner, status, last error and why it last failed."""
    d = ctx.admin().describe_task(task_id)
    if ctx.json_out:
        ctx.emit(to_dict(d))
        return
    spec = d.spec or {}
    owner = d.owner
    status = d.status
    rows = [
        ("Task", d.task_id),
        ("Group", spec.get("group", "-")),
        (
            "State",
            f"{spec.get('state', 'INVALID')}  (spec version {d.spec_version if d.spec_version is not None else '-'}, restart nonce {spec.get('restart_nonce', '-')})"
            + ("  DELETING" if d.deleting else ""),
        ),
        ("Pipeline", (spec.get("pipeline") or {}).get("kind", "-")),
        ("Weight", spec.get("weight", "-")),
        ("Created", when(d.created)),
        (
            "Owner",
            f"{owner.get('broker')} (generation {owner.get('generation')}, since {when(owner.get('since'))})"
            if owner
            else "none",
        ),
        (
            "Status",
            (f"{d.shown}: " if d.shown in ("STALE", "UNASSIGNED") else "")
            + (
                f"last reported {status['state']} by {status['broker']}"
                + (f" on spec version {status['revision']}" if status.get("revision") is not None else "")
                + f" (session {status.get('session') or '?'}, "
                f"failures {status['failures']}, updated {when(status['updated'])})"
                if status
                else "nothing reported"
            )
            + ("; that session no longer holds the task" if d.status_stale else "")
            + (f"; nobody holds it, for {_ago(d.unassigned_since, time.time())}" if d.unassigned_since else ""),
        ),
        ("Restarts", restart_line(d.restart)),
        ("Last error", clip(d.last_error, 200)),
    ]
    failure = d.last_failure
    if failure:
        restarts = failure.get("restarts", 0)
        rows.append(
            (
                "Last failure",
                f"{when(failure.get('at'))} {clip(failure.get('kind'), 120)}: {clip(failure.get('error'), 300)} "
                f"({restarts} restart{'' if restarts == 1 else 's'} before it)",
            )
        )
    if d.checkpoint is not None:
        rows.append(("Checkpoint", clip(checkpoint_line(to_dict(d.checkpoint)), 300)))
    if d.history:
        rows.append(("History", clip("; ".join(f"{when(e.at)} {e.action} ({e.detail})" for e in d.history[-5:]), 600)))
    if d.reassign_to:
        rows.append(("Reassign", f"pending, to {d.reassign_to}"))
    if d.invalid:
        rows.append(("Invalid", d.invalid))
    if status and status.get("metrics"):
        f = figures(status["metrics"])
        if f.load_share is not None:
            rss = "" if f.driver_rss_mb is None else f", its driver {f.driver_rss_mb:.0f} MB resident"
            batch = "" if f.batch_ms is None else f", last batch {f.batch_ms} ms"
            rows.append(("Load", f"{load_text(f)} of its trigger interval{batch}{rss}"))
        rows.append(("Metrics", json.dumps(status["metrics"], sort_keys=True)))
    width = max(len(k) for k, _ in rows) + 2
    for k, v in rows:
        click.echo(f"{(k + ':').ljust(width)}{v}")
    if failure and failure.get("trace"):
        lines = printable(str(failure["trace"])).splitlines()
        shown = lines if full_trace else lines[-TRACE_LINES:]
        click.echo("Trace:" + ("" if len(shown) == len(lines) else f" (its last {len(shown)} lines; --trace for all)"))
        for line in shown:
            click.echo("  " + line)
    if d.spec:
        click.echo("Spec:")
        for line in json.dumps(d.spec, indent=2, sort_keys=True).splitlines():
            click.echo("  " + line)


def checkpoint_line(c: dict[str, Any]) -> str:
    """Where the checkpoint is and its size (measured by the broker that holds it), or why it is not known."""
    if "error" in c:
        return str(c["error"])
    on = f"on broker {c['broker']}" if c.get("broker") else "on no live broker"
    if not c.get("exists"):
        return f"{c.get('path')} (none there, {on})"
    if c.get("complete", True):
        return f"{c.get('path')} {on}: {_size(int(c.get('bytes', 0)))} in {c.get('files')} files"
    return (
        f"{c.get('path')} {on}: at least {_size(int(c.get('bytes', 0)))} in {c.get('files')} files "
        "(partial: the count stopped at its bound)"
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def restart_line(r: RestartProgress | None) -> str:
    """The restart policy and how much of it the failures so far have used."""
    if r is None:
        return "-"
    policy = (
        f"up to {r.max_attempts} automatic restart{'s' if r.max_attempts != 1 else ''}, backoff "
        f"{r.backoff_initial_s:g}s doubling to {r.backoff_max_s:g}s"
    )
    if r.gave_up:
        used = f"gave up after {r.failures} failure{'s' if r.failures != 1 else ''}: FAILED until `zkctl task restart`"
    elif r.next_delay_s is not None:
        used = f"{r.attempts} used after {r.failures} failure{'s' if r.failures != 1 else ''} (this one after {r.next_delay_s:g}s)"
    else:
        used = f"{r.attempts} used" + (
            f" after {r.failures} failure{'s' if r.failures != 1 else ''}" if r.failures else ""
        )
    return f"{policy}; {used}"


@task.command("delete")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--wait", is_flag=True, help=WAIT_HELP)
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@click.option(
    "--purge-checkpoint",
    is_flag=True,
    help="with --wait: also remove its streaming checkpoint once it is deleted (kept otherwise), on the "
    "broker that holds it",
)
@pass_ctx
def task_delete(ctx: Ctx, task_id: str, wait: bool, timeout: float, purge_checkpoint: bool) -> None:
    """Delete a task: the controller revokes it, waits for its owner to stop it, then deletes it.

    Its checkpoint is kept (a task created again under the same id resumes from it) unless --purge-checkpoint."""
    if purge_checkpoint and not wait:
        raise click.UsageError("--purge-checkpoint needs --wait (the checkpoint is removed once the task is deleted)")
    with waiting(f"waiting for {task_id} to be revoked and deleted", timeout, "deleted", wait, ctx.json_out) as p:
        req = ctx.admin().delete_task(
            task_id, wait=timeout if wait else 0.0, progress=p, purge_checkpoint=purge_checkpoint
        )
    if wait and not req.done:
        raise UserError(
            f"task {task_id} was not deleted within {timeout:g}s"
            + (f" ({req.notes[0]})" if req.notes else "; the request stays pending")
        )
    if req.done:
        human = f"Task {task_id} deleted"
    else:
        human = (
            f"Deletion of {task_id} {'already ' if req.already_pending else ''}requested: "
            "the controller revokes it, waits for its owner to stop, then deletes it"
        )
    ctx.emit(to_dict(req), "\n".join([human] + [f"note: {n}" for n in req.notes]))


def _change(ctx: Ctx, task_id: str, action: str) -> None:
    admin = ctx.admin()
    change = getattr(admin, action)(task_id)
    past = {"pause": "paused", "resume": "resumed", "restart": "restarted"}[action]
    if change.changed:
        human = f"Task {task_id} {past}" + (f" (restart nonce {change.restart_nonce})" if action == "restart" else "")
    else:
        human = f"Task {task_id} is already {change.state}; nothing to do"
    ctx.emit(to_dict(change), human)


@task.command("pause")
@click.argument("task_id", shell_complete=complete_names("task"))
@pass_ctx
def task_pause(ctx: Ctx, task_id: str) -> None:
    """Pause a task: its owner stops it and nobody runs it until it is resumed."""
    _change(ctx, task_id, "pause")


@task.command("resume")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--wait", is_flag=True, help="wait until it runs (bounded by --timeout); exit 1 if not")
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_resume(ctx: Ctx, task_id: str, wait: bool, timeout: float) -> None:
    """Resume a paused or stopped task (refused while a reset of its offsets runs)."""
    _change(ctx, task_id, "resume")
    if wait:
        from cli.task_changes import wait_for

        wait_for(ctx, [task_id], "running", timeout)


@task.command("restart")
@click.argument("task_id", required=False, shell_complete=complete_names("task"))
@click.option("--failed", is_flag=True, help="restart every FAILED task, in one batched write")
@click.option("--group", default=None, shell_complete=complete_names("group"), help="with --failed: only this group's")
@pass_ctx
def task_restart(ctx: Ctx, task_id: str | None, failed: bool, group: str | None) -> None:
    """Restart TASK_ID where it runs, or with --failed every FAILED task (also clears their failure counts)."""
    if failed == (task_id is not None):
        raise click.UsageError("give a TASK_ID, or --failed to restart every FAILED task (not both)")
    if group is not None and not failed:
        raise click.UsageError("--group goes with --failed")
    if task_id is not None:
        _change(ctx, task_id, "restart")
        return
    result = ctx.admin().restart_tasks(group=group, only_failed=True)
    where = f" in group {group}" if group else ""
    names = [c.task_id for c in result.restarted]
    if names:
        lines = [
            f"Restarted {len(names)} FAILED task{'s' if len(names) != 1 else ''}{where}: {', '.join(names)}"
            + (f" ({result.multis} multis)" if result.multis > 1 else "")
        ]
    elif result.skipped:
        lines = [f"No FAILED task{where} could be restarted"]
    else:
        lines = [f"No FAILED tasks{where}; nothing to restart"]
    lines += [f"skipped {s.task_id}: {s.reason}" for s in result.skipped]
    ctx.emit(to_dict(result), "\n".join(lines))


@task.command("schema")
@pass_ctx
def task_schema_cmd(ctx: Ctx) -> None:
    """Print the JSON Schema of spec files (one spec or a list), for editors and CI checks."""
    from controller.protocol.tasks.spec import task_schema

    schema = task_schema()
    ctx.emit(schema, json.dumps(schema, indent=2, sort_keys=False))


@task.command("reassign")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option(
    "--to",
    "to",
    required=True,
    shell_complete=complete_names("broker"),
    help="the live broker (of the task's group) to move it to",
)
@click.option("--wait", is_flag=True, help=WAIT_HELP)
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_reassign(ctx: Ctx, task_id: str, to: str, wait: bool, timeout: float) -> None:
    """Move a task to one broker (revoked first, so it never runs twice)."""
    with waiting(f"waiting for {task_id} to run on {to}", timeout, "moved", wait, ctx.json_out) as p:
        req = ctx.admin().reassign(task_id, to, wait=timeout if wait else 0.0, progress=p)
    if wait and not req.done:
        raise UserError(f"task {task_id} did not move to {to} within {timeout:g}s")
    human = f"Task {task_id} now runs on {to}" if req.done else f"Reassignment of {task_id} to {to} requested"
    ctx.emit(to_dict(req), "\n".join([human] + [f"note: {n}" for n in req.notes]))


@task.command("stop")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option(
    "--wait", is_flag=True, help="wait until ZooKeeper shows it runs nowhere (bounded by --timeout); exit 1 if not"
)
@click.option("--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, help="seconds, with --wait")
@pass_ctx
def task_stop(ctx: Ctx, task_id: str, wait: bool, timeout: float) -> None:
    """Stop a task: STOPPED, and confirmed not running anywhere (no owner left, its group no longer places it).

    A STOPPED task's offsets may be reset; task resume starts it again."""
    with waiting(f"waiting for {task_id} to stop everywhere", timeout, "stopped", wait, ctx.json_out) as p:
        res = ctx.admin().stop(task_id, wait=timeout if wait else 0.0, progress=p)
    if wait and not res.confirmed:
        raise UserError(
            f"task {task_id} is STOPPED but not confirmed within {timeout:g}s: waiting for {res.waiting_for}"
        )
    head = f"Task {task_id} stopped" if res.changed else f"Task {task_id} is already STOPPED"
    tail = "; it runs nowhere" if res.confirmed else f"; not confirmed yet: waiting for {res.waiting_for} (--wait)"
    ctx.emit(to_dict(res), head + tail)


# the commands of task_changes (apply, history, rollback, wait) and task_storage (offsets, reset-offsets, logs)
# attach themselves to ``task``
from cli import task_changes, task_storage  # noqa: E402, F401
