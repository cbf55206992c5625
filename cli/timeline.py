"""``zkctl timeline``: a picture of task ownership over time, from recorded run intervals."""

from __future__ import annotations

from pathlib import Path

import click

from cli.common import Ctx, UserError, pass_ctx
from controller.admin import to_dict


@click.command("timeline")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="image to write (PNG)")
@click.option("--from-zk", is_flag=True, help="the intervals workers flushed to /intervals/<broker>")
@click.option(
    "--intervals",
    "intervals_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="a JSON list of run intervals (as the simulator writes)",
)
@click.option("--title", default=None)
@pass_ctx
def timeline(ctx: Ctx, out: Path, from_zk: bool, intervals_file: Path | None, title: str | None) -> None:
    """One row per task, one colour per broker, gaps where nothing ran (double ownership outlined in red)."""
    from broker_sim.sim.timeline import TimelineError, load_intervals, plot_timeline
    from controller.admin.interval_ends import close_ended_sessions

    if from_zk == (intervals_file is not None):
        raise click.UsageError("give exactly one of --from-zk and --intervals FILE")
    try:
        if intervals_file is None:  # --from-zk: a dead session's open run ends when the session did, not "now"
            intervals = close_ended_sessions(ctx.client(), ctx.layout, ctx.admin().intervals())
        else:
            intervals = load_intervals(intervals_file)
        if not intervals:
            raise TimelineError("no run intervals recorded" + (f" under {ctx.layout.intervals}" if from_zk else ""))
        summary = plot_timeline(intervals, out, title)
    except TimelineError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    ctx.emit(
        to_dict(summary),
        f"Wrote {summary.out}: {summary.tasks} tasks, {summary.brokers} brokers, {summary.intervals} runs "
        f"over {summary.span_s:.1f}s (idle gaps {summary.gap_s:.1f}s, double ownership {summary.overlaps})",
    )
