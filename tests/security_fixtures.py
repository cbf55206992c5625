"""Fixtures of the security tests against ZooKeeper: a root laid out by `security init` with role credentials
(``secured``) or with per-broker identities (``per_broker``), each removed afterwards with the admin's rights.
Registered for every test through ``pytest_plugins`` in tests/conftest.py."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

from controller.protocol.cluster.acl import ROLES, AclPolicy
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.security import init_security
from controller.zk.subtrees import delete_tree
from tests.security_support import CREDS, broker_policy


@pytest.fixture
def secured(zk_hosts: str, zk_root: str):
    """A root laid out by `security init` (admin credentials), and a client factory per role."""
    layout = ZkLayout(zk_root)
    policy = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    clients: list[KazooClient] = []

    def client(role: str | None) -> KazooClient:
        c = make_client(
            ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=CREDS[role] if role else None)
        )
        clients.append(c)
        return c

    admin = client("admin")
    result = init_security(admin, layout, policy, CREDS["admin"])
    assert layout.security in result.created and result.acls_set >= len(result.created)
    yield layout, policy, client
    for c in clients:
        c.stop()
        c.close()
    remove_secured_root(zk_hosts, layout)


@pytest.fixture
def per_broker(zk_hosts: str, zk_root: str):
    """A root secured with a policy naming b0's and b1's own identities (and the shared broker one)."""
    layout = ZkLayout(zk_root)
    policy = broker_policy()
    clients = []

    def client(cred: str | None):
        c = make_client(ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=cred))
        clients.append(c)
        return c

    init_security(client(CREDS["admin"]), layout, policy, CREDS["admin"])
    yield layout, policy, client
    for c in clients:
        c.stop()
        c.close()
    remove_secured_root(zk_hosts, layout)


def remove_secured_root(zk_hosts: str, layout: ZkLayout) -> None:
    """The admin's ADMIN permission lets it open every ACL (the documented way to unsecure), then delete."""
    admin = make_client(ZkSettings(hosts=zk_hosts, root=layout.root, auth=CREDS["admin"]))
    try:
        stack = [layout.root]
        while stack:
            path = stack.pop()
            try:
                admin.set_acls(path, OPEN_ACL_UNSAFE)
                stack += [f"{path}/{c}" for c in admin.get_children(path)]
            except NoNodeError:
                continue
        delete_tree(admin, layout.root)
    finally:
        admin.stop()
        admin.close()
