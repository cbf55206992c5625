"""ZooKeeper digest authentication and ACLs: who may change what.

Roles (each is one or more ``digest`` identities, ``user:password`` credentials):

============  ===================================================================================
controller    ``/controller``, ``/controller_epoch``, group state, join results, assignments; deletes
              tasks and admin requests once handled; writes FAILED statuses of invalid task specs
broker        its registration, group membership (join requests, the leader's proposal), task owner
              znodes, task statuses, run intervals, its own controlled-shutdown request
admin         the operator: tasks and admin requests (rebalance, controlled shutdown, reassign,
              delete); READ and ADMIN (setACL) everywhere, so ``zkctl security init`` can re-apply
              the policy; no WRITE on the controller's or the brokers' znodes
reader        read-only
============  ===================================================================================

Every role can read everything; an unauthenticated client can read nothing and change nothing.

ZooKeeper checks CREATE and DELETE on the *parent*, so containers grant CREATE/DELETE to the roles that
create or delete their children (e.g. ``/tasks`` gives the admin CREATE and the controller DELETE;
``/tasks/<id>`` gives brokers CREATE/DELETE for the ``owner`` child). ZooKeeper ACLs are not inherited:
every znode gets its ACL when it is created. The policy (the digest identities of each role, no
passwords) lives in ``<root>/security``, written by ``zkctl security init``; a client with credentials
(:func:`make_secure_client`, used by ``make_client`` when ``ZkSettings.auth`` is set) reads it and gives
every znode it creates the ACL :func:`acl_for` computes from the znode's path, whichever code path
creates it (plain creates, ``ensure_path``, multis): the hook is the client's one request funnel.

Secrets: credentials are never logged (``ZkSettings.__repr__`` masks them, and a filter on kazoo's
loggers masks the auth packet); only digest identities (``user:base64(sha1(user:password))``, what
ZooKeeper itself stores and shows to anyone through getACL) appear in the policy.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.serialization import Auth, Create, Create2, Transaction
from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from controller.codecs import encode_epoch
from controller.layout import ZkLayout

log = logging.getLogger(__name__)

ROLES = ("controller", "broker", "admin", "reader")
POLICY_VERSION = 1
R, W, C, D, A = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE, Permissions.ADMIN
ALL = Permissions.ALL
# Brokers never get ADMIN (setACL): one broker must not be able to lock the admin or another broker out.
RWCD = R | W | C | D


class SecurityError(ValueError):
    """A malformed credential or policy (the message never contains a password)."""


def parse_credential(text: str, source: str = "credential") -> tuple[str, str]:
    """``user:password`` -> (user, password); refuses anything else without echoing it."""
    text = (text or "").strip()
    user, sep, password = text.partition(":")
    if not sep or not user or not password or "\n" in text:
        raise SecurityError(f"{source} must be one line 'user:password' (digest authentication)")
    return user, password


def digest_id(credential: str, source: str = "credential") -> str:
    """The digest identity ``user:base64(sha1(user:password))`` of a ``user:password`` credential."""
    user, password = parse_credential(credential, source)
    return make_digest_acl_credential(user, password)


def read_credential_file(path: str, source: str = "credentials file") -> str:
    """The one ``user:password`` line of a credentials file, checked. A path that names no file but looks
    like a credential (someone gave ``file:user:password``) is refused without being repeated."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as exc:
        if ":" in path and not os.path.exists(path):
            raise SecurityError(f"{source}: no such file (the value looks like 'user:password': credentials never go "
                                "on the command line or in a path; put them in a file readable only by you and give "
                                "its path)") from None
        raise SecurityError(f"cannot read {source} {path}: {exc.strerror or exc}") from None
    parse_credential(text, f"{source} {path}")
    return text


def credential_from_env(env: Mapping[str, str] | None = None) -> str | None:
    """The digest credential named by ``ZKC_AUTH`` (the credential) or ``ZKC_AUTH_FILE`` (a file holding
    it), checked the same way as ``--zk-auth``; None when neither is set. Never repeats the secret."""
    env = os.environ if env is None else env
    auth = env.get("ZKC_AUTH")
    if auth:
        parse_credential(auth, "ZKC_AUTH")
        return auth.strip()
    path = env.get("ZKC_AUTH_FILE")
    if path:
        return read_credential_file(path, "ZKC_AUTH_FILE")
    return None


@dataclass(frozen=True)
class AclPolicy:
    """Digest identities of each role (``user:digest``); no passwords."""

    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown:
            raise SecurityError(f"unknown role(s) {sorted(unknown)}: roles are {', '.join(ROLES)}")
        for role, ids in self.roles.items():
            for i in ids:
                user, sep, digest = str(i).partition(":")
                if not sep or not user or not digest:
                    raise SecurityError(f"role {role}: {i!r} is not a digest identity 'user:digest'")

    def ids(self, role: str) -> tuple[str, ...]:
        return tuple(self.roles.get(role, ()))

    def role_of(self, identity: str) -> str | None:
        return next((r for r in ROLES if identity in self.ids(r)), None)

    def encode(self) -> bytes:
        return json.dumps({"version": POLICY_VERSION, "roles": {r: list(self.ids(r)) for r in ROLES}},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "AclPolicy":
        try:
            body = json.loads(data.decode("utf-8"))
            if not isinstance(body, dict) or body.get("version") != POLICY_VERSION:
                raise SecurityError(f"unsupported ACL policy version {body.get('version') if isinstance(body, dict) else None!r}")
            roles = body["roles"]
            if not isinstance(roles, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                                      for v in roles.values()):
                raise SecurityError("ACL policy 'roles' must map role names to lists of digest identities")
            return cls({r: tuple(v) for r, v in roles.items()})
        except (ValueError, KeyError, RecursionError) as exc:
            if isinstance(exc, SecurityError):
                raise
            raise SecurityError(f"unreadable ACL policy: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Iterable[str]]) -> "AclPolicy":
        return cls({role: tuple(digest_id(c, f"{role} credential") for c in creds)
                    for role, creds in credentials.items()})


# ---- the ACL of every path ---------------------------------------------------------------------------
# (role -> permissions) per kind of znode; "*" = every role not named (READ for all roles by default)

def _rule(**perms: int) -> dict[str, int]:
    out = {r: R for r in ROLES}
    out["admin"] = R | A
    out.update({k: v for k, v in perms.items()})
    return out


RULES: dict[str, dict[str, int]] = {
    "root": _rule(admin=R | C | A, controller=R | C | D),
    "controller": _rule(controller=ALL),                    # /controller, /controller_epoch
    "brokers": _rule(admin=R | C | A),                      # /brokers
    "broker_ids": _rule(broker=R | C | D),                  # /brokers/ids
    "broker": _rule(broker=RWCD),                            # /brokers/ids/<b>
    "tasks": _rule(admin=ALL, controller=R | D),            # /tasks
    "task": _rule(admin=R | W | A, broker=R | C | D, controller=R | D),  # /tasks/<t> (brokers: owner; controller: strays)
    "owner": _rule(broker=RWCD),                             # /tasks/<t>/owner
    "groups": _rule(controller=ALL, broker=R | C),          # /groups
    "group": _rule(controller=ALL, broker=R | C),           # /groups/<g>
    "group_state": _rule(controller=ALL),                   # /groups/<g>/state
    "members": _rule(broker=R | C | D),                     # /groups/<g>/members
    "member": _rule(broker=RWCD),                            # /groups/<g>/members/<m>
    "joins": _rule(controller=ALL),                         # /groups/<g>/join
    "join": _rule(controller=ALL),                          # /groups/<g>/join/<gen>
    "syncs": _rule(controller=ALL, broker=R | C),           # /groups/<g>/sync (controller deletes old gens)
    "sync": _rule(broker=RWCD),                              # /groups/<g>/sync/<gen> (the leader's proposal)
    "assignments": _rule(controller=ALL),                   # /groups/<g>/assignment
    "assignment": _rule(controller=ALL),                    # /groups/<g>/assignment/<m>
    "statuses": _rule(broker=R | C | D, controller=R | C | D),  # /status
    "status": _rule(broker=RWCD, controller=ALL),            # /status/<t> (workers; controller: invalid specs)
    "intervals": _rule(broker=R | C | D),                   # /intervals
    "interval": _rule(broker=RWCD),                          # /intervals/<b>
    "admin": _rule(admin=ALL),                              # /admin
    "admin_queue": _rule(admin=ALL, controller=R | D),      # /admin/{rebalance,reassign,delete_tasks}
    "admin_request": _rule(admin=ALL),                      # their children
    "shutdown_queue": _rule(admin=ALL, controller=R | D, broker=R | C),  # /admin/controlled_shutdown
    "shutdown_request": _rule(admin=ALL, broker=RWCD),       # /admin/controlled_shutdown/<b>
    "security": _rule(admin=ALL),                           # /security (the policy)
    "other": _rule(admin=ALL),                              # anything else under the root
}


def classify(layout: ZkLayout, path: str) -> str:
    """The kind of znode ``path`` is, for :data:`RULES`."""
    base = "" if layout.root == "/" else layout.root
    if path == layout.root:
        return "root"
    if not path.startswith(base + "/"):
        return "other"
    parts = path[len(base) + 1:].split("/")
    n, head = len(parts), parts[0]
    if n == 1:
        return {"controller": "controller", "controller_epoch": "controller", "brokers": "brokers",
                "tasks": "tasks", "groups": "groups", "status": "statuses", "intervals": "intervals",
                "admin": "admin", "security": "security"}.get(head, "other")
    if head == "brokers":
        return "broker_ids" if n == 2 and parts[1] == "ids" else "broker" if n == 3 and parts[1] == "ids" else "other"
    if head == "tasks":
        return "task" if n == 2 else "owner" if n == 3 and parts[2] == "owner" else "other"
    if head == "groups":
        if n == 2:
            return "group"
        kinds = {"state": ("group_state", None), "members": ("members", "member"), "join": ("joins", "join"),
                 "sync": ("syncs", "sync"), "assignment": ("assignments", "assignment")}
        kind = kinds.get(parts[2])
        if kind is None:
            return "other"
        if n == 3:
            return kind[0]
        return kind[1] if n == 4 and kind[1] else "other"
    if head == "status":
        return "status" if n == 2 else "other"
    if head == "intervals":
        return "interval" if n == 2 else "other"
    if head == "admin":
        if parts[1] == "controlled_shutdown":
            return "shutdown_queue" if n == 2 else "shutdown_request" if n == 3 else "other"
        if parts[1] in ("rebalance", "reassign", "delete_tasks"):
            return "admin_queue" if n == 2 else "admin_request" if n == 3 else "other"
    return "other"


def acl_for(policy: AclPolicy, layout: ZkLayout, path: str) -> list[ACL]:
    """The ACL a znode at ``path`` gets under ``policy`` (one entry per identity)."""
    rule = RULES[classify(layout, path)]
    acls: list[ACL] = []
    for role in ROLES:
        perms = rule.get(role, 0)
        if perms:
            acls += [ACL(perms, Id("digest", ident)) for ident in policy.ids(role)]
    if not acls:
        raise SecurityError("the ACL policy names no identity: it would lock everyone out")
    return acls


# ---- the client ------------------------------------------------------------------------------------

class SecureKazooClient(KazooClient):
    """A KazooClient that creates every znode with the policy's ACL for its path.

    The policy is read from ``<root>/security`` on first need (and again at most every ``refresh_s``
    while there is none: a cluster may be secured after its processes started). Without a policy,
    creates are left as they are (ZooKeeper's open ACL), which is the unsecured mode.
    """

    def __init__(self, root: str, *args: Any, refresh_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = ZkLayout(root)
        self._policy: AclPolicy | None = None
        self._checked = 0.0
        self._refresh_s = refresh_s
        self._policy_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SecureKazooClient(hosts={self.hosts!r}, root={self.layout.root!r})"

    @property
    def policy(self) -> AclPolicy | None:
        with self._policy_lock:
            if self._policy is None and time.monotonic() - self._checked >= self._refresh_s:
                self._checked = time.monotonic()
                self._policy = self._load_policy()
            return self._policy

    def _load_policy(self) -> AclPolicy | None:
        try:
            data, _ = self.get_async(self.layout.security).get(timeout=5.0)
        except (NoNodeError, NoAuthError):
            return None
        except Exception as exc:
            log.info("ACL policy not readable yet (%s)", type(exc).__name__)
            self._checked = 0.0
            return None
        try:
            return AclPolicy.decode(data)
        except SecurityError as exc:
            log.error("ignoring the ACL policy at %s: %s", self.layout.security, exc)
            return None

    def _secured(self, op: Any) -> Any:
        if isinstance(op, (Create, Create2)) and (not op.acl or _is_open(op.acl)):
            policy = self.policy
            if policy is not None:
                return op._replace(acl=acl_for(policy, self.layout, op.path))
        return op

    def _call(self, request: Any, async_object: Any) -> Any:
        if isinstance(request, (Create, Create2)):
            request = self._secured(request)
        elif isinstance(request, Transaction):
            request = Transaction([self._secured(op) for op in request.operations])
        return super()._call(request, async_object)


def _is_open(acl: Sequence[ACL]) -> bool:
    return all(a.id.scheme == "world" and a.id.id == "anyone" for a in acl)


class _RedactAuth(logging.Filter):
    """kazoo logs requests at its lowest levels; an auth packet carries the password: mask it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            if any(isinstance(a, Auth) for a in args):
                record.args = tuple(Auth(a.auth_type, a.scheme, "***") if isinstance(a, Auth) else a for a in args)
        return True


_REDACT = _RedactAuth()
for _name in ("kazoo", "kazoo.client", "kazoo.protocol.connection"):
    logging.getLogger(_name).addFilter(_REDACT)


# ---- laying out a secured root -------------------------------------------------------------------------

@dataclass
class InitResult:
    root: str
    created: list[str]
    acls_set: int
    policy_ids: dict[str, int]
    refused: list[str] = field(default_factory=list)  # znodes whose ACL we had no right to set


def init_security(client: KazooClient, layout: ZkLayout, policy: AclPolicy, own_credential: str | None) -> InitResult:
    """Lay out ``layout.root`` with the policy: write ``<root>/security``, create the containers, and set
    every existing znode's ACL (so an open cluster can be secured in place). ``client`` must be
    authenticated as one of the policy's admin identities (checked, or the admin would lock itself out)."""
    if not policy.ids("admin"):
        raise SecurityError("the policy names no admin identity")
    for role in ("controller", "broker"):
        if not policy.ids(role):
            raise SecurityError(f"the policy names no {role} identity")
    if own_credential is None or digest_id(own_credential) not in policy.ids("admin"):
        raise SecurityError("run `security init` with admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE) "
                            "that are among the policy's admin identities")
    created: list[str] = []
    paths = [layout.root, layout.security, layout.controller_epoch, *_containers(layout)]
    for path in paths:
        if client.exists(path) is None:
            data = policy.encode() if path == layout.security else encode_epoch(0) if path == layout.controller_epoch else b""
            try:
                client.create(path, data, acl=acl_for(policy, layout, path), makepath=True)
                created.append(path)
            except Exception as exc:
                if type(exc).__name__ != "NodeExistsError":
                    raise
    client.set(layout.security, policy.encode())
    n = 0
    refused: list[str] = []
    stack = [layout.root]
    while stack:  # bounded by the tree's size
        path = stack.pop()
        try:
            client.set_acls(path, acl_for(policy, layout, path))
            n += 1
            stack += [f"{path.rstrip('/')}/{c}" for c in client.get_children(path)]
        except NoNodeError:
            continue
        except NoAuthError:  # someone took ADMIN away from us on this znode: report it, secure the rest
            refused.append(path)
            log.warning("security init: no ADMIN right on %s; its ACL is left as it is", path)
    return InitResult(layout.root, created, n, {r: len(policy.ids(r)) for r in ROLES}, refused)


def _containers(layout: ZkLayout) -> list[str]:
    out: list[str] = []
    for p in layout.persistent_roots():
        parts = p[len(layout.root.rstrip("/")):].strip("/").split("/")
        for i in range(1, len(parts) + 1):
            q = layout.root.rstrip("/") + "/" + "/".join(parts[:i])
            if q not in out:
                out.append(q)
    return out


def check_acls(client: KazooClient, layout: ZkLayout, policy: AclPolicy, limit: int = 100_000,
               credential: str | None = None) -> list[str]:
    """Znodes under the root whose ACL differs from the policy's (empty = all as designed).

    Needs admin credentials: ZooKeeper shows the digests of an ACL only to a client with ADMIN on the
    znode, so any other credential would see every digest ACL as different (false alarms)."""
    if credential is None or digest_id(credential) not in policy.ids("admin"):
        raise SecurityError("security check needs admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE with an "
                            "identity the policy lists as admin): ZooKeeper shows ACL digests only to clients with "
                            "ADMIN on a znode, so any other credentials would report every znode as wrong")
    wrong: list[str] = []
    stack = [layout.root]
    seen = 0
    while stack and seen < limit:
        path = stack.pop()
        seen += 1
        try:
            acls, _ = client.get_acls(path)
        except NoNodeError:
            continue
        try:
            stack += [f"{path.rstrip('/')}/{c}" for c in client.get_children(path)]
        except NoNodeError:
            continue
        except NoAuthError:  # an ACL without READ for the admin is itself not the policy's
            wrong.append(path)
            continue
        want = {(a.perms, a.id.scheme, a.id.id) for a in acl_for(policy, layout, path)}
        have = {(a.perms, a.id.scheme, a.id.id) for a in acls}
        if want != have:
            wrong.append(path)
    return sorted(wrong)
