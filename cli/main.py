"""``zkctl``: the operator's command line. Commands parse and print; the libraries do the work
(``controller.admin.AdminClient`` for everything that talks to the cluster).

Exit codes: 0 success, 1 user error (one line on stderr, no traceback), 2 usage error (click's own).
Topic modules define the commands, listed here in ``COMMANDS`` and imported only when used: ``cli.task_cmd``
(task ...), ``cli.cluster`` (status, broker, group, rebalance, watch), ``cli.run`` (controller run, broker
run), ``cli.zk_cmd`` (zk ...), ``cli.timeline``, ``cli.operations``; ``cli.datagen``, ``cli.sim_cmd`` (sim) and
the others marked optional are offered when present. So ``zkctl --version`` and ``zkctl --help`` answer at
once, and a command imports what it needs, no more.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import click

from cli.common import (
    MACHINE_FORMATS,
    Ctx,
    LazyCommand,
    ZkctlGroup,
    output_format,
    output_params,
    resolve_auth,
    user_message,
)
from controller.protocol.cluster.layout import DEFAULT_ROOT, InvalidName, ZkLayout

DEFAULT_STATE_DIR = ".zkc"
#: ``controller.zk.client.DEFAULT_HOSTS``, restated here so that parsing the options imports no kazoo (a test
#: keeps the two equal)
DEFAULT_HOSTS = "127.0.0.1:2181"


@click.group(cls=ZkctlGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option(
    "--zk", "hosts", envvar="ZKC_ZK", default=DEFAULT_HOSTS, show_default=True, help="ZooKeeper hosts (env ZKC_ZK)"
)
@click.option(
    "--zk-root",
    "root",
    envvar="ZKC_ROOT",
    default=DEFAULT_ROOT,
    show_default=True,
    help="root znode of this cluster (env ZKC_ROOT)",
)
@click.option(
    "--connect-timeout",
    envvar="ZKC_CONNECT_TIMEOUT",
    type=click.FloatRange(min=0.1),
    default=None,
    show_default="3; controller, broker and api run: 10",
    help="seconds to reach ZooKeeper before saying why not (env ZKC_CONNECT_TIMEOUT)",
)
@click.option("-v", "--verbose", count=True, help="more logging (-vv for debug)")
@click.option(
    "--state-dir",
    envvar="ZKC_STATE_DIR",
    default=DEFAULT_STATE_DIR,
    show_default=True,
    type=click.Path(path_type=Path),
    help="where local processes keep data, logs and pid files (env ZKC_STATE_DIR)",
)
@click.option(
    "--zk-auth",
    "zk_auth",
    default=None,
    metavar="env:NAME|file:PATH",
    show_default="env ZKC_AUTH, else the file named by ZKC_AUTH_FILE",
    help="where ZooKeeper digest credentials (user:password) come from, never the credentials themselves",
)
@click.option(
    "--zk-auth-file",
    "zk_auth_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="file holding the digest credentials user:password (same as --zk-auth file:PATH)",
)
@click.version_option(package_name="zkcontroller")
@click.pass_context
def cli(
    ctx: click.Context,
    hosts: str,
    root: str,
    connect_timeout: float | None,
    verbose: int,
    state_dir: Path,
    zk_auth: str | None,
    zk_auth_file: str | None,
) -> None:
    """zkcontroller: a ZooKeeper-backed controller for a fleet of Spark pipeline workers."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if verbose == 0:
        logging.getLogger("kazoo").setLevel(logging.ERROR)  # connection chatter on shutdown is not news
    try:
        ZkLayout(root)
    except InvalidName as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-root") from None
    fmt = output_format(ctx)
    obj = Ctx(
        hosts=hosts,
        root=root,
        json_out=fmt in MACHINE_FORMATS,
        output=fmt,
        connect_timeout=connect_timeout or 3.0,
        connect_timeout_given=connect_timeout is not None,
        verbose=verbose,
        state_dir=state_dir,
        auth=resolve_auth(zk_auth, zk_auth_file),
    )
    ctx.obj = obj
    ctx.call_on_close(obj.close)


#: every top-level command, imported when first used: ``zkctl --version`` and ``zkctl --help`` import none of
#: them (nor kazoo, pydantic or the admin library they build on). Each summary is the first sentence of the
#: command's help, which the listing shows (tests/integration/cli/test_cli_errors.py keeps them in step).
COMMANDS: dict[str, LazyCommand] = {
    "init": LazyCommand(
        "cli.init_cmd",
        "init",
        "Set up the cluster root named by --zk-root: its containers and task buckets (idempotent).",
    ),
    "completion": LazyCommand(
        "cli.completion_cmd",
        "completion",
        "Print the shell completion script for SHELL (bash, zsh or fish).",
    ),
    "task": LazyCommand("cli.task_cmd", "task", "Create, inspect and control tasks (pipelines)."),
    "status": LazyCommand("cli.cluster", "status", "The controller, brokers, groups and tasks at a glance."),
    "broker": LazyCommand("cli.cluster", "broker", "Brokers (workers): list them, shut one down, or run one here."),
    "group": LazyCommand("cli.cluster", "group", "Worker groups."),
    "rebalance": LazyCommand(
        "cli.cluster", "rebalance", "Ask the controller for a rebalance of one group or all of them."
    ),
    "watch": LazyCommand(
        "cli.cluster",
        "watch",
        "Print cluster events as they happen (from ZooKeeper watches): controller "
        "changes, brokers joining and leaving, group state/generation changes, tasks "
        "created/deleted/paused/resumed, owner moves.",
    ),
    "controller": LazyCommand("cli.run", "controller", "The controller."),
    "timeline": LazyCommand(
        "cli.timeline",
        "timeline",
        "One row per task, one colour per broker, gaps where nothing ran (double ownership outlined in red).",
    ),
    "maintenance": LazyCommand(
        "cli.operations",
        "maintenance",
        "Maintenance mode: freeze placement cluster-wide while "
        "people work (nothing moves, nothing gains an owner; a lost broker's tasks wait for it).",
    ),
    "settings": LazyCommand(
        "cli.operations",
        "settings",
        "Settings the controller honours live: move throttles, automatic maintenance, preferred placement.",
    ),
    "zk": LazyCommand("cli.zk_cmd", "zk", "The embedded ZooKeeper server, and inspection of the tree."),
    # commands of modules that may be absent (then not offered) or broken (then a stand-in says why)
    "demo": LazyCommand(
        "cli.demo",
        "demo",
        "The whole product on one machine: ZooKeeper, 2 controllers, 3 brokers, 4 "
        "pipelines, faults, a check, and the web console to watch it live.",
        optional=True,
    ),
    "datagen": LazyCommand(
        "cli.datagen",
        "datagen",
        'Write RECORDS numbered JSON records ({"id": n, ...}) into OUT, BATCH per file, each file atomically.',
        optional=True,
    ),
    "sim": LazyCommand(
        "cli.sim_cmd", "sim", "Many brokers in one process, scripted scenarios and failure injection.", optional=True
    ),
    "security": LazyCommand(
        "cli.security_cmd",
        "security",
        "ZooKeeper digest authentication and ACLs (roles: "
        "controller, broker, admin, reader; brokers may each have an identity of their own).",
        optional=True,
    ),
    "layout": LazyCommand(
        "cli.layout_cmd",
        "layout",
        "The root's ZooKeeper layout: task specs and statuses in 256 "
        "buckets each, so that no listing grows past what a ZooKeeper client accepts (1 MiB) at "
        "100,000 tasks and more.",
        optional=True,
    ),
    "api": LazyCommand("cli.api", "api", "The HTTP API (/api/v1) and the web console.", optional=True),
    "spark": LazyCommand(
        "cli.spark_cmd",
        "spark",
        "Spark standalone masters in ZooKeeper recovery mode and workers, as processes on this machine.",
        optional=True,
    ),
    "cluster": LazyCommand(
        "cli.containers",
        "cluster",
        "The whole cluster as containers (ZooKeeper nodes, controllers, brokers), through the Docker SDK.",
        optional=True,
    ),
    "health": LazyCommand(
        "cli.containers",
        "health",
        "Exit 0 if this container's process does its job: ZooKeeper "
        "answers ruok (zk), the cluster's ZooKeeper answers (controller), our broker id is registered "
        "(broker), /healthz answers (api).",
        optional=True,
    ),
}
for _name, _command in COMMANDS.items():
    cli.add_lazy(_name, _command)
cli.params[2:2] = output_params()  # -o/--json: before the command (as here) or after it (given by with_output)


def _terminate_as_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    # SIGTERM ends a command as Ctrl-C does, so its cleanup runs: the embedded ZooKeeper, controllers and brokers
    # a demo or simulation started are stopped by pid, not left running (Python's default for SIGTERM exits
    # without unwinding). Commands that give SIGTERM a meaning of their own (a broker's controlled shutdown,
    # a controller's stop, the API server's graceful stop) install their own handler.
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        cli(prog_name="zkctl")
    except Exception as exc:  # raised outside a command (e.g. while closing the ZooKeeper client)
        message = user_message(exc)
        if message is None:
            raise
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
