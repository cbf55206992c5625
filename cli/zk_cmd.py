"""``zkctl zk``: the embedded ZooKeeper server (start, stop, status) and inspection of the tree (ls, tree,
get). Paths not starting with ``/`` are under the cluster root (``zk get controller``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from cli.common import Ctx, UserError, pass_ctx, printable, table
from controller.zk.server import ZooKeeperServer, ZooKeeperSetupError


@click.group("zk")
def zk() -> None:
    """The embedded ZooKeeper server, and inspection of the tree."""


#: ``zk status`` exit codes: 0 running, 3 not running (as ``systemctl status``/LSB say of a stopped service)
STATUS_NOT_RUNNING = 3


def _configured_port(data: Path) -> int | None:
    try:
        lines = (data / "zoo.cfg").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("clientPort=") and line.split("=", 1)[1].strip().isdigit():
            return int(line.split("=", 1)[1])
    return None


def _server(ctx: Ctx, port: int | None, data_dir: Path | None) -> ZooKeeperServer:
    data = data_dir or ctx.state_dir / "zookeeper"
    if port is None:
        port = _configured_port(data) or 2181
    return ZooKeeperServer(data_dir=data, port=port)


def _find_server(ctx: Ctx, data_dir: Path | None) -> tuple[ZooKeeperServer, str]:
    """The server ``zk stop|status`` mean, and where we looked: ``--data-dir``; else the state dir's; else the one
    running server that ``zk start`` recorded (started from another directory)."""
    from cli.zk_servers import record_file, running_servers

    server = _server(ctx, None, data_dir)
    if data_dir is not None or server.is_running():
        return server, f"data dir {server.data_dir}"
    recorded = running_servers()
    if len(recorded) == 1:
        return recorded[0], f"data dir {recorded[0].data_dir} (recorded in {record_file()})"
    if len(recorded) > 1:
        raise UserError(
            f"no ZooKeeper runs with data dir {server.data_dir}, and {len(recorded)} others do: "
            + ", ".join(f"{s.data_dir} (port {s.port})" for s in recorded)
            + "; give --data-dir"
        )
    return server, f"data dir {server.data_dir.resolve()} and the servers recorded in {record_file()}"


def resolve_path(ctx: Ctx, path: str | None) -> str:
    """An absolute znode path: ``path`` as given if it starts with ``/``, else under the cluster root (which
    must have been set up)."""
    relative = not path or not path.startswith("/")
    if not path:
        path = ctx.layout.root
    elif relative:
        path = ctx.layout.root.rstrip("/") + "/" + path
    parts = path.split("/")[1:]
    if path != "/" and (any(p in ("", ".", "..") for p in parts) or len(path) > 4096):
        raise click.BadParameter(f"{path!r} is not a znode path (no empty, . or .. parts)", param_hint="PATH")
    if relative:
        ctx.require_root()  # under a root never set up: say so, not "no znode"
    return path


@zk.command("start")
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    show_default="2181, or the port in the data dir's zoo.cfg",
    help="client port",
)
@click.option(
    "--data-dir", type=click.Path(path_type=Path), default=None, show_default="STATE_DIR/zookeeper", help="data dir"
)
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
    running = _refuse_busy(server, port) if not server.peers else None
    try:
        pid = running or server.start()
    except ZooKeeperSetupError as exc:
        raise UserError(str(exc)) from None
    from cli.zk_servers import remember

    remember(server, pid)
    ctx.emit(
        {"pid": pid, "address": server.address, "data_dir": str(server.data_dir), "already_running": bool(running)},
        f"ZooKeeper {'already ' if running else ''}running on {server.address} (pid {pid}, data in {server.data_dir})",
    )


def _refuse_busy(server: ZooKeeperServer, port: int | None) -> int | None:
    """At once, not after a minute of waiting: the data dir is in use (by a server on another port), or the
    port is taken by another process. A server already running as asked is a success: its pid."""
    from cli.connect import probe

    pid = server.read_pid()
    if server.is_running() and pid is not None:
        running_port = _configured_port(server.data_dir) or server.port
        if port is not None and port != running_port:
            raise UserError(
                f"ZooKeeper already runs with data dir {server.data_dir} (pid {pid}, port {running_port}); "
                f"stop it first (zkctl zk stop --data-dir {server.data_dir}) or give another --data-dir"
            )
        return pid
    if probe(server.host, server.port, 0.5).outcome == "open":
        raise UserError(
            f"port {server.port} on {server.host} is in use by another process (not a ZooKeeper started with "
            f"data dir {server.data_dir}); give --port, or point --zk at the server there"
        )
    return None


@zk.command("stop")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    show_default="STATE_DIR/zookeeper, else the one server zk start recorded",
    help="the server's data dir",
)
@pass_ctx
def zk_stop(ctx: Ctx, data_dir: Path | None) -> None:
    """Stop the embedded ZooKeeper started by zk start (by its pid), from any directory."""
    from cli.zk_servers import forget

    server, looked = _find_server(ctx, data_dir)
    stopped = server.stop()
    forget(server)
    ctx.emit(
        {"stopped": stopped, "data_dir": str(server.data_dir)},
        f"ZooKeeper stopped (data dir {server.data_dir})"
        if stopped
        else f"ZooKeeper was not running (looked in {looked})",
    )


@zk.command("status")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    show_default="STATE_DIR/zookeeper, else the one server zk start recorded",
    help="the server's data dir",
)
@pass_ctx
def zk_status(ctx: Ctx, data_dir: Path | None) -> None:
    """Is the embedded ZooKeeper running, and is it serving? Exit 0 if it runs, 3 if it does not."""
    server, looked = _find_server(ctx, data_dir)
    st = server.status()
    human = (
        f"running pid {st['pid']} on {st['address']}, mode {st['mode']}, version {st['version']}"
        if st["running"]
        else f"not running (looked in {looked})"
    )
    ctx.emit(st, human)
    if not st["running"]:
        sys.exit(STATUS_NOT_RUNNING)


@zk.command("ls")
@click.argument("path", required=False)
@pass_ctx
def zk_ls(ctx: Ctx, path: str | None) -> None:
    """The children of PATH (default: the cluster root), one per line, sorted."""
    path = resolve_path(ctx, path)
    client = ctx.client()
    from kazoo.exceptions import NoNodeError

    from controller.zk.io import WAIT_S

    try:
        names = sorted(client.get_children(path))
    except NoNodeError:
        raise UserError(f"no znode at {path}") from None
    base = path.rstrip("/")
    if ctx.json_out or ctx.wide:
        pending = [(n, client.exists_async(f"{base}/{n}")) for n in names]
        rows = []
        for n, result in pending:
            try:
                stat = result.get(timeout=WAIT_S)
            except NoNodeError:  # deleted meanwhile
                continue
            if stat is not None:
                rows.append(
                    {
                        "name": n,
                        "path": f"{base}/{n}",
                        "children": stat.numChildren,
                        "bytes": stat.dataLength,
                        "ephemeral": bool(stat.ephemeralOwner),
                    }
                )
        if ctx.json_out:
            ctx.emit(rows)
            return
        click.echo(
            table(
                ["NAME", "CHILDREN", "BYTES", "EPHEMERAL"],
                [[r["name"], r["children"], r["bytes"], r["ephemeral"]] for r in rows],
            )
        )
        return
    for n in names:
        click.echo(printable(n, lines=False))


@zk.command("tree")
@click.argument("path", required=False)
@click.option("--depth", type=click.IntRange(0, 64), default=32, show_default=True, help="levels below PATH")
@click.option("--all", "show_all", is_flag=True, help="also the empty task and status buckets (hidden otherwise)")
@pass_ctx
def zk_tree(ctx: Ctx, path: str | None, depth: int, show_all: bool) -> None:
    """Print the znode tree under PATH (default: the cluster root)."""
    path = resolve_path(ctx, path)
    ctx.start_client()
    from controller.admin import AdminError, walk  # imported while the session is being set up
    from controller.protocol.cluster.layout import is_bucket

    try:
        nodes = walk(ctx.client(), path, max_depth=depth)
    except AdminError as exc:
        raise UserError(str(exc)) from None
    hidden = 0
    if not show_all:
        kept = [(d, p, s) for d, p, s in nodes if not (d and s.numChildren == 0 and is_bucket(p.rsplit("/", 1)[-1]))]
        hidden, nodes = len(nodes) - len(kept), kept
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
    if hidden:
        click.echo(f"({hidden} empty buckets not shown; --all shows them)")


@zk.command("get")
@click.argument("path")
@click.option("--raw", is_flag=True, help="print the bytes as stored")
@pass_ctx
def zk_get(ctx: Ctx, path: str, raw: bool) -> None:
    """Show one znode decoded with our codecs, with its stat."""
    path = resolve_path(ctx, path)
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
