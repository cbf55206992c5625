"""``zkctl``: the operator's command line. Commands parse and print; the libraries do the work.

Exit codes: 0 success, 1 user error (one line, no traceback), 2 usage error (click's own).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from controller.codecs import PayloadError
from controller.layout import DEFAULT_ROOT, InvalidName, ZkLayout
from controller.zkclient import DEFAULT_HOSTS, ZkSettings, make_client, settings_from_env
from controller.zkserver import ZooKeeperServer, ZooKeeperSetupError

DEFAULT_STATE_DIR = ".zkc"


class UserError(click.ClickException):
    """A mistake by the operator or a missing resource: printed as one line, exit code 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


@dataclass
class Ctx:
    hosts: str
    root: str
    json_out: bool
    verbose: int
    state_dir: Path
    _client: Any = field(default=None, repr=False)

    @property
    def layout(self) -> ZkLayout:
        return ZkLayout(self.root)

    @property
    def settings(self) -> ZkSettings:
        return settings_from_env(hosts=self.hosts, root=self.root)

    def client(self):
        if self._client is None:
            try:
                self._client = make_client(self.settings, timeout=float(os.environ.get("ZKC_CONNECT_TIMEOUT", "10")))
            except Exception as exc:  # kazoo raises its own timeout types
                raise UserError(f"cannot connect to ZooKeeper at {self.hosts}: {exc or type(exc).__name__}") from None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None

    def emit(self, obj: Any, human: str | None = None) -> None:
        if self.json_out or human is None:
            click.echo(json.dumps(obj, indent=None if self.json_out else 2, sort_keys=True, default=str))
        else:
            click.echo(human)


pass_ctx = click.make_pass_decorator(Ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--zk", "hosts", envvar="ZKC_ZK", default=DEFAULT_HOSTS, show_default=True, help="ZooKeeper hosts (env ZKC_ZK)")
@click.option("--zk-root", "root", envvar="ZKC_ROOT", default=DEFAULT_ROOT, show_default=True, help="root znode of this cluster (env ZKC_ROOT)")
@click.option("--json", "json_out", is_flag=True, help="machine-readable output")
@click.option("-v", "--verbose", count=True, help="more logging (-vv for debug)")
@click.option("--state-dir", envvar="ZKC_STATE_DIR", default=DEFAULT_STATE_DIR, show_default=True, type=click.Path(path_type=Path),
              help="where local processes keep data, logs and pid files (env ZKC_STATE_DIR)")
@click.version_option(package_name="zkcontroller")
@click.pass_context
def cli(ctx: click.Context, hosts: str, root: str, json_out: bool, verbose: int, state_dir: Path) -> None:
    """zkcontroller: a ZooKeeper-backed controller for a fleet of Spark pipeline workers."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        ZkLayout(root)
    except InvalidName as exc:
        raise click.BadParameter(str(exc), param_hint="--zk-root") from None
    obj = Ctx(hosts=hosts, root=root, json_out=json_out, verbose=verbose, state_dir=state_dir)
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
@pass_ctx
def zk_start(ctx: Ctx, port: int | None, data_dir: Path | None) -> None:
    """Start a standalone ZooKeeper (detached) and wait until it answers."""
    server = _server(ctx, port, data_dir)
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


@cli.command("demo")
@pass_ctx
def demo(ctx: Ctx) -> None:
    """Run the demo on an embedded ZooKeeper (stops everything it started)."""
    from cli.demo import run_foundation_demo

    raise SystemExit(run_foundation_demo(ctx.state_dir, ctx.root))


def main() -> None:
    try:
        cli(prog_name="zkctl")
    except PayloadError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
