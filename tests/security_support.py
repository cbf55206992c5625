"""Credentials and policies of the security tests, in both tiers: a digest credential per role, one of each
broker's own, and the per-broker policy built from them. Test secrets only, made up here."""

from __future__ import annotations

from controller.protocol.cluster.acl import ROLES, AclPolicy

PASSWORDS = {r: f"s3cret-{r}-pw" for r in ROLES}
CREDS = {r: f"zkc-{r}:{PASSWORDS[r]}" for r in ROLES}
R, W, C, D, A = 1, 2, 4, 8, 16
BROKER_CREDS = {b: f"broker.{b}:pw-of-{b}" for b in ("b0", "b1", "b2")}
SHARED = CREDS["broker"]


def broker_policy(shared: bool = True, pattern: bool = False) -> AclPolicy:
    roles = {r: [CREDS[r]] for r in ROLES if r != "broker"}
    roles["broker"] = [SHARED] if shared else []
    if pattern:  # identities listed in the broker role, recognised by user name
        roles["broker"] += list(BROKER_CREDS.values())
        return AclPolicy.from_credentials(roles, broker_user="broker.{id}")
    return AclPolicy.from_credentials(roles, {b: [c] for b, c in BROKER_CREDS.items()})
