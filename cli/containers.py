"""``zkctl cluster build|up|ps|down|chaos``: the cluster as containers of the one image, through the
Docker SDK (``pip install 'zkcontroller[docker]'``); and ``zkctl health``, the image's HEALTHCHECK."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.request
from collections.abc import Callable
from types import ModuleType
from typing import ParamSpec, TypeVar

import click

from cli.common import Ctx, UserError, pass_ctx, table

P = ParamSpec("P")
R = TypeVar("R")


def _containers() -> ModuleType:
    """``broker_sim.deploy.containers``, imported when a command runs (the Docker SDK loads with it)."""
    from broker_sim.deploy import containers

    return containers


def _container_chaos() -> ModuleType:
    """``broker_sim.deploy.container_chaos``, imported when the chaos command runs (as ``_containers``)."""
    from broker_sim.deploy import container_chaos

    return container_chaos


def _guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Missing SDK or engine, a bad size: one line, exit 1."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        c = _containers()
        try:
            return fn(*args, **kwargs)
        except (c.ContainersUnavailable, ValueError) as exc:
            raise UserError(str(exc)) from None

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


@click.group("cluster")
def cluster() -> None:
    """The whole cluster as containers (ZooKeeper nodes, controllers, brokers), through the Docker SDK."""


@cluster.command("build")
@click.option("--base", default=None, show_default="debian:bookworm-slim", help="base image (build argument BASE)")
@click.option("--tag", default="zkcontroller:latest", show_default=True)
@click.option(
    "--ca-bundle",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    show_default="the host's: PIP_CERT, SSL_CERT_FILE, REQUESTS_CA_BUNDLE, else /etc/ssl/certs/ca-certificates.crt",
    help="CA bundle for pip inside the build, behind a TLS-intercepting proxy",
)
@pass_ctx
@_guard
def cluster_build(ctx: Ctx, base: str | None, tag: str, ca_bundle: str | None) -> None:
    """Build the zkcontroller image from this source tree."""
    result = _containers().build_image(
        tag, base, ca_bundle, echo=lambda line: None if ctx.json_out else click.echo(line)
    )
    ctx.emit(result, f"built {result['tag']} ({result['id']}, {result['size_mb']} MB) in {result['seconds']}s")


@cluster.command("up")
@click.option("--docker", "use_docker", is_flag=True, required=True, help="run the cluster as Docker containers")
@click.option("--name", default="zkc", show_default=True, help="cluster name: prefix of every container")
@click.option("--zk-nodes", type=click.IntRange(1, 7), default=3, show_default=True)
@click.option("--controllers", type=click.IntRange(1, 5), default=2, show_default=True)
@click.option("--brokers", type=click.IntRange(1, 50), default=3, show_default=True)
@click.option("--runner", type=click.Choice(["noop", "spark"]), default="spark", show_default=True)
@click.option("--image", default="zkcontroller:latest", show_default=True)
@click.option(
    "--spark-masters",
    type=click.IntRange(0, 5),
    default=0,
    show_default=True,
    help="Spark standalone masters in HA (ZooKeeper recovery under ROOT/spark); 0: each broker's local Spark",
)
@click.option("--spark-workers", type=click.IntRange(1, 20), default=1, show_default=True, help="with --spark-masters")
@click.option(
    "--spark-cores", type=click.IntRange(1, 64), default=1, show_default=True, help="cores a Spark worker offers"
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="a host directory shared by brokers and Spark workers as /data/checkpoints (NFS, say); else a volume",
)
@pass_ctx
@_guard
def cluster_up(
    ctx: Ctx,
    use_docker: bool,
    name: str,
    zk_nodes: int,
    controllers: int,
    brokers: int,
    runner: str,
    image: str,
    spark_masters: int,
    spark_workers: int,
    spark_cores: int,
    data_dir: str | None,
) -> None:
    """Start the cluster (restart policy always, host networking); returns once ZooKeeper answers and
    every broker is registered. With --spark-masters, Spark in HA too, the brokers submitting to its masters.
    -o json prints {zk, root, containers, brokers, seconds, spark_master}."""
    c = _containers()
    spec = c.ClusterSpec(
        name=name,
        zk_nodes=zk_nodes,
        controllers=controllers,
        brokers=brokers,
        runner=runner,
        image=image,
        root=ctx.layout.root,
        data_dir=os.path.abspath(data_dir) if data_dir else None,
        spark_masters=spark_masters,
        spark_workers=spark_workers,
        spark_cores=spark_cores,
    )
    info = c.up(spec, echo=lambda line: None if ctx.json_out else click.echo(line))
    ctx.emit(
        {
            "zk": info.zk,
            "root": info.root,
            "containers": info.containers,
            "brokers": info.brokers,
            "seconds": info.seconds,
            "spark_master": info.spark_master,
            "spark_uis": info.spark_uis,
        },
        f"cluster {name} up in {info.seconds}s: {len(info.containers)} containers, Spark {info.spark_master}\n"
        f"  export ZKC_ZK={info.zk} ZKC_ROOT={info.root}",
    )


@cluster.command("ps")
@click.option("--name", default=None, show_default="all", help="one cluster")
@pass_ctx
@_guard
def cluster_ps(ctx: Ctx, name: str | None) -> None:
    """The containers of a cluster: role, state, health, restarts."""
    rows = _containers().ps(name)
    ctx.emit(
        rows,
        table(
            ["NAME", "CLUSTER", "ROLE", "STATUS", "HEALTH", "RESTARTS"],
            [[r["name"], r["cluster"], r["role"], r["status"], r["health"], r["restarts"]] for r in rows],
        )
        if rows
        else "no containers",
    )


@cluster.command("upgrade")
@click.option("--image", required=True, help="the image every broker container moves to")
@click.option("--name", default="zkc", show_default=True)
@click.option("--group", "group_name", default="default", show_default=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="brokers down at a time")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300.0,
    show_default=True,
    help="seconds a broker may take to come back before the roll pauses itself",
)
@click.option(
    "--logs-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="keep each replaced container's log here (removing a container removes its log)",
)
@click.option(
    "--move-first/--in-place",
    default=True,
    show_default=True,
    help="the first broker's tasks move away before its container is replaced, or wait for its restart",
)
@pass_ctx
@_guard
def cluster_upgrade(
    ctx: Ctx,
    image: str,
    name: str,
    group_name: str,
    batch: int,
    timeout: float,
    logs_dir: str | None,
    move_first: bool,
) -> None:
    """Roll the cluster's brokers to IMAGE with the controller's planned roll: each broker's tasks move to
    brokers already rolled, then its container is replaced by one of IMAGE (same name and broker id)."""
    out = _containers().upgrade(
        name,
        image,
        ctx.hosts,
        ctx.layout.root,
        group=group_name,
        batch=batch,
        timeout=timeout,
        echo=lambda line: None if ctx.json_out else click.echo(line),
        logs_dir=logs_dir,
        in_place=not move_first,
    )
    ctx.emit(out, f"cluster {name}: {len(out['brokers'])} brokers on {image}, {out['moves']} task moves")


@cluster.command("down")
@click.option("--name", default="zkc", show_default=True)
@click.option("--volumes", is_flag=True, help="also remove the cluster's volumes (checkpoints, state)")
@pass_ctx
@_guard
def cluster_down(ctx: Ctx, name: str, volumes: bool) -> None:
    """Remove every container of the cluster (volumes only with --volumes)."""
    result = _containers().down(name, volumes)
    ctx.emit(
        result,
        f"removed {len(result['containers'])} containers"
        + (f" and {len(result['volumes'])} volumes" if volumes else "")
        + f" of cluster {name}",
    )


@cluster.command("chaos")
@click.option("--name", default="zkc-chaos", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--duration", type=click.FloatRange(1, 86400), default=60, show_default=True, help="seconds of faults")
@click.option("--zk-nodes", type=click.IntRange(1, 7), default=3, show_default=True)
@click.option("--controllers", type=click.IntRange(1, 5), default=2, show_default=True)
@click.option("--brokers", type=click.IntRange(2, 50), default=3, show_default=True)
@click.option("--tasks", type=click.IntRange(1, 10_000), default=12, show_default=True)
@click.option(
    "--pipelines",
    type=click.IntRange(0, 20),
    default=0,
    show_default=True,
    help="run that many streaming Spark pipelines (spark brokers) instead of no-op tasks, and check every "
    "sink holds every record exactly once",
)
@click.option(
    "--records",
    type=click.IntRange(1, 10_000_000),
    default=1200,
    show_default=True,
    help="records per pipeline, written during the faults",
)
@click.option("--image", default="zkcontroller:latest", show_default=True)
@click.option("--keep", is_flag=True, help="leave the containers up afterwards")
@click.option(
    "--leave-out",
    "leave_out",
    multiple=True,
    metavar="KIND",
    help="a fault kind this engine cannot inject (e.g. pause-broker where docker pause cannot freeze); repeatable",
)
@pass_ctx
@_guard
def cluster_chaos(
    ctx: Ctx,
    name: str,
    seed: int,
    duration: float,
    zk_nodes: int,
    controllers: int,
    brokers: int,
    tasks: int,
    pipelines: int,
    records: int,
    image: str,
    keep: bool,
    leave_out: tuple[str, ...],
) -> None:
    """Seeded container faults (docker kill then start, kill -9 of the process, pause/unpause, restart of
    brokers, controllers and ZooKeeper nodes) against a fresh cluster, then the independent check: no task
    ever on two brokers at once, every container back, every task running, every sink exactly once.
    Exit 1 on a violation."""
    c, cc = _containers(), _container_chaos()
    if set(leave_out) - set(cc.CONTAINER_FAULTS) or set(leave_out) >= set(cc.CONTAINER_FAULTS):
        raise UserError(f"--leave-out takes some of: {', '.join(cc.CONTAINER_FAULTS)}")
    work = tempfile.mkdtemp(prefix=f"zkc-{name}-")
    spec = c.ClusterSpec(
        name=name,
        zk_nodes=zk_nodes,
        controllers=controllers,
        brokers=brokers,
        runner="spark" if pipelines else "noop",
        image=image,
        root=ctx.layout.root,
        journal_dir=os.path.join(work, "journal"),
        data_dir=os.path.join(work, "data") if pipelines else None,
    )
    echo = (lambda line: None) if ctx.json_out else click.echo
    try:
        summary = cc.chaos(
            spec,
            seed,
            duration,
            tasks=tasks,
            echo=echo,
            pipelines=pipelines,
            records=records,
            leave_out=frozenset(leave_out),
        )
    finally:
        if not keep:
            c.down(name, volumes=True)
    ctx.emit(summary.to_dict(), "\n".join(cc.summary_lines(summary)))
    if not summary.ok:
        raise SystemExit(1)


@click.command("health")
@click.option(
    "--role",
    envvar="ZKC_ROLE",
    required=True,
    type=click.Choice(["zk", "controller", "broker", "api"]),
    help="what this container runs (env ZKC_ROLE)",
)
@pass_ctx
def health(ctx: Ctx, role: str) -> None:
    """Exit 0 if this container's process does its job: ZooKeeper answers ruok (zk), the cluster's
    ZooKeeper answers (controller), our broker id is registered (broker), /healthz answers (api)."""
    from controller.zk.server import four_letter_word

    if role == "zk":
        port = int(os.environ.get("ZKC_ZK_PORT", "2181"))
        if four_letter_word("127.0.0.1", port, "ruok") != "imok":
            raise UserError(f"ZooKeeper on port {port} does not answer ruok")
    elif role == "controller":
        ctx.client().exists(ctx.layout.controller_epoch)
    elif role == "broker":
        broker = os.environ.get("ZKC_BROKER_ID", "")
        if not broker or ctx.client().exists(ctx.layout.broker(broker)) is None:
            raise UserError(f"broker {broker or '(ZKC_BROKER_ID unset)'} is not registered")
    elif role == "api":
        api_port = os.environ.get("ZKC_API_PORT", "8083")
        with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/healthz", timeout=4) as r:
            if json.loads(r.read()).get("zookeeper") != "connected":
                raise UserError("the API's ZooKeeper session is not connected")
    click.echo("ok")
