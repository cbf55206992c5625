"""``zkctl``: the operator's command line. Commands parse and print; the libraries do the work
(``controller.admin.AdminClient`` for everything that talks to the cluster).

Exit codes: 0 success, 1 user error (one line on stderr, no traceback), 2 usage error (click's own).
Topic modules register their commands here: ``cli.tasks`` (task ...), ``cli.cluster`` (status, broker,
group, rebalance, watch), ``cli.run`` (controller run, broker run), ``cli.timeline``; ``cli.datagen``
and ``cli.sim_cmd`` (sim) are registered when present.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

import click

from cli.common import Ctx, UserError, ZkctlGroup, pass_ctx, resolve_auth, user_message
from controller.protocol.layout import DEFAULT_ROOT, InvalidName, ZkLayout
from controller.zk.client import DEFAULT_HOSTS
from controller.zk.server import ZooKeeperServer, ZooKeeperSetupError

DEFAULT_STATE_DIR = ".zkc"


@click.group(cls=ZkctlGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--zk", "hosts", envvar="ZKC_ZK", default=DEFAULT_HOSTS, show_default=True, help="ZooKeeper hosts (env ZKC_ZK)")
@click.option("--zk-root", "root", envvar="ZKC_ROOT", default=DEFAULT_ROOT, show_default=True, help="root znode of this cluster (env ZKC_ROOT)")
@click.option("--json", "json_out", is_flag=True, help="machine-readable output")
@click.option("-v", "--verbose", count=True, help="more logging (-vv for debug)")
@click.option("--state-dir", envvar="ZKC_STATE_DIR", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path),
              help="where local processes keep data, logs and pid files (env ZKC_STATE_DIR)")
@click.option("--zk-auth", "zk_auth", default=None, metavar="env:NAME|file:PATH",
              help="where ZooKeeper digest credentials (user:password) come from, never the credentials themselves "
                   "[default: env ZKC_AUTH, else the file named by ZKC_AUTH_FILE]")
@click.option("--zk-auth-file", "zk_auth_file", default=None, type=click.Path(dir_okay=False),
              help="file holding the digest credentials user:password (same as --zk-auth file:PATH)")
@click.version_option(package_name="zkcontroller")
@click.pass_context
def cli(ctx: click.Context, hosts: str, root: str, json_out: bool, verbose: int, state_dir: Path,
        zk_auth: str | None, zk_auth_file: str | None) -> None:
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
    obj = Ctx(hosts=hosts, root=root, json_out=json_out, verbose=verbose, state_dir=state_dir,
              auth=resolve_auth(zk_auth, zk_auth_file))
    ctx.obj = obj
    ctx.call_on_close(obj.close)


# ---- zk ------------------------------------------------------------------------------------------
@cli.group()
def zk() -> None:
    """The embedded ZooKeeper server, and inspection of the tree."""


def _server(ctx: Ctx, port: int | None, data_dir: Path | None) -> ZooKeeperServer:
    data = data_dir or ctx.state_dir / "zookeeper"
    if port is None:
        cfg = data / "zoo.cfg"
        port = 2181
        if cfg.exists():
            for line in cfg.read_text().splitlines():
                if line.startswith("clientPort="):
                    port = int(line.split("=", 1)[1])
    return ZooKeeperServer(data_dir=data, port=port)


@zk.command("start")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="client port [2181]")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="data dir [STATE_DIR/zookeeper]")
@click.option("--foreground", is_flag=True, help="run in this process (containers, supervisors) instead of detached")
@click.option("--server-id", type=click.IntRange(1, 255), envvar="ZKC_ZK_SERVER_ID", default=None,
              help="this server's id in an ensemble (env ZKC_ZK_SERVER_ID)")
@click.option("--ensemble", envvar="ZKC_ZK_ENSEMBLE", default=None, metavar="ID=HOST:CLIENT:QUORUM:ELECTION,...",
              help="every member of the ensemble (env ZKC_ZK_ENSEMBLE); needs --server-id")
@pass_ctx
def zk_start(ctx: Ctx, port: int | None, data_dir: Path | None, foreground: bool, server_id: int | None,
             ensemble: str | None) -> None:
    """Start a ZooKeeper server from the jars inside pyspark: standalone, or one member of an ensemble;
    detached (waits until it answers) or, with --foreground, in this process."""
    from controller.zk.server import parse_ensemble

    server = _server(ctx, port, data_dir)
    if ensemble is not None or server_id is not None:
        if ensemble is None or server_id is None:
            raise click.UsageError("--ensemble and --server-id go together")
        try:
            peers, hosts = parse_ensemble(ensemble)
        except ZooKeeperSetupError as exc:
            raise click.BadParameter(str(exc), param_hint="--ensemble") from None
        if server_id not in peers:
            raise click.BadParameter(f"server id {server_id} is not in the ensemble", param_hint="--server-id")
        server.server_id, server.peers, server.peer_hosts = server_id, peers, hosts
        server.port = peers[server_id][0]
        server.host = "127.0.0.1" if all(h in ("127.0.0.1", "localhost") for h in hosts.values()) else hosts[server_id]
    if foreground:
        try:
            cmd = server.command()
        except ZooKeeperSetupError as exc:
            raise UserError(str(exc)) from None
        click.echo(f"ZooKeeper {'server ' + str(server.server_id) + ' of ' + str(len(server.peers)) if server.peers else 'standalone'}"
                   f" on port {server.port}, data in {server.data_dir} (foreground)")
        sys.stdout.flush()
        os.execv(cmd[0], cmd)  # the JVM takes this process's place: signals from the supervisor reach it
    try:
        pid = server.start()
    except ZooKeeperSetupError as exc:
        raise UserError(str(exc)) from None
    ctx.emit({"pid": pid, "address": server.address, "data_dir": str(server.data_dir)},
             f"ZooKeeper running on {server.address} (pid {pid}, data in {server.data_dir})")


@zk.command("stop")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@pass_ctx
def zk_stop(ctx: Ctx, data_dir: Path | None) -> None:
    """Stop the embedded ZooKeeper started by `zk start` (by its pid)."""
    server = _server(ctx, None, data_dir)
    stopped = server.stop()
    ctx.emit({"stopped": stopped}, "ZooKeeper stopped" if stopped else "ZooKeeper was not running")


@zk.command("status")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None)
@pass_ctx
def zk_status(ctx: Ctx, data_dir: Path | None) -> None:
    """Is the embedded ZooKeeper running, and is it serving?"""
    st = _server(ctx, None, data_dir).status()
    human = (f"running pid {st['pid']} on {st['address']}, mode {st['mode']}, version {st['version']}"
             if st["running"] else f"not running (data dir {st['data_dir']})")
    ctx.emit(st, human)
    if not st["running"]:
        sys.exit(3)


@zk.command("tree")
@click.argument("path", required=False)
@click.option("--depth", type=click.IntRange(0, 64), default=32, show_default=True)
@pass_ctx
def zk_tree(ctx: Ctx, path: str | None, depth: int) -> None:
    """Print the znode tree under PATH (default: the cluster root)."""
    from controller.admin import AdminError, walk

    path = path or ctx.layout.root
    try:
        nodes = walk(ctx.client(), path, max_depth=depth)
    except AdminError as exc:
        raise UserError(str(exc)) from None
    if ctx.json_out:
        ctx.emit([{"path": p, "depth": d, "ephemeral": bool(s.ephemeralOwner), "children": s.numChildren,
                   "bytes": s.dataLength} for d, p, s in nodes])
        return
    for d, p, s in nodes:
        name = p if d == 0 else p.rsplit("/", 1)[-1]
        tag = " (ephemeral)" if s.ephemeralOwner else ""
        click.echo(f"{'  ' * d}{name}{tag}  [{s.dataLength}B]")


@zk.command("get")
@click.argument("path")
@click.option("--raw", is_flag=True, help="print the bytes as stored")
@pass_ctx
def zk_get(ctx: Ctx, path: str, raw: bool) -> None:
    """Show one znode decoded with our codecs, with its stat."""
    from controller.admin import AdminError, ZkInspector

    try:
        view = ZkInspector(ctx.client(), ctx.layout).get(path)
    except AdminError as exc:
        raise UserError(str(exc)) from None
    if raw:
        sys.stdout.buffer.write(view.data)
        if not view.data.endswith(b"\n"):
            sys.stdout.buffer.write(b"\n")
        return
    out = {"path": view.path, "stat": view.stat_dict(), "data": view.decoded, "error": view.error}
    if view.decoded is None and view.error is None:
        out["data"] = view.data.decode("utf-8", errors="replace")
    ctx.emit(out)
    if view.error:
        click.echo(f"Error: {view.error}", err=True)
        sys.exit(1)


def _demo_command() -> click.Command:
    """``cli/demo.py``'s own click command if it defines one, else a thin wrapper over its runner."""
    try:
        module = importlib.import_module("cli.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "cli.demo":
            raise
        module = None
    command = getattr(module, "demo", None) if module else None
    if isinstance(command, click.Command):
        return command

    @click.command("demo")
    @pass_ctx
    def demo(ctx: Ctx) -> None:
        """Run the demo on an embedded ZooKeeper (stops everything it started)."""
        from cli.demo import run_foundation_demo

        raise SystemExit(run_foundation_demo(ctx.state_dir, ctx.root))

    return demo


def _optional(module_name: str, command_name: str) -> click.Command | None:
    """A command owned by another module, registered if that module exists. If it exists but cannot be
    imported, a stand-in command reports why (one line, exit 1) instead of breaking every other command."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        error = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a colleague's module with a bug must not take zkctl down
        error = f"{type(exc).__name__}: {exc}"
    else:
        command = getattr(module, command_name, None)
        if isinstance(command, click.Command):
            return command
        error = f"{module_name} defines no click command named {command_name!r}"

    @click.command(command_name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   help=f"(unavailable: {error})")
    def unavailable() -> None:
        raise UserError(f"zkctl {command_name} is unavailable: {error}")

    return unavailable


def _register() -> None:
    from cli.cluster import broker, group, rebalance, status, watch
    from cli.operations import maintenance, settings
    from cli.run import broker_run, controller
    from cli.tasks import task
    from cli.timeline import timeline

    broker.add_command(broker_run)
    for command in (task, status, broker, group, rebalance, watch, controller, timeline, maintenance, settings):
        cli.add_command(command)
    cli.lazy["demo"] = _demo_command
    for module_name, command_name in (("cli.datagen", "datagen"), ("cli.sim_cmd", "sim"), ("cli.sim", "sim"),
                                      ("cli.security_cmd", "security"), ("cli.layout_cmd", "layout"), ("cli.api", "api"),
                                      ("cli.containers", "cluster"), ("cli.containers", "health")):
        if command_name not in cli.lazy and importlib.util.find_spec(module_name) is not None:
            cli.lazy[command_name] = lambda m=module_name, c=command_name: _optional(m, c)


_register()


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
