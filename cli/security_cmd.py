"""``zkctl security ...``: lay out a secured root (digest identities per role, ACLs), check it, show the
digest identity of credentials. Credentials come from files (or the global ``--zk-auth`` source),
never from the command line; only digest identities are printed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from kazoo.exceptions import NoAuthError

from cli.common import Ctx, UserError, pass_ctx
from controller.protocol.cluster.acl import ROLES, AclPolicy, SecurityError, digest_id
from controller.zk.security import check_acls, init_security, read_credential_file

F = TypeVar("F", bound=Callable[..., Any])


@click.group("security")
def security() -> None:
    """ZooKeeper digest authentication and ACLs (roles: controller, broker, admin, reader; brokers may
    each have an identity of their own)."""


def _role_options(f: F) -> F:
    for role in reversed(ROLES):
        f = click.option(
            f"--{role}-auth-file",
            f"{role}_files",
            multiple=True,
            type=click.Path(dir_okay=False),
            help=f"file holding a {role} credential user:password (repeatable)",
        )(f)
        f = click.option(
            f"--{role}-digest",
            f"{role}_digests",
            multiple=True,
            metavar="USER:DIGEST",
            help=f"a {role} digest identity (as zkctl security digest prints it; repeatable)",
        )(f)
    return f


def _broker_options(f: F) -> F:
    f = click.option(
        "--spark-user",
        "spark_users",
        multiple=True,
        metavar="NAME",
        help="the SASL user the Spark masters log in as (zkctl spark up --sasl-auth-file): it may change "
        "<root>/spark and below, nothing else (repeatable)",
    )(f)
    f = click.option(
        "--broker-user",
        "broker_user",
        metavar="PATTERN",
        help="a broker identity whose user name is PATTERN with {id} replaced by a broker id is that "
        "broker's own (e.g. broker.{id}); list the identities with --broker-digest/--broker-auth-file",
    )(f)
    f = click.option(
        "--broker-id-auth-file",
        "broker_id_files",
        multiple=True,
        metavar="ID=PATH",
        help="file holding broker ID's own credential user:password (repeatable)",
    )(f)
    f = click.option(
        "--broker-id-digest",
        "broker_id_digests",
        multiple=True,
        metavar="ID=USER:DIGEST",
        help="broker ID's own digest identity (as zkctl security digest --broker ID prints it; repeatable)",
    )(f)
    return f


def _pair(value: str, option: str) -> tuple[str, str]:
    broker, sep, rest = value.partition("=")
    if not sep or not broker or not rest:
        raise SecurityError(f"{option} takes ID=VALUE (a broker id, '=', then the value)")
    return broker, rest


def _policy(kw: dict[str, Any]) -> AclPolicy:
    roles: dict[str, tuple[str, ...]] = {}
    brokers: dict[str, list[str]] = {}
    try:
        for role in ROLES:
            ids = [digest_id(read_credential_file(p), f"{role} credentials file {p}") for p in kw[f"{role}_files"]]
            ids += list(kw[f"{role}_digests"])
            roles[role] = tuple(dict.fromkeys(ids))
        for value in kw["broker_id_files"]:
            b, path = _pair(value, "--broker-id-auth-file")
            brokers.setdefault(b, []).append(
                digest_id(read_credential_file(path), f"broker {b} credentials file {path}")
            )
        for value in kw["broker_id_digests"]:
            b, ident = _pair(value, "--broker-id-digest")
            brokers.setdefault(b, []).append(ident)
        return AclPolicy(
            roles, {b: tuple(dict.fromkeys(v)) for b, v in brokers.items()}, kw["broker_user"], kw["spark_users"]
        )
    except SecurityError as exc:
        raise UserError(str(exc)) from None


@security.command("init")
@_role_options
@_broker_options
@pass_ctx
def security_init(ctx: Ctx, /, **kw: Any) -> None:  # pass_ctx hands ctx first, the options by name
    """Secure the cluster root: write the policy (digest identities per role, and of single brokers) to
    <root>/security, create the containers with their ACLs, and set the ACL of every existing znode under
    the root (a znode a broker owns stays that broker's).

    Run it with admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE) that the policy lists as admin.
    Every process then needs its role's credentials; a broker with an identity of its own needs its own.
    Restart the processes after changing the policy: each reads it once."""
    policy = _policy(kw)
    if ctx.settings.auth is None:
        raise UserError(
            "security init needs admin credentials: --zk-auth env:NAME|file:PATH, ZKC_AUTH or ZKC_AUTH_FILE"
        )
    try:
        result = init_security(ctx.client(), ctx.layout, policy, ctx.settings.auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    ctx.emit(
        {
            "root": result.root,
            "created": result.created,
            "acls_set": result.acls_set,
            "identities": result.policy_ids,
            "refused": result.refused,
        },
        f"secured {result.root}: policy at {ctx.layout.security}, {len(result.created)} znodes created, "
        f"ACL set on {result.acls_set} znodes; identities "
        + ", ".join(f"{r} {n}" for r, n in result.policy_ids.items())
        + (
            f"\nno ADMIN right on {len(result.refused)} znodes (their ACLs were changed by someone else): "
            + ", ".join(result.refused[:10])
            if result.refused
            else ""
        ),
    )
    if result.refused:
        raise SystemExit(1)


@security.command("check")
@pass_ctx
def security_check(ctx: Ctx) -> None:
    """List the znodes under the root whose ACL differs from the policy (exit 1 if any)."""
    client = ctx.client()
    try:
        data, _ = client.get(ctx.layout.security)
    except NoAuthError:  # the policy is not the read-only role's
        raise UserError(
            "security check needs admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE with an admin identity): "
            f"these may not read the policy at {ctx.layout.security}"
        ) from None
    except Exception as exc:
        raise UserError(
            f"no readable ACL policy at {ctx.layout.security} ({type(exc).__name__}); run `zkctl security init` first"
        ) from None
    try:
        policy = AclPolicy.decode(data)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    try:
        wrong = check_acls(client, ctx.layout, policy, credential=ctx.settings.auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    ctx.emit(
        {"wrong": wrong},
        "every znode has its policy ACL"
        if not wrong
        else "\n".join(["znodes whose ACL differs from the policy:"] + [f"  {p}" for p in wrong]),
    )
    if wrong:
        raise SystemExit(1)


@security.command("digest")
@click.option("--broker", "broker", metavar="ID", help="print ID=USER:DIGEST, for security init --broker-id-digest")
@pass_ctx
def security_digest(ctx: Ctx, broker: str | None) -> None:
    """Print the digest identity (user:base64(sha1)) of the current credentials, for a policy."""
    auth = ctx.settings.auth
    if auth is None:
        raise UserError("no credentials: --zk-auth env:NAME|file:PATH, ZKC_AUTH or ZKC_AUTH_FILE")
    try:
        ident = digest_id(auth)
    except SecurityError as exc:
        raise UserError(str(exc)) from None
    if broker is not None:
        from controller.protocol.cluster.layout import InvalidName, check_name

        try:
            check_name("broker id", broker)
        except InvalidName as exc:
            raise UserError(str(exc)) from None
        ctx.emit({"digest": ident, "broker": broker}, f"{broker}={ident}")
        return
    ctx.emit({"digest": ident}, ident)
