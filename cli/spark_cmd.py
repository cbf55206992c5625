"""``zkctl spark``: Spark standalone in high availability on the cluster's own ZooKeeper, for a local try-out."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import click

from cli.common import Ctx, UserError, pass_ctx
from controller.protocol.errors import ZkcError

log = logging.getLogger(__name__)
SEAL_EVERY_S = 2.0  # how often a secured cluster's <root>/spark is given the policy's ACL again


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
@click.option(
    "--worker-timeout",
    type=click.IntRange(5, 3600),
    default=60,
    show_default=True,
    help="seconds: a silent worker is dead, and a new leader drops the workers and applications silent this long",
)
@click.option(
    "--sasl-auth-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="a secured cluster: file holding the masters' SASL credential user:password (DIGEST-MD5), a user "
    "the policy lists with zkctl security init --spark-user",
)
@pass_ctx
def up(
    ctx: Ctx,
    masters: int,
    workers: int,
    cores: int,
    memory: str,
    host: str,
    work_dir: Path | None,
    worker_timeout: int,
    sasl_auth_file: Path | None,
) -> None:
    """Start MASTERS Spark masters in ZooKeeper recovery mode on the cluster's ensemble (state under
    ROOT/spark) and WORKERS workers, print the master URL for brokers (--spark-master), and run until
    interrupted; then stop every one by its pid. A master killed outright is replaced by a standby once its
    ZooKeeper session expires (60 s in Spark, capped by the server's maxSessionTimeout).

    On a secured cluster, run it with admin credentials and --sasl-auth-file: the masters log in with SASL, and
    every 2 s the znodes Spark created under ROOT/spark (with Curator's open ACL) get the policy's ACL."""
    from broker_sim.deploy.spark_ha import SparkHA, SparkHAError, SparkHASpec, write_client_jaas
    from broker_sim.runners.spark_session import SparkSetupError
    from controller.zk.security import read_credential_file

    workdir = work_dir or ctx.state_dir / "spark"
    try:
        jaas = None
        if sasl_auth_file is not None:
            credential = read_credential_file(str(sasl_auth_file), "--sasl-auth-file")
            jaas = write_client_jaas(workdir / "spark-client.jaas", credential)
        spec = SparkHASpec(
            zk_hosts=ctx.hosts,
            root=ctx.root,
            workdir=workdir,
            masters=masters,
            workers=workers,
            worker_cores=cores,
            worker_memory=memory,
            host=host,
            jaas_file=jaas,
            worker_timeout_s=worker_timeout,
        )
        ha = SparkHA(spec).start()
    except (SparkHAError, SparkSetupError, ZkcError) as exc:
        raise UserError(str(exc)) from None
    try:
        active = ha.active()
        ctx.emit(
            {"url": ha.url, "active": active.name if active else None, "workers": ha.alive_workers()},
            f"Spark masters {ha.url} (active: {active.name if active else '-'}), {ha.alive_workers()} worker(s); "
            f"brokers: zkctl broker run --runner spark --spark-master {ha.url}\nCtrl-C stops them.",
        )
        stop = threading.Event()
        sealed_at = 0.0
        while not stop.wait(1.0):  # until Ctrl-C or SIGTERM (raised as KeyboardInterrupt), or no master is left
            if not any(m.alive() for m in ha.masters):
                raise UserError("every Spark master exited; see their logs in " + str(ha.dir))
            if ctx.settings.auth is not None and time.monotonic() - sealed_at >= SEAL_EVERY_S:
                sealed_at = time.monotonic()
                _seal(ctx)
    except KeyboardInterrupt:
        pass
    finally:
        ha.stop()


def _seal(ctx: Ctx) -> None:
    """The policy's ACL on what Spark created under ROOT/spark (see ``seal_spark``); a failure is logged, the
    masters run on."""
    from kazoo.exceptions import KazooException, NoAuthError, NoNodeError

    from controller.protocol.cluster.acl import AclPolicy
    from controller.zk.security import seal_spark

    client: Any = ctx.client()
    try:
        data, _ = client.get(ctx.layout.security)
        policy = AclPolicy.decode(data)
        fixed = seal_spark(client, ctx.layout, policy)
    except NoNodeError:
        return  # not a secured cluster
    except (NoAuthError, KazooException, ZkcError) as exc:
        log.warning("Spark's znodes not sealed: %s: %s", type(exc).__name__, exc)
        return
    if fixed:
        log.info("the policy's ACL set on %d znode(s) Spark created: %s", len(fixed), ", ".join(fixed[:5]))
