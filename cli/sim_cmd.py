"""``zkctl sim ...``: the broker simulator from the command line."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from broker_sim.chaos import DEFAULT_FAULT_KINDS, FAULT_KINDS, ChaosOptions, run_chaos
from broker_sim.chaos import format_summary as format_chaos
from broker_sim.chaos.record import RecordError, rejudge
from broker_sim.runners.noop import DEFAULT_PREPARE_SHARE
from broker_sim.sim.farm import FarmError
from broker_sim.sim.scenarios import format_summary
from broker_sim.sim.simulation_types import SCENARIOS, NotConverged, SimOptions
from broker_sim.sim.simulator import run_simulation
from broker_sim.sim.skewed_load import SCENARIO as SKEWED
from broker_sim.sim.skewed_load import SkewOptions, format_runs, run_skewed
from cli.common import Ctx, UserError
from controller.protocol.cluster.roll_plan import DEFAULT_WARMUP_S, DEFAULT_WAVE, MAX_WAVE
from controller.protocol.group.assignors import ASSIGNORS
from controller.protocol.group.rules import COOPERATIVE, PROTOCOLS


@click.group("sim")
def sim() -> None:
    """Many brokers in one process, scripted scenarios and failure injection."""


#: brokers per farm process when ``--farms`` is left to choose
BROKERS_PER_FARM = 25


@sim.command("run")
@click.option("--brokers", type=click.IntRange(1, 1000), default=3, show_default=True)
@click.option("--tasks", type=click.IntRange(0, 100_000), default=30, show_default=True)
@click.option(
    "--protocol",
    type=click.Choice(list(PROTOCOLS)),
    default=COOPERATIVE,
    show_default=True,
    help="reconcile: the controller places tasks and each broker reconciles alone (no join barrier)",
)
@click.option(
    "--assignor",
    type=click.Choice(sorted(ASSIGNORS)),
    default="cooperative-sticky",
    show_default=True,
    help="the groups' assignor",
)
@click.option("--scenario", type=click.Choice((*SCENARIOS, SKEWED)), default="steady", show_default=True)
@click.option(
    "--restart-gap",
    "restart_gap",
    type=click.FloatRange(0, 3600),
    default=1.0,
    show_default=True,
    help="seconds a bounced broker stays away",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--start-latency", type=click.FloatRange(0, 60), default=0.0, show_default=True, help="no-op task start latency (s)"
)
@click.option(
    "--stop-latency", type=click.FloatRange(0, 60), default=0.0, show_default=True, help="no-op task stop latency (s)"
)
@click.option(
    "--session-timeout",
    type=click.FloatRange(2, 120),
    default=None,
    show_default="6; 10 when the brokers are spread over farms",
    help="ZooKeeper session of each broker, seconds (farms start every broker taking its tasks at once, which "
    "can keep ZooKeeper from answering for 5 s on a small machine)",
)
@click.option(
    "--scheduled-delay",
    type=click.FloatRange(0, 3600),
    default=0.0,
    show_default=True,
    help="scheduled rebalance delay: a departed broker's tasks wait this long for it",
)
@click.option("--static", "static", is_flag=True, help="static membership (instance id = broker id)")
@click.option("--controlled-shutdown", is_flag=True, help="brokers leave by controlled shutdown in rolling bounces")
@click.option(
    "--intervals-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the recorded run intervals as JSON (for zkctl timeline)",
)
@click.option(
    "--farms",
    type=click.IntRange(0, 64),
    default=None,
    show_default=f"0 up to {BROKERS_PER_FARM} brokers, else one per {BROKERS_PER_FARM}",
    help="broker farm processes to spread the brokers over (0: all in this process)",
)
@click.option(
    "--metrics-interval",
    type=click.FloatRange(0, 3600),
    default=5.0,
    show_default=True,
    help="seconds between a task's metric-only status writes (at 100,000 tasks: 20,000 writes/s at 5 s)",
)
@click.option(
    "--converge-timeout",
    type=click.FloatRange(1, 3600),
    default=60.0,
    show_default=True,
    help="seconds the cluster may take to converge, at start and after each step",
)
@click.option(
    "--settle",
    type=click.FloatRange(0, 600),
    default=None,
    help="seconds the converged cluster runs before the scenario, so that the step is measured from a "
    "steady cluster, not amid the first status writes of every task just started",
    show_default="0; 2 when the brokers are spread over farms",
)
@click.option(
    "--repeat",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="take a one-step scenario's step this many times on the same cluster (put back, unmeasured, "
    "in between: the broker added shut down, the broker killed or shut down started again, a new "
    "standby controller); the summary gives each figure and their median",
)
@click.option(
    "--roll-batch",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="brokers down at a time in the roll scenario (the controller's planned roll)",
)
@click.option(
    "--roll-wave",
    type=click.IntRange(0, MAX_WAVE),
    default=DEFAULT_WAVE,
    show_default=True,
    help="tasks moving at once in the roll scenario (0: a step's tasks all at once; at most the brokers' 8 start "
    "threads: no task waits behind others to start)",
)
@click.option(
    "--roll-warmup",
    type=click.FloatRange(0, 600),
    default=DEFAULT_WARMUP_S,
    show_default=True,
    help="seconds each roll step's first wave waits for the brokers receiving its tasks to prepare them",
)
@click.option(
    "--prepare-share",
    type=click.FloatRange(0, 1),
    default=DEFAULT_PREPARE_SHARE,
    show_default=True,
    help="share of --start-latency a no-op task's prepare pays before the task arrives (a planned roll's "
    "warm-up; 0: no prepare)",
)
@click.option(
    "--roll-move-first/--roll-in-place",
    default=True,
    show_default=True,
    help="roll scenario: the first batch's tasks move away before it goes down, or wait for its restart in place",
)
@click.option(
    "--load-window",
    type=click.FloatRange(0.5, 3600),
    default=5.0,
    show_default=True,
    help="skewed-load: the controller's load window (an imbalance lasts it before pipelines move for it)",
)
@click.option(
    "--duration",
    type=click.FloatRange(1, 3600),
    default=30.0,
    show_default=True,
    help="skewed-load: seconds each assignor's cluster is sampled after the brokers joined",
)
@click.pass_obj
def sim_run(
    ctx: Ctx,
    brokers: int,
    tasks: int,
    protocol: str,
    assignor: str,
    scenario: str,
    restart_gap: float,
    seed: int,
    start_latency: float,
    stop_latency: float,
    session_timeout: float | None,
    scheduled_delay: float,
    static: bool,
    controlled_shutdown: bool,
    intervals_out: Path | None,
    farms: int | None,
    metrics_interval: float,
    converge_timeout: float,
    settle: float | None,
    repeat: int,
    roll_batch: int,
    roll_wave: int,
    roll_warmup: float,
    prepare_share: float,
    roll_move_first: bool,
    load_window: float,
    duration: float,
) -> None:
    """Run N brokers and a controller on an embedded ZooKeeper (or --zk), play a scenario, print the summary.

    Many brokers are spread over broker farm processes (--farms), so that they do not share the
    controller's interpreter. Exits 1 if any task was ever owned twice, or if the cluster did not converge."""
    if repeat > 1 and scenario in ("steady", "rolling-bounce"):
        raise click.BadParameter(
            f"--repeat applies to one-step scenarios; {scenario} is not one", param_hint="--repeat"
        )
    root = click.get_current_context().find_root()
    given = root.get_parameter_source("hosts") not in (click.core.ParameterSource.DEFAULT, None)
    hosts = ctx.hosts if given else None
    n_farms = farms if farms is not None else (0 if brokers <= BROKERS_PER_FARM else -(-brokers // BROKERS_PER_FARM))
    if session_timeout is None:
        session_timeout = 10.0 if n_farms else 6.0
    opts = SimOptions(
        brokers=brokers,
        tasks=tasks,
        protocol=protocol,
        assignor=assignor,
        scenario=scenario,
        restart_gap_s=restart_gap,
        seed=seed,
        start_latency_s=start_latency,
        stop_latency_s=stop_latency,
        session_timeout_s=session_timeout,
        scheduled_delay_s=scheduled_delay,
        static_membership=static,
        controlled_shutdown=controlled_shutdown,
        zk_hosts=hosts,
        intervals_out=str(intervals_out) if intervals_out else None,
        farms=n_farms,
        converge_timeout_s=converge_timeout,
        metrics_interval_s=metrics_interval,
        settle_s=settle if settle is not None else (2.0 if n_farms else 0.0),
        repeat=repeat,
        roll_batch=roll_batch,
        roll_wave=roll_wave,
        roll_warmup_s=roll_warmup,
        prepare_share=prepare_share,
        roll_in_place=not roll_move_first,
    )
    echo = (lambda s: None) if ctx.json_out else click.echo
    if scenario == SKEWED:
        _skewed_load(ctx, opts, load_window, duration, echo)
        return
    try:
        summary = run_simulation(opts, echo=echo)
    except (NotConverged, FarmError) as exc:
        raise UserError(str(exc)) from None
    if ctx.json_out:
        ctx.emit(summary.to_dict())
    else:
        click.echo(format_summary(summary))
    if summary.double_ownership:
        raise SystemExit(1)
    stuck = [f"{s['step']} {s['broker']}" for s in summary.steps if s["converged_s"] is None]
    if stuck:
        raise UserError(f"the cluster did not converge within {converge_timeout:g}s after: {', '.join(stuck)}")


def _skewed_load(ctx: Ctx, opts: SimOptions, window: float, duration: float, echo: Callable[[str], None]) -> None:
    """One heavy task per broker (cost 0.6) and the rest light (0.2 per broker in all), each assignor in turn."""
    if opts.tasks <= opts.brokers:
        raise click.BadParameter(f"skewed-load needs more tasks than brokers ({opts.brokers})", param_hint="--tasks")
    light = opts.tasks - opts.brokers
    skew = SkewOptions(
        heavy=opts.brokers, light=light, light_cost=round(0.2 * opts.brokers / light, 4), duration_s=duration
    )
    base = replace(opts, load_window_s=window, load_interval_s=0.5, metrics_interval_s=1.0)
    try:
        runs = run_skewed(base, skew, echo)
    except (NotConverged, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    if ctx.json_out:
        click.echo(
            json.dumps({"scenario": SKEWED, "window_s": window, "runs": [r.to_dict() for r in runs]}, sort_keys=True)
        )
    else:
        click.echo(format_runs(runs, window))


@sim.command("chaos")
@click.option("--seed", type=int, default=0, show_default=True, help="same seed (and options), same fault schedule")
@click.option(
    "--duration",
    type=click.FloatRange(1, 7 * 24 * 3600),
    default=60.0,
    show_default=True,
    help="seconds during which faults start",
)
@click.option("--brokers", type=click.IntRange(2, 200), default=4, show_default=True)
@click.option("--tasks", type=click.IntRange(1, 20_000), default=40, show_default=True)
@click.option("--controllers", type=click.IntRange(1, 5), default=2, show_default=True, help="controller candidates")
@click.option(
    "--process-brokers", is_flag=True, help="brokers and controllers as processes: kill -9 and SIGSTOP/SIGCONT are real"
)
@click.option("--session-timeout", type=click.FloatRange(2, 60), default=4.0, show_default=True)
@click.option("--rebalance-timeout", type=click.FloatRange(1, 600), default=8.0, show_default=True)
@click.option("--scheduled-delay", type=click.FloatRange(0, 600), default=0.0, show_default=True)
@click.option(
    "--mean-gap",
    type=click.FloatRange(0.1, 3600),
    default=2.5,
    show_default=True,
    help="mean seconds between fault starts",
)
@click.option(
    "--faults",
    "kinds",
    default=",".join(DEFAULT_FAULT_KINDS),
    show_default=True,
    help="comma-separated fault kinds to draw from, or 'all' "
    f"(also: {', '.join(sorted(set(FAULT_KINDS) - set(DEFAULT_FAULT_KINDS)))})",
)
@click.option(
    "--pipelines",
    type=click.IntRange(0, 50),
    default=0,
    show_default=True,
    help="streaming file pipelines on the spark runner (needs --process-brokers): sinks must hold every "
    "generated record exactly once",
)
@click.option(
    "--records",
    type=click.IntRange(1, 10_000_000),
    default=3000,
    show_default=True,
    help="records generated per pipeline while the faults run",
)
@click.option("--spark-master", default="local[1]", show_default=True, help="Spark master of the broker processes")
@click.option("--max-moves", type=click.IntRange(1), default=None, help="a move throttle for the run: moves in flight")
@click.option(
    "--max-moves-per-broker",
    type=click.IntRange(1),
    default=None,
    help="a move throttle for the run: moves starting on one broker",
)
@click.option(
    "--protocol",
    type=click.Choice(list(PROTOCOLS)),
    default=COOPERATIVE,
    show_default=True,
    help="the brokers' group protocol",
)
@click.option(
    "--ensemble",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="ZooKeeper servers of the run's own: 3 runs an ensemble whose faults are the zk-* kinds "
    "(zk-kill-leader, zk-kill-follower, zk-lose-quorum, zk-isolate)",
)
@click.option(
    "--intervals-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the recorded run intervals as JSON (for zkctl timeline)",
)
@click.pass_obj
def sim_chaos(
    ctx: Ctx,
    seed: int,
    duration: float,
    brokers: int,
    tasks: int,
    controllers: int,
    process_brokers: bool,
    session_timeout: float,
    rebalance_timeout: float,
    scheduled_delay: float,
    mean_gap: float,
    kinds: str,
    pipelines: int,
    records: int,
    spark_master: str,
    max_moves: int | None,
    max_moves_per_broker: int | None,
    protocol: str,
    ensemble: str,
    intervals_out: Path | None,
) -> None:
    """A seeded schedule of faults (printed first) against a live cluster, then the invariant checker.

    Faults: broker kill / session expiry / freeze / partition, controller kill / freeze, ZooKeeper
    stop-start, rolling bounce, task create/delete storms; on request, wedged stops (a broker's stops hang
    while it is cut off: it must halt, and is restarted), maintenance windows, ghost members and rewritten
    member reports. Verdicts: (1) no task had two running owners,
    (2) every RUNNING task runs on exactly one live broker within a stated bound of the last fault,
    (3) controller epoch and generations only grow, (4) no group stays out of Stable longer than the
    rebalance timeout + delay once the faults stop; with --pipelines, (5) every sink holds every record
    exactly once; when a broker halted, (6) every halted broker is back in the group; with a throttle,
    (7) never more moves in flight than it allows; with maintenance windows, (8) nothing moves inside them;
    (9) no task placed longer than the rebalance timeout without a running owner while its group says
    Stable; with ghost members, (10) a member with no broker behind it is never given work; with quorum
    losses (--ensemble 3), (12) every task runs again within the bound after the quorum returns.
    A fault the engine refuses at injection is listed as not injected and judged without it.
    Exits 1 on any violation, or when fewer than half the drawn faults could be injected."""
    if pipelines and not process_brokers:
        raise click.UsageError("--pipelines needs --process-brokers (each broker process runs its own Spark)")
    chosen = FAULT_KINDS if kinds.strip() == "all" else tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in chosen if k not in FAULT_KINDS]
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown fault kind(s) {unknown}; choose from {', '.join(FAULT_KINDS)}", param_hint="--faults"
        )
    root = click.get_current_context().find_root()
    given = root.get_parameter_source("hosts") not in (click.core.ParameterSource.DEFAULT, None)
    opts = ChaosOptions(
        seed=seed,
        duration_s=duration,
        brokers=brokers,
        tasks=tasks,
        controllers=controllers,
        process_brokers=process_brokers,
        session_timeout_s=session_timeout,
        rebalance_timeout_s=rebalance_timeout,
        scheduled_delay_s=scheduled_delay,
        mean_gap_s=mean_gap,
        kinds=chosen,
        zk_hosts=ctx.hosts if given else None,
        pipelines=pipelines,
        records=records,
        spark_master=spark_master,
        max_moves=max_moves,
        max_moves_per_broker=max_moves_per_broker,
        intervals_out=str(intervals_out) if intervals_out else None,
        protocol=protocol,
        ensemble=int(ensemble),
    )
    try:
        summary = run_chaos(opts, echo=(lambda s: None) if ctx.json_out else click.echo)
    except NotConverged as exc:
        raise UserError(str(exc)) from None
    ctx.emit(summary.to_dict(), format_chaos(summary))
    if not summary.ok:
        raise SystemExit(1)


@sim.command("rejudge")
@click.argument("workdir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--bound", type=click.FloatRange(0, 3600), default=None, help="seconds; the run's own bound unless given")
@click.pass_obj
def sim_rejudge(ctx: Ctx, workdir: Path, bound: float | None) -> None:
    """Invariant 9 again, from the placement looks a chaos run kept in its work directory (ZKC_CHAOS_KEEP=1
    keeps it): no task placed longer than the bound without a running owner while its group says Stable.
    Exits 1 on a violation."""
    try:
        verdict, longest, longest_stable = rejudge(workdir, bound)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    human = "\n".join(
        [
            f"invariant {verdict.invariant} {'ok  ' if verdict.ok else 'FAIL'} {verdict.name}",
            *(f"    {d}" for d in verdict.details),
            f"longest ownerless {longest:.2f}s, {longest_stable:.2f}s of it while Stable",
        ]
    )
    ctx.emit(
        {"ok": verdict.ok, "details": verdict.details, "longest_s": longest, "longest_stable_s": longest_stable},
        human,
    )
    if not verdict.ok:
        raise SystemExit(1)
