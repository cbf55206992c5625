"""``zkctl security ...``: lay out a secured root (digest identities per role, ACLs), check it, show the
digest identity of credentials. Credentials come from files (or the global ``--zk-auth`` source),
never from the command line; only digest identities are printed."""

from __future__ import annotations

import click

from cli.common import Ctx, UserError, pass_ctx
from controller.security import (
    ROLES,
    AclPolicy,
    SecurityError,
    check_acls,
    digest_id,
    init_security,
    read_credential_file,
)


@click.group("security")
def security() -> None:
    """ZooKeeper digest authentication and ACLs (roles: controller, broker, admin, reader)."""


def _role_options(f):
    for role in reversed(ROLES):
        f = click.option(f"--{role}-auth-file", f"{role}_files", multiple=True, type=click.Path(dir_okay=False),
                         help=f"file holding a {role} credential user:password (repeatable)")(f)
        f = click.option(f"--{role}-digest", f"{role}_digests", multiple=True, metavar="USER:DIGEST",
                         help=f"a {role} digest identity (as `zkctl security digest` prints it; repeatable)")(f)
    return f


def _policy(kw: dict) -> AclPolicy:
    roles: dict[str, tuple[str, ...]] = {}
    try:
        for role in ROLES:
            ids = [digest_id(read_credential_file(p), f"{role} credentials file {p}") for p in kw[f"{role}_files"]]
            ids += list(kw[f"{role}_digests"])
            roles[role] = tuple(dict.fromkeys(ids))
        return AclPolicy(roles)
    except SecurityError as exc:
        raise UserError(str(exc)) from None


@security.command("init")
@_role_options
@pass_ctx
def security_init(ctx: Ctx, **kw) -> None:
    """Secure the cluster root: write the policy (digest identities per role) to <root>/security, create
    the containers with their ACLs, and set the ACL of every existing znode under the root.

    Run it with admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE) that the policy lists as admin.
    Every process then needs its role's credentials."""
    policy = _policy(kw)
    if ctx.settings.auth is None:
        raise UserError("security init needs admin credentials: --zk-auth env:NAME|file:PATH, ZKC_AUTH or ZKC_AUTH_FILE")
    try:
        result = init_security(ctx.client(), ctx.layout, policy, ctx.settings.auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    ctx.emit({"root": result.root, "created": result.created, "acls_set": result.acls_set,
              "identities": result.policy_ids, "refused": result.refused},
             f"secured {result.root}: policy at {ctx.layout.security}, {len(result.created)} znodes created, "
             f"ACL set on {result.acls_set} znodes; identities "
             + ", ".join(f"{r} {n}" for r, n in result.policy_ids.items())
             + (f"\nno ADMIN right on {len(result.refused)} znodes (their ACLs were changed by someone else): "
                + ", ".join(result.refused[:10]) if result.refused else ""))
    if result.refused:
        raise SystemExit(1)


@security.command("check")
@pass_ctx
def security_check(ctx: Ctx) -> None:
    """List the znodes under the root whose ACL differs from the policy (exit 1 if any)."""
    client = ctx.client()
    try:
        data, _ = client.get(ctx.layout.security)
    except Exception as exc:
        raise UserError(f"no readable ACL policy at {ctx.layout.security} ({type(exc).__name__}); "
                        "run `zkctl security init` first") from None
    try:
        policy = AclPolicy.decode(data)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    try:
        wrong = check_acls(client, ctx.layout, policy, credential=ctx.settings.auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    ctx.emit({"wrong": wrong}, "every znode has its policy ACL" if not wrong
             else "\n".join(["znodes whose ACL differs from the policy:"] + [f"  {p}" for p in wrong]))
    if wrong:
        raise SystemExit(1)


@security.command("digest")
@pass_ctx
def security_digest(ctx: Ctx) -> None:
    """Print the digest identity (user:base64(sha1)) of the current credentials, for a policy."""
    auth = ctx.settings.auth
    if auth is None:
        raise UserError("no credentials: --zk-auth env:NAME|file:PATH, ZKC_AUTH or ZKC_AUTH_FILE")
    try:
        ident = digest_id(auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    ctx.emit({"digest": ident}, ident)
