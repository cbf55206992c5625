"""``zkctl zk``: the embedded ZooKeeper server (start, stop, status) and inspection of the tree (tree, get)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from cli.common import Ctx, UserError, pass_ctx, printable
from controller.zk.server import ZooKeeperServer, ZooKeeperSetupError


@click.group("zk")
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
@click.option(
    "--server-id",
    type=click.IntRange(1, 255),
    envvar="ZKC_ZK_SERVER_ID",
    default=None,
    help="this server's id in an ensemble (env ZKC_ZK_SERVER_ID)",
)
@click.option(
    "--ensemble",
    envvar="ZKC_ZK_ENSEMBLE",
    default=None,
    metavar="ID=HOST:CLIENT:QUORUM:ELECTION,...",
    help="every member of the ensemble (env ZKC_ZK_ENSEMBLE); needs --server-id",
)
@pass_ctx
def zk_start(
    ctx: Ctx, port: int | None, data_dir: Path | None, foreground: bool, server_id: int | None, ensemble: str | None
) -> None:
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
        click.echo(
            f"ZooKeeper {'server ' + str(server.server_id) + ' of ' + str(len(server.peers)) if server.peers else 'standalone'}"
            f" on port {server.port}, data in {server.data_dir} (foreground)"
        )
        sys.stdout.flush()
        os.execv(cmd[0], cmd)  # the JVM takes this process's place: signals from the supervisor reach it
    try:
        pid = server.start()
    except ZooKeeperSetupError as exc:
        raise UserError(str(exc)) from None
    ctx.emit(
        {"pid": pid, "address": server.address, "data_dir": str(server.data_dir)},
        f"ZooKeeper running on {server.address} (pid {pid}, data in {server.data_dir})",
    )


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
    human = (
        f"running pid {st['pid']} on {st['address']}, mode {st['mode']}, version {st['version']}"
        if st["running"]
        else f"not running (data dir {st['data_dir']})"
    )
    ctx.emit(st, human)
    if not st["running"]:
        sys.exit(3)


@zk.command("tree")
@click.argument("path", required=False)
@click.option("--depth", type=click.IntRange(0, 64), default=32, show_default=True)
@pass_ctx
def zk_tree(ctx: Ctx, path: str | None, depth: int) -> None:
    """Print the znode tree under PATH (default: the cluster root)."""
    ctx.start_client()
    from controller.admin import AdminError, walk  # imported while the session is being set up

    path = path or ctx.layout.root
    try:
        nodes = walk(ctx.client(), path, max_depth=depth)
    except AdminError as exc:
        raise UserError(str(exc)) from None
    if ctx.json_out:
        ctx.emit(
            [
                {
                    "path": p,
                    "depth": d,
                    "ephemeral": bool(s.ephemeralOwner),
                    "children": s.numChildren,
                    "bytes": s.dataLength,
                }
                for d, p, s in nodes
            ]
        )
        return
    for d, p, s in nodes:
        name = p if d == 0 else p.rsplit("/", 1)[-1]
        tag = " (ephemeral)" if s.ephemeralOwner else ""
        # a name is anyone's data (whoever may create there chose it): escaped, and a long one cut
        shown = printable(name if len(name) <= 200 else f"{name[:200]}... ({len(name)} characters)", lines=False)
        click.echo(f"{'  ' * d}{shown}{tag}  [{s.dataLength}B]")


@zk.command("get")
@click.argument("path")
@click.option("--raw", is_flag=True, help="print the bytes as stored")
@pass_ctx
def zk_get(ctx: Ctx, path: str, raw: bool) -> None:
    """Show one znode decoded with our codecs, with its stat."""
    ctx.start_client()
    from controller.admin import AdminError, ZkInspector  # imported while the session is being set up

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
