"""``zkctl api run``: the HTTP API and the web console, served with uvicorn on one ZooKeeper session."""

from __future__ import annotations

import ipaddress
import signal
from types import FrameType
from typing import Any

import click

from cli.common import Ctx, UserError, pass_ctx

WILDCARDS = ("0.0.0.0", "::", "")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_hosts(bind: str, extra: tuple[str, ...], loopback: frozenset[str]) -> frozenset[str]:
    """The Host names answered: the loopback names, the bind address (unless a wildcard), and ``--allowed-host``."""
    names = set(loopback) | {h.strip().lower() for h in extra if h.strip()}
    if bind not in WILDCARDS:
        names.add(bind.lower() if ":" not in bind else f"[{bind.strip('[]').lower()}]")
    return frozenset(names)


@click.group("api")
def api() -> None:
    """The HTTP API (/api/v1) and the web console."""


@api.command("run")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", type=click.IntRange(0, 65535), default=8083, show_default=True, help="port (0: any free port)")
@click.option(
    "--admin-token",
    "token_source",
    default=None,
    metavar="env:NAME|file:PATH",
    help="where the admin token comes from; when set, writes need 'Authorization: Bearer <token>'",
)
@click.option(
    "--allowed-host",
    "allowed",
    multiple=True,
    metavar="NAME",
    help="a Host name this server answers to besides the bind address and loopback (repeat; '*': any, "
    "for a proxy that checks it)",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="bind a non-loopback address without --admin-token (anyone who reaches it may write)",
)
@click.option(
    "--max-streams",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="event streams open at once; one more is answered 503",
)
@click.option(
    "--stream-buffer",
    type=click.IntRange(10, 1_000_000),
    default=1000,
    show_default=True,
    help="events queued for one event stream; a reader that far behind is dropped (it reconnects)",
)
@click.option(
    "--stalled-reader-timeout",
    "stall_s",
    type=click.FloatRange(1, 3600),
    default=30.0,
    show_default=True,
    help="seconds a client may leave the server's writes to it waiting (reading nothing) before its connection "
    "is closed",
)
@click.option(
    "--max-body",
    "max_body",
    type=click.IntRange(1024, 64 << 20),
    default=1 << 20,
    show_default=True,
    help="the largest request body accepted, in bytes (413 past it)",
)
@click.option(
    "--task-metrics",
    "task_metrics",
    type=click.IntRange(0, 10_000),
    default=500,
    show_default=True,
    help="tasks whose figures /metrics exports (rows, rates, backlog; the first page of the listing; 0: none)",
)
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="warning",
    show_default=True,
    help="uvicorn's log level (requests are logged at info; tokens never are)",
)
@pass_ctx
def api_run(
    ctx: Ctx,
    host: str,
    port: int,
    token_source: str | None,
    allowed: tuple[str, ...],
    insecure: bool,
    max_streams: int,
    stream_buffer: int,
    stall_s: float,
    max_body: int,
    task_metrics: int,
    log_level: str,
) -> None:
    """Serve the API and the console until SIGINT/SIGTERM. Stateless: run as many as you like, each with
    its own ZooKeeper session (the same --zk, --zk-root, --zk-auth and TLS settings as every command)."""
    try:
        import uvicorn
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        from controller.api.app import LOOPBACK_HOSTS, ApiConfig, create_app
        from controller.api.auth import TokenError, resolve_token
        from controller.api.stall import guarded
    except ModuleNotFoundError as exc:  # pragma: no cover - the dependencies are in install_requires
        raise UserError(f"the HTTP API needs {exc.name}: pip install zkcontroller") from None
    try:
        token = resolve_token(token_source)
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--admin-token") from None
    if token is None and not _loopback(host) and not insecure:
        raise UserError(
            f"binding {host or 'every address'} without --admin-token lets anyone who reaches it write: "
            "give --admin-token env:NAME|file:PATH, or --insecure to do it anyway"
        )
    ctx.patient()
    client = ctx.client()
    config = ApiConfig(
        client=client,
        layout=ctx.layout,
        token=token,
        max_streams=max_streams,
        stream_buffer=stream_buffer,
        max_body_bytes=max_body,
        task_metrics_max=task_metrics,
        allowed_hosts=_allowed_hosts(host, allowed, LOOPBACK_HOSTS),
        zk_hosts=ctx.hosts,
    )
    from controller.admin.roots import missing_root_message

    unset = missing_root_message(client, ctx.layout, ctx.hosts)
    if unset is not None:  # served anyway (a root may be set up later), but every request is refused until then
        click.echo(f"warning: {unset}; until then every request is answered 404 no_cluster", err=True)
    app = create_app(config)
    # a reader that stops reading is cut, not held for ever; uvicorn calls its ``http`` as a factory, typed a class
    http: Any = guarded(AutoHTTPProtocol, stall_s)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=2, http=http
        )
    )
    # the bound port is known once the socket is open: announce it then (port 0 picks a free one)
    original_startup, original_shutdown = server.startup, server.shutdown

    async def startup(sockets: Any = None) -> None:
        await original_startup(sockets)
        bound = next((s.getsockname()[1] for srv in server.servers for s in srv.sockets), port)
        where = f"http://{host}:{bound}"
        click.echo(
            f"zkcontroller API on {where}{'/api/v1'} (console {where}/, docs {where}/api/v1/docs), "
            f"root {ctx.layout.root}; writes {'need the admin token' if token else 'are open (no --admin-token)'}",
            err=False,
        )

    async def shutdown(sockets: Any = None) -> None:
        app.state.hub.close()  # open event streams end now, instead of being cancelled mid-write
        await original_shutdown(sockets)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        server.should_exit = True

    server.startup = startup  # type: ignore[method-assign]
    server.shutdown = shutdown  # type: ignore[method-assign]
    # uvicorn stops on SIGINT/SIGTERM, then raises the signal again for the handler it replaced: zkctl's own
    # turns SIGTERM into KeyboardInterrupt, which click reports as "Aborted!" (exit 1) after a clean stop. The
    # stop was asked for: while uvicorn serves, the handler it replaces only asks it to stop (again), so a
    # signalled server exits 0 once its streams and its ZooKeeper session are closed.
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("API stopped")
