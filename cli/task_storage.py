"""``zkctl task offsets | reset-offsets | logs``: a task's checkpoint and log, read and changed by the broker
that holds them (a storage request through ZooKeeper), so they work from any host and any directory."""

from __future__ import annotations

import json
import time

import click

from cli.common import Ctx, UserError, clip, complete_names, pass_ctx, to_dict, when
from cli.task_cmd import task

TIMEOUT_HELP = "seconds to wait for the broker's answer"


@task.command("offsets")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=30.0, show_default=True, help=TIMEOUT_HELP)
@pass_ctx
def task_offsets(ctx: Ctx, task_id: str, timeout: float) -> None:
    """A streaming task's offsets, read from its checkpoint by the broker that holds it: the last committed
    batch, per source its offset or files, when it was planned, the files waiting and the rows since the task
    started."""
    v = ctx.admin().offsets(task_id, timeout=timeout)
    if ctx.json_out:
        ctx.emit(to_dict(v))
        return
    lines = [
        f"Task {v.task_id} ({v.state}), checkpoint {v.checkpoint}" + (f" on broker {v.broker}" if v.broker else "")
    ]
    if not v.exists:
        lines.append(v.note or "no checkpoint")
    else:
        if v.last_committed is None:
            lines.append("no batch committed yet")
        else:
            kept = f"; batches kept from {v.earliest}" if v.earliest is not None else ""
            lines.append(f"last committed batch {v.last_committed} (planned {when(v.committed_at)}){kept}")
        if v.last_planned is not None and (v.last_committed is None or v.last_planned > v.last_committed):
            lines.append(f"batch {v.last_planned} was begun and not committed: it runs again at the next start")
        for s in v.sources:
            head = f"source {s.index} ({s.kind}{', ' + s.path if s.path else ''}): offset {clip(json.dumps(s.offset), 200)}"
            lines.append(head)
            if s.kind == "files":
                pending = "?" if s.files_pending is None else str(s.files_pending)
                lines.append(
                    f"  {s.files_in_batch} file(s) in that batch, {s.files_taken} taken so far, {pending} waiting"
                )
                lines += [f"  {clip(f, 300)}" for f in s.files]  # names from the checkpoint: one line each
        if v.sink:
            lines.append(f"sink {v.sink}: last batch in its log {v.sink_last_batch}")
        if v.stateful:
            lines.append("the query keeps state (state/): only --to-earliest resets it")
    rows = "?" if v.rows_since_start is None else f"{v.rows_since_start:,}"
    lines.append(f"rows since the task started: {rows}")
    ctx.emit(to_dict(v), "\n".join(lines))


@task.command("reset-offsets")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--to-earliest", is_flag=True, help="forget every batch: replay the sources from the beginning")
@click.option("--to-latest", is_flag=True, help="skip the files waiting (file sources): one empty batch takes them")
@click.option("--to-batch", type=click.IntRange(min=0), default=None, help="keep batches up to N, replay from N+1")
@click.option("--dry-run", is_flag=True, help="say what would be removed and written; change nothing")
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=30.0, show_default=True, help=TIMEOUT_HELP)
@pass_ctx
def task_reset_offsets(
    ctx: Ctx, task_id: str, to_earliest: bool, to_latest: bool, to_batch: int | None, dry_run: bool, timeout: float
) -> None:
    """Move a STOPPED task's checkpoint (and its file sink's log with it) to a new position.

    Refused unless the task is STOPPED and confirmed stopped (task stop --wait). The broker that holds the
    checkpoint carries it out. The sink's batches after the new position are removed with their files, so the
    replay writes each row once. Recorded in the task's history."""
    from controller.protocol.tasks.storage import ResetTarget, StorageError

    try:
        target = ResetTarget.parse(to_earliest, to_latest, to_batch)
    except StorageError as exc:
        raise click.UsageError(str(exc)) from None
    r = ctx.admin().reset_offsets(task_id, target, dry_run=dry_run, timeout=timeout)
    verb = "would" if dry_run else "did"
    where = "from the beginning" if r.position < 0 else f"after batch {r.position}"
    lines = [
        f"{'Dry run: ' if dry_run else ''}task {task_id} reset to {r.target} on broker {r.broker}: the next start "
        f"reads {where}"
    ]
    if r.removed_logs or r.written:
        lines.append(f"{verb} remove {len(r.removed_logs)} log file(s), write {len(r.written)}")
    if r.sink_batches_removed:
        lines.append(
            f"sink: {verb} remove batches {r.sink_batches_removed[0]}-{r.sink_batches_removed[-1]} "
            f"({r.sink_files_removed} data file(s))"
        )
    lines += [f"note: {n}" for n in r.notes]
    ctx.emit(to_dict(r), "\n".join(lines))


#: a follow stops after this many seconds without being interrupted (``--follow`` is for a person watching)
MAX_FOLLOW_S = 24 * 3600.0


@task.command("logs")
@click.argument("task_id", shell_complete=complete_names("task"))
@click.option("--tail", type=click.IntRange(1, 5000), default=100, show_default=True, help="lines to show")
@click.option("--follow", "-f", is_flag=True, help="keep printing new lines (Ctrl-C to stop)")
@click.option(
    "--interval", type=click.FloatRange(0.5, 60), default=2.0, show_default=True, help="seconds, with --follow"
)
@click.option("--timeout", type=click.FloatRange(0.1, 600), default=30.0, show_default=True, help=TIMEOUT_HELP)
@pass_ctx
def task_logs(ctx: Ctx, task_id: str, tail: int, follow: bool, interval: float, timeout: float) -> None:
    """The last lines of a pipeline's own log, from the broker that runs it (or last ran it)."""
    admin = ctx.admin()
    got = admin.task_logs(task_id, tail=tail, timeout=timeout)
    if ctx.json_out and not follow:
        ctx.emit(to_dict(got))
        return
    click.echo(f"# {got.path} on broker {got.broker}" + (" (earlier lines not shown)" if got.truncated else ""))
    for line in got.lines:
        click.echo(clip(line, 4000))
    end = time.monotonic() + MAX_FOLLOW_S
    offset = got.offset
    while follow and time.monotonic() < end:
        time.sleep(interval)  # a person watching: one request per interval, not a wait for a condition
        try:
            more = admin.task_logs(task_id, tail=tail, since=offset, timeout=timeout)
        except UserError:
            raise
        if more.offset < offset:
            click.echo("# (the log was rotated)")
        for line in more.lines:
            click.echo(clip(line, 4000))
        offset = more.offset
