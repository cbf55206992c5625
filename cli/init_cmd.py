"""``zkctl init``: set up a cluster root, the one command that may create one (a controller's first start
does too). Every other command refuses a root that was never set up."""

from __future__ import annotations

import click

from cli.common import Ctx, pass_ctx


@click.command("init")
@click.option("--zk-root", "root", default=None, help="the root to set up (else the global --zk-root)")
@pass_ctx
def init(ctx: Ctx, root: str | None) -> None:
    """Set up the cluster root named by --zk-root: its containers and task buckets (idempotent)."""
    if root is not None:
        ctx.root = root
    ctx.start_client()
    from controller.admin import ensure_layout
    from controller.admin.roots import is_set_up

    client = ctx.client()
    existed = is_set_up(client, ctx.layout)
    ensure_layout(client, ctx.layout)
    human = (
        f"{ctx.layout.root} on {ctx.hosts} is set up already"
        if existed
        else f"Created zkcontroller cluster root {ctx.layout.root} on {ctx.hosts}"
    )
    ctx.emit({"root": ctx.layout.root, "hosts": ctx.hosts, "created": not existed}, human)
