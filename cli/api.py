"""``zkctl api run``: the HTTP API and the web console, served with uvicorn on one ZooKeeper session."""

from __future__ import annotations

import click

from cli.common import Ctx, UserError, pass_ctx


@click.group("api")
def api() -> None:
    """The HTTP API (/api/v1) and the web console."""


@api.command("run")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to bind (loopback by default)")
@click.option("--port", type=click.IntRange(0, 65535), default=8083, show_default=True, help="port (0: any free port)")
@click.option("--admin-token", "token_source", default=None, metavar="env:NAME|file:PATH",
              help="where the admin token comes from; when set, writes need 'Authorization: Bearer <token>'")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="warning",
              show_default=True, help="uvicorn's log level (requests are logged at info; tokens never are)")
@pass_ctx
def api_run(ctx: Ctx, host: str, port: int, token_source: str | None, log_level: str) -> None:
    """Serve the API and the console until SIGINT/SIGTERM. Stateless: run as many as you like, each with
    its own ZooKeeper session (the same --zk, --zk-root, --zk-auth and TLS settings as every command)."""
    try:
        import uvicorn

        from controller.api.app import ApiConfig, create_app
        from controller.api.auth import TokenError, resolve_token
    except ModuleNotFoundError as exc:  # pragma: no cover - the dependencies are in install_requires
        raise UserError(f"the HTTP API needs {exc.name}: pip install zkcontroller") from None
    try:
        token = resolve_token(token_source)
    except TokenError as exc:
        raise click.BadParameter(str(exc), param_hint="--admin-token") from None
    client = ctx.client()
    app = create_app(ApiConfig(client=client, layout=ctx.layout, token=token))
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off",
                                           timeout_graceful_shutdown=2))
    # the bound port is known once the socket is open: announce it then (port 0 picks a free one)
    original_startup = server.startup

    async def startup(sockets=None) -> None:
        await original_startup(sockets)
        bound = next((s.getsockname()[1] for srv in server.servers for s in srv.sockets), port)
        where = f"http://{host}:{bound}"
        click.echo(f"zkcontroller API on {where}{'/api/v1'} (console {where}/, docs {where}/api/v1/docs), "
                   f"root {ctx.layout.root}; writes {'need the admin token' if token else 'are open (no --admin-token)'}",
                   err=False)

    server.startup = startup  # type: ignore[method-assign]
    server.run()
    click.echo("API stopped")
