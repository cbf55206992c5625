"""Long-running processes: ``zkctl controller run`` and ``zkctl broker run``; and ``zkctl controller list``,
the candidates those runs register.

Both run in the foreground until a signal: the controller stops on SIGINT/SIGTERM; a broker does a
controlled shutdown on SIGTERM (or the first Ctrl-C) and exits once the controller has moved its tasks
away, and stops at once on a second Ctrl-C. Exit code 0 either way.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.common import Ctx, UserError, pass_ctx, table, when
from controller.protocol.cluster.layout import InvalidName, check_name
from controller.protocol.errors import ZkcError
from controller.protocol.group.assignors import ASSIGNORS
from controller.protocol.group.rules import COOPERATIVE, PROTOCOLS, protocols_for
from controller.protocol.tasks.storage import checkpoint_root as storage_root
from controller.protocol.tasks.storage import cluster_dir

if TYPE_CHECKING:  # imported by the commands that run
    from controller.daemon.metrics import MetricsServer
    from controller.zk.client import ZkSettings

log = logging.getLogger("zkctl")


def _name(kind: str) -> Callable[[click.Context, click.Parameter, str | None], str | None]:
    def check(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_name(kind, value)
        except InvalidName as exc:
            raise click.BadParameter(str(exc)) from None

    return check


def _conf(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{v!r} is not KEY=VALUE")
        out[key.strip()] = val
    return out


def _settings(ctx: Ctx, session_timeout: float) -> ZkSettings:
    return dataclasses.replace(ctx.settings, session_timeout_s=session_timeout)


def _refuse_unset_root(ctx: Ctx, client: Any) -> None:
    """A broker serves a cluster, it does not found one: on a root never set up (a mistyped ``--zk-root``) it
    exits with the message instead of laying out an empty cluster that no controller serves. The controller's
    first start, ``zkctl init`` and the harnesses create a root."""
    from controller.admin.roots import missing_root_message

    try:
        message = missing_root_message(client, ctx.layout, ctx.hosts)
    except BaseException:
        client.stop()
        client.close()
        raise
    if message is not None:
        client.stop()
        client.close()
        raise UserError(message)


# ---- controller -----------------------------------------------------------------------------------
@click.group("controller")
def controller() -> None:
    """The controller."""


@controller.command("list")
@pass_ctx
def controller_list(ctx: Ctx) -> None:
    """The controller candidates: the active one (with its epoch) and those standing by."""
    ctx.start_client()
    from controller.protocol.records import codecs
    from controller.protocol.records.payload_validation import PayloadError
    from controller.protocol.records.registration_records import ControllerInfo
    from controller.zk.candidates import list_candidates

    ctx.require_root()
    client = ctx.client()
    active: ControllerInfo | None = None
    active_error = None
    try:
        data, _ = client.get(ctx.layout.controller)
        active = codecs.decode(ControllerInfo, data, ctx.layout.controller)
    except PayloadError as exc:
        active_error = exc.reason
    except Exception as exc:  # NoNodeError: no active controller
        if type(exc).__name__ != "NoNodeError":
            raise
    rows: list[dict[str, Any]] = []
    for c in list_candidates(client, ctx.layout):
        is_active = active is not None and active.controller_id == c.controller_id
        rows.append(
            {
                "controller_id": c.controller_id,
                "active": is_active,
                "epoch": active.epoch if is_active and active else None,
                "host": c.info.host if c.info else None,
                "pid": c.info.pid if c.info else None,
                "since": c.info.since if c.info else None,
                "error": c.error,
            }
        )
    if active is not None and not any(r["active"] for r in rows):  # a controller that registers no candidacy
        rows.insert(
            0,
            {
                "controller_id": active.controller_id,
                "active": True,
                "epoch": active.epoch,
                "host": active.host,
                "pid": None,
                "since": active.since,
                "error": None,
            },
        )
    if ctx.json_out:
        ctx.emit(rows)
        return
    if not rows:
        click.echo("No controller candidates." + (f" /controller: {active_error}" if active_error else ""))
        return
    click.echo(
        table(
            ["ID", "ROLE", "EPOCH", "HOST", "PID", "SINCE", "ERROR"],
            [
                [
                    r["controller_id"],
                    "active" if r["active"] else "standby",
                    r["epoch"],
                    r["host"],
                    r["pid"],
                    when(r["since"]),
                    r["error"],
                ]
                for r in rows
            ],
        )
    )


@controller.command("run")
@click.option(
    "--id", "controller_id", default=None, callback=_name("controller id"), show_default="HOST-PID", help="candidate id"
)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None, help="serve Prometheus metrics (0: any free port)"
)
@click.option(
    "--rebalance-timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="seconds a rebalance waits for members to rejoin / the leader to sync",
)
@click.option(
    "--scheduled-delay",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="seconds a departed broker's tasks wait for it to come back before they move",
)
@click.option(
    "--default-assignor",
    type=click.Choice(sorted(ASSIGNORS)),
    default="sticky",
    show_default=True,
    help="assignor when members name none in common",
)
@click.option(
    "--initial-delay",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="reconcile: seconds a group that runs nothing yet waits after each join before its first target",
)
@click.option(
    "--retarget-interval",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="reconcile: while a group still reconciles, the least seconds between two targets",
)
@click.option(
    "--load-window",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="load-balanced groups: seconds an imbalance must last before pipelines move for it (and a moved one stays)",
)
@click.option(
    "--session-timeout",
    type=click.FloatRange(min=2),
    default=10.0,
    show_default=True,
    help="ZooKeeper session, seconds",
)
@pass_ctx
def controller_run(
    ctx: Ctx,
    controller_id: str | None,
    metrics_port: int | None,
    rebalance_timeout: float,
    scheduled_delay: float,
    default_assignor: str,
    initial_delay: float,
    retarget_interval: float,
    load_window: float,
    session_timeout: float,
) -> None:
    """Run a controller candidate until SIGINT/SIGTERM (the one that wins /controller is active)."""
    from controller.daemon import Controller, ControllerConfig, default_controller_id
    from controller.protocol.group.vocabulary import GroupConfig

    settings = _settings(ctx, session_timeout)
    config = ControllerConfig(
        controller_id=controller_id or default_controller_id(),
        settings=settings,
        metrics_port=metrics_port,
        group=GroupConfig(
            rebalance_timeout_s=rebalance_timeout,
            scheduled_rebalance_delay_s=scheduled_delay,
            default_assignor=default_assignor,
            initial_delay_s=initial_delay,
            retarget_interval_s=retarget_interval,
            load_window_s=load_window,
            load_check_s=max(0.5, min(10.0, load_window / 6)),
        ),
    )
    ctx.patient()
    client = ctx.new_client(settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _s, _f: stop.set())
    try:
        c = Controller(config, client=client).start()
    except OSError as exc:  # e.g. the metrics port is taken
        client.stop()
        client.close()
        raise UserError(f"cannot start the controller: {exc}") from None
    metrics = f", metrics on http://127.0.0.1:{c.metrics_server.port}/metrics" if c.metrics_server else ""
    click.echo(f"controller {c.id} started (root {ctx.layout.root}{metrics}); SIGINT/SIGTERM to stop")
    was_active = False
    try:
        while not stop.wait(0.2):
            if c.active != was_active:
                was_active = c.active
                click.echo(
                    f"controller {c.id} is active at epoch {c.epoch}"
                    if was_active
                    else f"controller {c.id} is a standby"
                )
    finally:
        click.echo(f"controller {c.id} stopping")
        c.stop()
    click.echo(f"controller {c.id} stopped")


# ---- broker ---------------------------------------------------------------------------------------
_SPARK_OPTION_NAMES = {
    "master": ("master", "spark_master"),
    "conf": ("conf", "spark_conf", "config"),
    "checkpoint_root": ("checkpoint_root", "checkpoint_dir", "checkpoints_root", "checkpoint_location"),
    "warm_session": ("warm_session",),
}


def _spark_options(given: dict[str, Any]) -> dict[str, Any]:
    """Map our options onto the Spark runner's constructor parameters."""
    given = {k: v for k, v in given.items() if v not in (None, {}, ())}
    try:
        from broker_sim.runners.spark import SparkRunner
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("broker_sim"):
            raise UserError(
                "the spark runner is not available in this build (broker_sim/runners/spark.py); use --runner noop"
            ) from None
        raise UserError(f"the spark runner cannot be loaded: {exc}") from None
    params = inspect.signature(SparkRunner).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    out = {}
    for ours, value in given.items():
        names = _SPARK_OPTION_NAMES[ours]
        name = next((n for n in names if n in params), names[0] if var_kw else None)
        if name is None:
            raise UserError(f"the spark runner has no {ours.replace('_', ' ')} option")
        out[name] = str(value) if isinstance(value, Path) else value
    return out


def _worker_metrics(worker: Any, port: int) -> MetricsServer:
    from prometheus_client import CollectorRegistry, Gauge

    from controller.daemon.metrics import MetricsServer

    r = CollectorRegistry()
    Gauge("zkc_worker_running_tasks", "tasks this broker runs", registry=r).set_function(
        lambda: len(worker.running_tasks())
    )
    Gauge("zkc_worker_held_tasks", "owner znodes this broker holds", registry=r).set_function(
        lambda: len(worker.held_tasks())
    )
    Gauge("zkc_worker_generation", "group generation of the last assignment", registry=r).set_function(
        lambda: worker.generation
    )
    Gauge("zkc_worker_stable", "1 when the member is Stable", registry=r).set_function(
        lambda: worker.state() == "Stable"
    )
    return MetricsServer(r, port, name=f"worker-{worker.id}-metrics")


@click.command("run")
@click.option(
    "--id", "broker_id", required=True, callback=_name("broker id"), help="broker id (unique among live brokers)"
)
@click.option("--group", default="default", show_default=True, callback=_name("group"))
@click.option(
    "--instance-id", default=None, callback=_name("instance id"), help="static membership: same id after a restart"
)
@click.option("--capacity", type=click.IntRange(1, 1_000_000), default=1, show_default=True)
@click.option("--rack", default=None)
@click.option("--runner", type=click.Choice(["spark", "noop"]), default="spark", show_default=True)
@click.option(
    "--protocol",
    type=click.Choice(list(PROTOCOLS)),
    default=COOPERATIVE,
    show_default=True,
    help="reconcile: the controller places tasks, no join barrier (also accepts cooperative); cooperative "
    "also accepts eager: a mixed group still forms (rolling upgrades)",
)
@click.option(
    "--assignor",
    type=click.Choice(sorted(ASSIGNORS)),
    default="cooperative-sticky",
    show_default=True,
    help="assignor this broker uses when it leads the group",
)
@click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None, help="serve Prometheus metrics (0: any free port)"
)
@click.option("--spark-master", default=None, help="Spark master URL (spark runner)")
@click.option(
    "--spark-conf", multiple=True, callback=_conf, metavar="KEY=VALUE", help="Spark setting, repeatable (spark runner)"
)
@click.option(
    "--checkpoint-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_default="STATE_DIR/checkpoints",
    help="where this broker keeps streaming checkpoints (env ZKC_CHECKPOINT_ROOT); a directory per cluster root is "
    "made under it, and the offsets, reset and purge requests are carried out there",
)
@click.option(
    "--lazy-session",
    is_flag=True,
    default=False,
    help="start the SparkSession with the first task instead of before joining the group (spark runner)",
)
@click.option(
    "--start-latency", type=click.FloatRange(min=0), default=None, help="seconds each start takes (noop runner)"
)
@click.option(
    "--stop-latency", type=click.FloatRange(min=0), default=None, help="seconds each stop takes (noop runner)"
)
@click.option(
    "--prepare-share",
    type=click.FloatRange(0, 1),
    default=None,
    show_default="0.7",
    help="share of --start-latency a task's prepare pays before it arrives (a planned roll's warm-up; noop runner)",
)
@click.option(
    "--stop-hang",
    is_flag=True,
    default=False,
    help="every stop hangs, as a wedged driver's (noop runner; failure injection: the broker halts, exit 75)",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0.1),
    default=None,
    show_default="3x the runner's stop budget, at least 5",
    help="seconds one task's stop may take before the broker kills its runner and halts (exit 75)",
)
@click.option(
    "--session-timeout",
    type=click.FloatRange(min=2),
    default=10.0,
    show_default=True,
    help="ZooKeeper session, seconds",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="seconds a controlled shutdown may take before the broker stops anyway",
)
@click.option(
    "--metrics-interval",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="seconds between status writes when only a task's metrics changed (state changes: at once)",
)
@click.option(
    "--load-interval",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    help="seconds between samples of this broker's load (CPU, memory, tasks' load shares; 0: never reported)",
)
@pass_ctx
def broker_run(
    ctx: Ctx,
    broker_id: str,
    group: str,
    instance_id: str | None,
    capacity: int,
    rack: str | None,
    runner: str,
    protocol: str,
    assignor: str,
    metrics_port: int | None,
    spark_master: str | None,
    spark_conf: dict[str, str],
    checkpoint_root: Path | None,
    lazy_session: bool,
    start_latency: float | None,
    stop_latency: float | None,
    prepare_share: float | None,
    stop_hang: bool,
    stop_timeout: float | None,
    session_timeout: float,
    shutdown_timeout: float,
    metrics_interval: float,
    load_interval: float,
) -> None:
    """Run a broker: register, join the group, run the assigned pipelines.

    SIGTERM (or Ctrl-C) = controlled shutdown: exit 0 once the controller has moved its tasks away;
    Ctrl-C twice = stop at once. Exit 75 = halted at its fence deadline (a stop that hung, ZooKeeper out of
    reach while a task would not stop, the process paused past its session): its supervisor restarts it.
    """
    from broker_sim.worker import RegistrationConflict, Worker, WorkerConfig, install_signal_handlers
    from broker_sim.worker.logsink import log_without_blocking

    log_without_blocking(logging.getLogger().level)  # a full output pipe must not stall the fence's threads

    if runner == "noop":
        if spark_master or spark_conf or lazy_session:
            raise click.UsageError("--spark-master, --spark-conf and --lazy-session apply to --runner spark only")
        options: dict[str, Any] = {
            k: v
            for k, v in (
                ("start_latency_s", start_latency),
                ("stop_latency_s", stop_latency),
                ("prepare_share", prepare_share),
            )
            if v is not None
        }
        if stop_hang:
            options["stop_hang"] = True
    try:  # decided here once, for the runner and the storage requests alike
        root = storage_root(
            str(checkpoint_root) if checkpoint_root else None,
            os.environ,
            str(ctx.state_dir),
            ctx.layout.root,
            os.getcwd(),
        )
    except ZkcError as exc:
        raise click.BadParameter(str(exc), param_hint="--checkpoint-root") from None
    if runner != "noop":
        if start_latency is not None or stop_latency is not None or prepare_share is not None or stop_hang:
            raise click.UsageError(
                "--start-latency, --stop-latency, --prepare-share and --stop-hang apply to --runner noop only"
            )
        options = _spark_options(
            {
                "master": spark_master,
                "conf": spark_conf,
                "checkpoint_root": root,
                "warm_session": False if lazy_session else None,
            }
        )
    settings = _settings(ctx, session_timeout)
    config = WorkerConfig(
        broker_id=broker_id,
        settings=settings,
        group=group,
        instance_id=instance_id,
        capacity=capacity,
        rack=rack,
        protocols=protocols_for(protocol),
        assignors=(assignor,),
        runner=runner,
        runner_options=options,
        stop_timeout_s=stop_timeout,
        metrics_interval_s=metrics_interval,
        checkpoint_root=root,
        task_logs_dir=os.path.join(
            os.path.abspath(ctx.state_dir), "task-logs", cluster_dir(ctx.layout.root), broker_id
        ),
        load_interval_s=load_interval,
    )
    ctx.patient()
    client = ctx.new_client(settings)
    _refuse_unset_root(ctx, client)
    try:
        worker = Worker(config, client=client)
    except Exception as exc:  # the runner could not be built (bad option, Spark missing)
        client.stop()
        client.close()
        raise UserError(f"cannot start the {runner} runner: {exc}") from None
    stop_now = threading.Event()
    install_signal_handlers(worker, stop_now.set)
    requested: dict[str, float] = {}

    def remember(handler: Any) -> Any:
        def on_signal(sig: int, frame: Any) -> None:
            requested.setdefault("at", time.monotonic())
            handler(sig, frame)

        return on_signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, remember(signal.getsignal(sig)))
    try:
        worker.start()
    except RegistrationConflict as exc:  # nothing started: leave the other broker alone
        worker.stop(graceful=False)
        raise UserError(str(exc)) from None
    metrics = _worker_metrics(worker, metrics_port) if metrics_port is not None else None
    click.echo(
        f"broker {broker_id} started (group {group}, runner {runner}, protocols {','.join(config.protocols)}, "
        f"root {ctx.layout.root}, checkpoints {root}"
        + (f", metrics on http://127.0.0.1:{metrics.port}/metrics" if metrics else "")
        + "); SIGTERM or Ctrl-C for a controlled shutdown, Ctrl-C twice to stop at once"
    )
    announced = False
    try:
        while not (worker.exited.is_set() or stop_now.is_set() or worker.failed.is_set()):
            if "at" in requested:
                if not announced:
                    announced = True
                    click.echo(
                        f"broker {broker_id}: controlled shutdown requested; waiting for the controller to move "
                        f"its tasks (up to {shutdown_timeout:g}s)"
                    )
                if time.monotonic() - requested["at"] > shutdown_timeout:
                    click.echo(
                        f"broker {broker_id}: controlled shutdown did not finish in {shutdown_timeout:g}s; stopping",
                        err=True,
                    )
                    break
            time.sleep(0.1)
    finally:
        if not worker.failed.is_set():
            how = "controlled shutdown complete" if worker.exited.is_set() else "stopping now"
            click.echo(f"broker {broker_id}: {how}")
        worker.stop()
        if metrics:
            metrics.close()
    if worker.failed.is_set():
        raise UserError(worker.failure or f"broker {broker_id} cannot run")
    click.echo(f"broker {broker_id} stopped")
