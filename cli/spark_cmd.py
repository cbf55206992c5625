"""``zkctl spark``: Spark standalone in high availability on the cluster's own ZooKeeper, for a local try-out."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from cli.common import Ctx, UserError, pass_ctx


@click.group("spark")
def spark() -> None:
    """Spark standalone masters in ZooKeeper recovery mode and workers, as processes on this machine."""


@spark.command("up")
@click.option("--masters", type=click.IntRange(1, 5), default=2, show_default=True, help="Spark masters")
@click.option("--workers", type=click.IntRange(0, 8), default=1, show_default=True, help="Spark workers")
@click.option("--cores", type=click.IntRange(1, 64), default=1, show_default=True, help="cores a worker offers")
@click.option("--memory", default="1g", show_default=True, help="memory a worker offers its executors")
@click.option("--host", default="127.0.0.1", show_default=True, help="the address the daemons bind and announce")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    show_default="STATE_DIR/spark",
    help="logs and the workers' scratch space",
)
@pass_ctx
def up(ctx: Ctx, masters: int, workers: int, cores: int, memory: str, host: str, work_dir: Path | None) -> None:
    """Start MASTERS Spark masters in ZooKeeper recovery mode on the cluster's ensemble (state under
    ROOT/spark) and WORKERS workers, print the master URL for brokers (--spark-master), and run until
    interrupted; then stop every one by its pid. A master killed outright is replaced by a standby once its
    ZooKeeper session expires (60 s in Spark, capped by the server's maxSessionTimeout)."""
    from broker_sim.deploy.spark_ha import SparkHA, SparkHAError, SparkHASpec
    from broker_sim.runners.spark_session import SparkSetupError

    try:
        spec = SparkHASpec(
            zk_hosts=ctx.hosts,
            root=ctx.root,
            workdir=work_dir or ctx.state_dir / "spark",
            masters=masters,
            workers=workers,
            worker_cores=cores,
            worker_memory=memory,
            host=host,
        )
        ha = SparkHA(spec).start()
    except (SparkHAError, SparkSetupError) as exc:
        raise UserError(str(exc)) from None
    try:
        active = ha.active()
        ctx.emit(
            {"url": ha.url, "active": active.name if active else None, "workers": ha.alive_workers()},
            f"Spark masters {ha.url} (active: {active.name if active else '-'}), {ha.alive_workers()} worker(s); "
            f"brokers: zkctl broker run --runner spark --spark-master {ha.url}\nCtrl-C stops them.",
        )
        stop = threading.Event()
        while not stop.wait(1.0):  # until Ctrl-C or SIGTERM (raised as KeyboardInterrupt), or no master is left
            if not any(m.alive() for m in ha.masters):
                raise UserError("every Spark master exited; see their logs in " + str(ha.dir))
    except KeyboardInterrupt:
        pass
    finally:
        ha.stop()
