"""``zkctl sim ...``: the broker simulator from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import click

from broker_sim.sim import SCENARIOS, SimOptions, format_summary, run_simulation
from controller.protocol import COOPERATIVE, EAGER


@click.group("sim")
def sim() -> None:
    """Many brokers in one process, scripted scenarios and failure injection."""


@sim.command("run")
@click.option("--brokers", type=click.IntRange(1, 500), default=3, show_default=True)
@click.option("--tasks", type=click.IntRange(0, 100_000), default=30, show_default=True)
@click.option("--protocol", type=click.Choice([COOPERATIVE, EAGER]), default=COOPERATIVE, show_default=True)
@click.option("--assignor", default="cooperative-sticky", show_default=True)
@click.option("--scenario", type=click.Choice(SCENARIOS), default="steady", show_default=True)
@click.option("--restart-gap", "restart_gap", type=click.FloatRange(0, 3600), default=1.0, show_default=True,
              help="seconds a bounced broker stays away")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--start-latency", type=click.FloatRange(0, 60), default=0.0, show_default=True, help="no-op task start latency (s)")
@click.option("--stop-latency", type=click.FloatRange(0, 60), default=0.0, show_default=True, help="no-op task stop latency (s)")
@click.option("--session-timeout", type=click.FloatRange(2, 120), default=6.0, show_default=True)
@click.option("--scheduled-delay", type=click.FloatRange(0, 3600), default=0.0, show_default=True,
              help="scheduled rebalance delay: a departed broker's tasks wait this long for it")
@click.option("--static", "static", is_flag=True, help="static membership (instance id = broker id)")
@click.option("--controlled-shutdown", is_flag=True, help="brokers leave by controlled shutdown in rolling bounces")
@click.option("--intervals-out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write the recorded run intervals as JSON (for `zkctl timeline`)")
@click.pass_obj
def sim_run(ctx, brokers, tasks, protocol, assignor, scenario, restart_gap, seed, start_latency, stop_latency,
            session_timeout, scheduled_delay, static, controlled_shutdown, intervals_out) -> None:
    """Run N brokers and a controller on an embedded ZooKeeper (or --zk), play a scenario, print the summary.

    Exits 1 if any task was ever owned twice."""
    from controller.assignors import ASSIGNORS

    if assignor not in ASSIGNORS:
        raise click.BadParameter(f"unknown assignor {assignor!r}; choose one of {', '.join(sorted(ASSIGNORS))}",
                                 param_hint="--assignor")
    root = click.get_current_context().find_root()
    given = root.get_parameter_source("hosts") not in (click.core.ParameterSource.DEFAULT, None)
    hosts = ctx.hosts if given else None
    opts = SimOptions(brokers=brokers, tasks=tasks, protocol=protocol, assignor=assignor, scenario=scenario,
                      restart_gap_s=restart_gap, seed=seed, start_latency_s=start_latency, stop_latency_s=stop_latency,
                      session_timeout_s=session_timeout, scheduled_delay_s=scheduled_delay, static_membership=static,
                      controlled_shutdown=controlled_shutdown, zk_hosts=hosts,
                      intervals_out=str(intervals_out) if intervals_out else None)
    echo = (lambda s: None) if ctx.json_out else click.echo
    summary = run_simulation(opts, echo=echo)
    if ctx.json_out:
        click.echo(json.dumps(summary.to_dict(), sort_keys=True))
    else:
        click.echo(format_summary(summary))
    if summary.double_ownership:
        raise SystemExit(1)
