"""The admin token: where it comes from (``env:NAME`` or ``file:PATH``, never the command line) and how a
request proves it has it (``Authorization: Bearer <token>``, compared in constant time). The token is
never logged or echoed."""

from __future__ import annotations

import hmac
import os

from controller.protocol.errors import ZkcError


class TokenError(ZkcError, ValueError):
    """The token source is malformed or empty (the message never contains the token)."""


def resolve_token(source: str | None) -> str | None:
    """The token named by ``source`` (``env:NAME`` or ``file:PATH``), or None when no token is configured."""
    if source is None:
        return None
    kind, sep, where = source.partition(":")
    if not sep or not where or kind not in ("env", "file"):
        raise TokenError("--admin-token takes env:NAME or file:PATH (the token itself never goes on the command line)")
    if kind == "env":
        token = os.environ.get(where, "")
        if not token.strip():
            raise TokenError(f"environment variable {where!r} is not set or empty")
    else:
        try:
            with open(where) as f:
                token = f.read()
        except OSError as exc:
            raise TokenError(f"cannot read the admin token file {where}: {exc.strerror or exc}") from None
    token = token.strip()
    if not token or "\n" in token:
        raise TokenError(f"the admin token from {kind}:{where} must be one non-empty line")
    return token


def check_bearer(header: str | None, token: str) -> int | None:
    """None if ``header`` carries ``token``; else the HTTP status: 401 without credentials, 403 wrong ones."""
    if not header:
        return 401
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value:
        return 401
    return None if hmac.compare_digest(value.strip().encode(), token.encode()) else 403
