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

Per-broker identities (policy version 2): each broker may have credentials of its own, listed per broker
id (``brokers``) or recognised by user name (``broker_user``, e.g. ``broker.{id}``). What a broker creates
for itself (registration, join request, owner znodes, statuses, intervals, its shutdown request) is then
writable by that broker alone, and no broker's own identity may delete another's: only the broker a task
is assigned to has CREATE/DELETE on ``/tasks/<t>`` (for its ``owner`` child), which the controller hands
over (:func:`grants_needed`, a setACL before the assignment that gives the task is written). The shared
``broker`` role keeps its rights, so a cluster moves one broker at a time.

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
from controller.layout import ZkLayout, check_name, is_bucket
from controller.layout_io import check_root, create_buckets, write_layout_info

log = logging.getLogger(__name__)

ROLES = ("controller", "broker", "admin", "reader")
POLICY_VERSIONS = (1, 2)  # 1: roles only; 2: and identities of single brokers
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


def _check_identity(where: str, i: object) -> str:
    user, sep, digest = str(i).partition(":")
    if not isinstance(i, str) or not sep or not user or not digest:
        raise SecurityError(f"{where}: {i!r} is not a digest identity 'user:digest'")
    return i


def _check_broker_id(b: object) -> str:
    try:
        return check_name("broker id", b)  # type: ignore[arg-type]
    except ValueError as exc:
        raise SecurityError(f"ACL policy 'brokers': {exc}") from None


@dataclass(frozen=True)
class AclPolicy:
    """Digest identities of each role (``user:digest``), and of each broker; no passwords.

    ``brokers`` maps a broker id to its own identities (several while a credential is rotated);
    ``broker_user`` (e.g. ``broker.{id}``) says the same by name: a ``broker``-role identity whose user is
    ``broker.b1`` is broker ``b1``'s. A broker-role identity that is no broker's (the shared ``broker``
    credential of a cluster that has not moved to per-broker identities) keeps the role's old rights."""

    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    brokers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    broker_user: str | None = None
    _owner: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_broker: dict[str, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown:
            raise SecurityError(f"unknown role(s) {sorted(unknown)}: roles are {', '.join(ROLES)}")
        for role, ids in self.roles.items():
            for i in ids:
                _check_identity(f"role {role}", i)
        object.__setattr__(self, "brokers", {b: (v,) if isinstance(v, str) else tuple(v)
                                             for b, v in self.brokers.items()})
        owner: dict[str, str] = {}

        def claim(identity: str, broker: str) -> None:
            if owner.get(identity, broker) != broker:
                raise SecurityError(f"identity {identity.partition(':')[0]!r} is given to two brokers "
                                    f"({owner[identity]}, {broker})")
            owner[identity] = broker

        for b, ids in self.brokers.items():
            _check_broker_id(b)
            if not ids:
                raise SecurityError(f"ACL policy 'brokers': broker {b} has no identity")
            for i in ids:
                claim(_check_identity(f"broker {b}", i), b)
        if self.broker_user is not None:
            prefix, sep, suffix = self.broker_user.partition("{id}")
            if not sep or "{id}" in suffix or ":" in self.broker_user:
                raise SecurityError(f"broker_user {self.broker_user!r} must contain '{{id}}' once (e.g. broker.{{id}}) "
                                    "and no ':'")
            for i in self.ids("broker"):
                user = i.partition(":")[0]
                if len(user) > len(prefix) + len(suffix) and user.startswith(prefix) and user.endswith(suffix):
                    b = user[len(prefix):len(user) - len(suffix)]
                    try:
                        claim(i, check_name("broker id", b))
                    except ValueError:
                        continue  # not a broker id: a shared identity that happens to look alike
        for i in owner:
            other = [r for r in ROLES if r != "broker" and i in self.ids(r)]
            if other:
                raise SecurityError(f"identity {i.partition(':')[0]!r} is a broker's and also {other[0]}: "
                                    "a broker's identity must have no other role")
        by_broker: dict[str, list[str]] = {}
        for i, b in owner.items():
            by_broker.setdefault(b, []).append(i)
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_by_broker", {b: tuple(v) for b, v in by_broker.items()})

    def ids(self, role: str) -> tuple[str, ...]:
        """The identities listed under ``role`` (for ``broker``: shared and per-broker ones as written)."""
        return tuple(self.roles.get(role, ()))

    @property
    def per_broker(self) -> bool:
        """Whether some broker has an identity of its own (then what brokers create is theirs alone)."""
        return bool(self._owner)

    def broker_of(self, identity: str | None) -> str | None:
        """The broker whose own identity this is (None: not a broker's own, e.g. the shared one)."""
        return self._owner.get(identity) if identity else None

    def identities_of(self, broker: str | None) -> tuple[str, ...]:
        return self._by_broker.get(broker, ()) if broker else ()

    def shared_broker_ids(self) -> tuple[str, ...]:
        """Broker-role identities that are no single broker's: the role's old, shared rights."""
        return tuple(i for i in self.ids("broker") if i not in self._owner)

    def per_broker_ids(self) -> tuple[str, ...]:
        return tuple(self._owner)

    def role_of(self, identity: str) -> str | None:
        if identity in self._owner:
            return "broker"
        return next((r for r in ROLES if identity in self.ids(r)), None)

    def encode(self) -> bytes:
        """Version 1 while no broker has its own identity (processes of earlier releases read it); else 2."""
        body: dict[str, Any] = {"version": 1, "roles": {r: list(self.ids(r)) for r in ROLES}}
        if self.brokers or self.broker_user is not None:
            body.update(version=2, brokers={b: list(v) for b, v in sorted(self.brokers.items())},
                        broker_user=self.broker_user)
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "AclPolicy":
        try:
            body = json.loads(data.decode("utf-8"))
            version = body.get("version") if isinstance(body, dict) else None
            if version not in POLICY_VERSIONS or isinstance(version, bool):
                raise SecurityError(f"unsupported ACL policy version {version!r}")
            roles = body["roles"]
            if not isinstance(roles, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                                      for v in roles.values()):
                raise SecurityError("ACL policy 'roles' must map role names to lists of digest identities")
            brokers = body.get("brokers", {}) if version >= 2 else {}
            if not isinstance(brokers, dict) or not all(
                    isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
                    for v in brokers.values()):
                raise SecurityError("ACL policy 'brokers' must map broker ids to a digest identity or a list of them")
            pattern = body.get("broker_user") if version >= 2 else None
            if pattern is not None and not isinstance(pattern, str):
                raise SecurityError("ACL policy 'broker_user' must be a string like 'broker.{id}'")
            return cls({r: tuple(v) for r, v in roles.items()},
                       {b: (v,) if isinstance(v, str) else tuple(v) for b, v in brokers.items()}, pattern)
        except (ValueError, KeyError, RecursionError, AttributeError) as exc:
            if isinstance(exc, SecurityError):
                raise
            raise SecurityError(f"unreadable ACL policy: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_credentials(cls, credentials: Mapping[str, Iterable[str]],
                         brokers: Mapping[str, Iterable[str]] | None = None,
                         broker_user: str | None = None) -> "AclPolicy":
        """A policy from ``user:password`` credentials per role and per broker id (hashed here)."""
        return cls({role: tuple(digest_id(c, f"{role} credential") for c in creds)
                    for role, creds in credentials.items()},
                   {b: tuple(digest_id(c, f"broker {b} credential") for c in creds)
                    for b, creds in (brokers or {}).items()}, broker_user)


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
    "layout": _rule(admin=ALL),                             # /layout (version, buckets)
    "tasks": _rule(admin=ALL, controller=R | D),            # /tasks
    "task_bucket": _rule(admin=ALL, controller=R | D),      # /tasks/<bucket>
    "task": _rule(admin=R | W | A, broker=R | C | D, controller=R | D),  # /tasks/<bucket>/<t> (brokers: owner; controller: strays)
    "owner": _rule(broker=RWCD),                             # /tasks/<bucket>/<t>/owner
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
    "statuses": _rule(admin=R | C | A, broker=R | C | D, controller=R | C | D),  # /status (admin: lays out buckets)
    "status_bucket": _rule(broker=R | C | D, controller=R | C | D),  # /status/<bucket>
    "status": _rule(broker=RWCD, controller=ALL),            # /status/<bucket>/<t> (workers; controller: invalid specs)
    "intervals": _rule(broker=R | C | D),                   # /intervals
    "interval": _rule(broker=RWCD),                          # /intervals/<b>
    "admin": _rule(admin=ALL),                              # /admin
    "admin_queue": _rule(admin=ALL, controller=R | D),      # /admin/{rebalance,reassign,delete_tasks}
    "admin_request": _rule(admin=ALL),                      # their children
    "shutdown_queue": _rule(admin=ALL, controller=R | D, broker=R | C),  # /admin/controlled_shutdown
    "shutdown_request": _rule(admin=ALL, broker=RWCD),       # /admin/controlled_shutdown/<b>
    "settings": _rule(admin=ALL),                           # /admin/settings (throttles, auto maintenance)
    "maintenance": _rule(admin=ALL, controller=R | W),      # /admin/maintenance (controller: automatic)
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
                "admin": "admin", "security": "security", "layout": "layout"}.get(head, "other")
    if head == "brokers":
        return "broker_ids" if n == 2 and parts[1] == "ids" else "broker" if n == 3 and parts[1] == "ids" else "other"
    if head in ("tasks", "status") and not is_bucket(parts[1]):
        return "other"
    if head == "tasks":
        return "task_bucket" if n == 2 else "task" if n == 3 else "owner" if n == 4 and parts[3] == "owner" else "other"
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
        return "status_bucket" if n == 2 else "status" if n == 3 else "other"
    if head == "intervals":
        return "interval" if n == 2 else "other"
    if head == "admin":
        if n == 2 and parts[1] in ("settings", "maintenance"):
            return parts[1]
        if parts[1] == "controlled_shutdown":
            return "shutdown_queue" if n == 2 else "shutdown_request" if n == 3 else "other"
        if parts[1] in ("rebalance", "reassign", "delete_tasks"):
            return "admin_queue" if n == 2 else "admin_request" if n == 3 else "other"
    return "other"


# With per-broker identities (``AclPolicy.per_broker``), each broker's own identity gets, per kind: (what every
# broker's identity gets, what the owning broker's identity gets on top). The owner is the broker that
# created the znode, or for ``/tasks/<t>`` the broker the controller assigned the task to. No broker's own
# identity gets DELETE on a container whose children are other brokers' (registrations, join requests,
# statuses, intervals): ephemerals vanish with their session and the controller deletes statuses. CREATE on
# such a container cannot be limited to one child name (ZooKeeper has no such right), so it stays with all.
PER_BROKER: dict[str, tuple[int, int]] = {
    "broker_ids": (R | C, 0),
    "broker": (R, R | W),
    "task": (R, R | C | D),          # the assignee creates and deletes its owner child; granted by the controller
    "owner": (R, R | W),
    "groups": (R | C, 0),
    "group": (R | C, 0),
    "members": (R | C, 0),
    "member": (R, R | W),
    "syncs": (R | C, 0),
    "sync": (R, R | W),
    "statuses": (R | C, 0),
    "status_bucket": (R | C, 0),
    "status": (R, R | W),            # the controller hands it to a task's new assignee
    "intervals": (R | C, 0),
    "interval": (R, R | W),
    "shutdown_queue": (R | C, 0),
    "shutdown_request": (R, R | W),
}
# what the controller needs on top with per-broker identities: ADMIN on a task, to hand it to its assignee
CONTROLLER_PER_BROKER: dict[str, int] = {"task": A}
# every kind whose shared broker rights are more than READ says what a broker's own identity gets instead
assert all(kind in PER_BROKER for kind, rule in RULES.items() if rule["broker"] != R)


# znodes named after the broker that creates them: their owner is in their path
NAMED_BY_OWNER = frozenset({"broker", "member", "interval", "shutdown_request"})


def acl_for(policy: AclPolicy, layout: ZkLayout, path: str, owner: str | None = None) -> list[ACL]:
    """The ACL a znode at ``path`` gets under ``policy`` (one entry per identity). ``owner`` is the broker
    whose own identities get the owner's rights (:data:`PER_BROKER`); None for a znode no broker owns. A
    znode named after a broker (:data:`NAMED_BY_OWNER`) is that broker's, whatever ``owner`` says."""
    kind = classify(layout, path)
    rule = RULES[kind]
    if kind in NAMED_BY_OWNER:  # whoever creates it, it is the broker's it is named after
        owner = path.rsplit("/", 1)[-1]
    perms: dict[str, int] = {}

    def grant(identities: Iterable[str], p: int) -> None:
        for i in identities:
            if p:
                perms[i] = perms.get(i, 0) | p

    for role in ROLES:
        grant(policy.shared_broker_ids() if role == "broker" else policy.ids(role), rule.get(role, 0))
    if policy.per_broker:
        every, own = PER_BROKER.get(kind, (R, 0))
        grant(policy.per_broker_ids(), every)
        if own:
            grant(policy.identities_of(owner), own)
        grant(policy.ids("controller"), CONTROLLER_PER_BROKER.get(kind, 0))
    if not perms:
        raise SecurityError("the ACL policy names no identity: it would lock everyone out")
    return [ACL(p, Id("digest", i)) for i, p in perms.items()]


def owner_in_acl(policy: AclPolicy, layout: ZkLayout, path: str, acls: Sequence[ACL]) -> str | None:
    """The broker that owns an existing znode: the one it is named after (a registration, a join request,
    intervals, a shutdown request), else the one its ACL gives the owner's rights to (None: no broker,
    or several: then no broker keeps them)."""
    kind = classify(layout, path)
    every, own = PER_BROKER.get(kind, (R, 0))
    extra = own & ~every
    if not policy.per_broker or not extra:
        return None
    if kind in NAMED_BY_OWNER:
        named = path.rsplit("/", 1)[-1]
        return named if policy.identities_of(named) else None
    owners = {policy.broker_of(a.id.id) for a in acls if a.id.scheme == "digest" and a.perms & extra}
    owners.discard(None)
    return owners.pop() if len(owners) == 1 else None


def expected_acl(policy: AclPolicy, layout: ZkLayout, path: str, current: Sequence[ACL] = ()) -> list[ACL]:
    """The policy's ACL for an existing znode: the owner its ACL names keeps the owner's rights."""
    return acl_for(policy, layout, path, owner_in_acl(policy, layout, path, current))


def grants_needed(assigned: Iterable[tuple[str, Iterable[str]]], granted: Mapping[str, str]) -> dict[str, str]:
    """Tasks whose ``/tasks/<t>`` (and status) must be handed to a new broker before the assignments
    ``(broker, tasks)`` are written: those not already granted to that broker (``granted``: task -> broker)."""
    out: dict[str, str] = {}
    for broker, tasks in assigned:
        for t in tasks:
            if granted.get(t) != broker:
                out[t] = broker
    return out


# ---- the client ------------------------------------------------------------------------------------

class SecureKazooClient(KazooClient):
    """A KazooClient that creates every znode with the policy's ACL for its path.

    The policy is read from ``<root>/security`` on first need (and again at most every ``refresh_s``
    while there is none: a cluster may be secured after its processes started). Without a policy,
    creates are left as they are (ZooKeeper's open ACL), which is the unsecured mode. The client knows its
    own digest identity: when the policy names it as one broker's, what it creates is that broker's
    (:data:`PER_BROKER`), so no other broker may rewrite it.
    """

    def __init__(self, root: str, *args: Any, refresh_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layout = ZkLayout(root)
        creds = [c for scheme, c in kwargs.get("auth_data") or () if scheme == "digest"]
        self.identity: str | None = digest_id(creds[0]) if creds else None
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
                return op._replace(acl=acl_for(policy, self.layout, op.path, policy.broker_of(self.identity)))
        return op

    @property
    def own_broker(self) -> str | None:
        """The broker id the policy gives this client's identity to (None: no single broker's)."""
        policy = self.policy
        return policy.broker_of(self.identity) if policy is not None else None

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
    if not policy.ids("controller"):
        raise SecurityError("the policy names no controller identity")
    if not policy.ids("broker") and not policy.per_broker:
        raise SecurityError("the policy names no broker identity (shared or of a single broker)")
    if own_credential is None or digest_id(own_credential) not in policy.ids("admin"):
        raise SecurityError("run `security init` with admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE) "
                            "that are among the policy's admin identities")
    created: list[str] = []
    laid_out = check_root(client, layout)  # a flat root is migrated first (LayoutError, nothing written)
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
    if not laid_out:  # the buckets in two multis, then the marker, each with the policy's ACL
        acl_of = lambda p: acl_for(policy, layout, p)  # noqa: E731
        created += create_buckets(client, layout, acl_of)
        write_layout_info(client, layout, acl_of(layout.layout_info))
        created.append(layout.layout_info)
    client.set(layout.security, policy.encode())
    n = 0
    refused: list[str] = []
    frontier = [layout.root]
    while frontier:  # bounded by the tree's size: each znode is in one frontier, once
        chunk, frontier = frontier[:ACL_WINDOW], frontier[ACL_WINDOW:]
        # a znode some broker owns (its owner znode, status, the task handed to it) stays that broker's
        if policy.per_broker:
            asked = [client.get_acls_async(p) for p in chunk]  # (all sent, then all answered: one round)
            current = [_outcome(r) for r in asked]
        else:
            current = [(((), None), None)] * len(chunk)  # (the ACL it has does not matter)
        sent = []
        for path, (got, err) in zip(chunk, current):
            if err is None:
                sent.append((path, client.set_acls_async(path, expected_acl(policy, layout, path, got[0])),
                             client.get_children_async(path)))
            elif isinstance(err, NoAuthError):
                refused.append(path)  # (not even its ACL may be read)
        for path, set_done, children in sent:
            _, err = _outcome(set_done)
            if isinstance(err, NoAuthError):  # someone took ADMIN away from us on this znode: report it,
                refused.append(path)          # secure the rest
            if err is not None:  # (or it is gone meanwhile)
                continue
            n += 1
            names, err = _outcome(children)
            if err is None:
                frontier += [f"{path.rstrip('/')}/{c}" for c in names]
    for path in refused:
        log.warning("security init: no ADMIN right on %s; its ACL is left as it is", path)
    counts = {r: len(policy.ids(r)) for r in ROLES}
    if policy.per_broker:
        counts["single-broker"] = len(policy.per_broker_ids())
    return InitResult(layout.root, created, n, counts, refused)


#: znodes whose ACL (and children) are asked for at once: the walk goes in pipelined rounds, not round trips
ACL_WINDOW = 500


def _outcome(pending: Any) -> tuple[Any, Exception | None]:
    """An async request's (value, None), or (None, NoNodeError | NoAuthError) for the two answers a walk of a
    live tree expects: a znode gone meanwhile, or one we may not touch. Anything else raises."""
    try:
        return pending.get(), None
    except (NoNodeError, NoAuthError) as exc:
        return None, exc


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
    frontier = [layout.root]
    seen = 0
    while frontier and seen < limit:  # bounded by ``limit`` znodes
        k = min(ACL_WINDOW, limit - seen)
        chunk, frontier = frontier[:k], frontier[k:]
        seen += len(chunk)
        pending = [(p, client.get_acls_async(p), client.get_children_async(p)) for p in chunk]
        for path, acls_done, children in pending:
            got, err = _outcome(acls_done)
            if isinstance(err, NoAuthError):  # (as below: not even its ACL may be read)
                wrong.append(path)
            if err is not None:
                continue
            acls = got[0]
            names, err = _outcome(children)
            if isinstance(err, NoAuthError):  # an ACL without READ for the admin is itself not the policy's
                wrong.append(path)
                continue
            if err is not None:
                continue
            frontier += [f"{path.rstrip('/')}/{c}" for c in names]
            want = {(a.perms, a.id.scheme, a.id.id) for a in expected_acl(policy, layout, path, acls)}
            have = {(a.perms, a.id.scheme, a.id.id) for a in acls}
            if want != have:
                wrong.append(path)
    return sorted(wrong)
