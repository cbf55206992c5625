"""The ACL policy, pure: the roles, the digest identities of each role and broker, and the permissions every
kind of znode gets. ``controller.zk.security`` turns these into kazoo ACLs and applies them (see its
docstring for the whole model)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.protocol.cluster.layout import ZkLayout, check_name, is_bucket
from controller.protocol.errors import ZkcError

ROLES = ("controller", "broker", "admin", "reader")
POLICY_VERSIONS = (1, 2)  # 1: roles only; 2: and identities of single brokers
# ZooKeeper's permission bits (org.apache.zookeeper.ZooDefs.Perms)
R, W, C, D, A = 1, 2, 4, 8, 16
ALL = R | W | C | D | A
# Brokers never get ADMIN (setACL): one broker must not be able to lock the admin or another broker out.
RWCD = R | W | C | D


class SecurityError(ZkcError, ValueError):
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
    digest = base64.b64encode(hashlib.sha1(f"{user}:{password}".encode()).digest()).decode()
    return f"{user}:{digest}"


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
    credential of a cluster that has not moved to per-broker identities) keeps the role's old rights.

    ``spark_users`` are the SASL user names of the Spark masters that keep their recovery state under
    ``<root>/spark``: Spark's ZooKeeper client (Curator) cannot send digest credentials, only SASL ones
    through a JAAS ``Client`` section, so its identity is ``sasl:<user>``, with rights on that subtree alone."""

    roles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    brokers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    broker_user: str | None = None
    spark_users: tuple[str, ...] = ()
    _owner: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_broker: dict[str, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.roles) - set(ROLES)
        if unknown:
            raise SecurityError(f"unknown role(s) {sorted(unknown)}: roles are {', '.join(ROLES)}")
        for role, ids in self.roles.items():
            for i in ids:
                _check_identity(f"role {role}", i)
        object.__setattr__(
            self, "brokers", {b: (v,) if isinstance(v, str) else tuple(v) for b, v in self.brokers.items()}
        )
        object.__setattr__(self, "spark_users", tuple(dict.fromkeys(self.spark_users)))
        for u in self.spark_users:
            if not isinstance(u, str) or not u or len(u) > 255 or any(c.isspace() or c in ":,=\"'" for c in u):
                raise SecurityError(f"Spark SASL user {u!r}: expected a user name (no spaces, ':', ',', '=', quotes)")
        owner: dict[str, str] = {}

        def claim(identity: str, broker: str) -> None:
            if owner.get(identity, broker) != broker:
                raise SecurityError(
                    f"identity {identity.partition(':')[0]!r} is given to two brokers ({owner[identity]}, {broker})"
                )
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
                raise SecurityError(
                    f"broker_user {self.broker_user!r} must contain '{{id}}' once (e.g. broker.{{id}}) and no ':'"
                )
            for i in self.ids("broker"):
                user = i.partition(":")[0]
                if len(user) > len(prefix) + len(suffix) and user.startswith(prefix) and user.endswith(suffix):
                    b = user[len(prefix) : len(user) - len(suffix)]
                    try:
                        claim(i, check_name("broker id", b))
                    except ValueError:
                        continue  # not a broker id: a shared identity that happens to look alike
        for i in owner:
            other = [r for r in ROLES if r != "broker" and i in self.ids(r)]
            if other:
                raise SecurityError(
                    f"identity {i.partition(':')[0]!r} is a broker's and also {other[0]}: "
                    "a broker's identity must have no other role"
                )
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

    def encode(self) -> bytes:
        """Version 1 while no broker has its own identity (processes of earlier releases read it); else 2."""
        body: dict[str, Any] = {"version": 1, "roles": {r: list(self.ids(r)) for r in ROLES}}
        if self.spark_users:  # (a key earlier releases ignore)
            body["spark_users"] = list(self.spark_users)
        if self.brokers or self.broker_user is not None:
            body.update(
                version=2, brokers={b: list(v) for b, v in sorted(self.brokers.items())}, broker_user=self.broker_user
            )
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> AclPolicy:
        try:
            body = json.loads(data.decode("utf-8"))
            version = body.get("version") if isinstance(body, dict) else None
            if version not in POLICY_VERSIONS or isinstance(version, bool):
                raise SecurityError(f"unsupported ACL policy version {version!r}")
            roles = body["roles"]
            if not isinstance(roles, dict) or not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in roles.values()
            ):
                raise SecurityError("ACL policy 'roles' must map role names to lists of digest identities")
            brokers = body.get("brokers", {}) if version >= 2 else {}
            if not isinstance(brokers, dict) or not all(
                isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
                for v in brokers.values()
            ):
                raise SecurityError("ACL policy 'brokers' must map broker ids to a digest identity or a list of them")
            pattern = body.get("broker_user") if version >= 2 else None
            if pattern is not None and not isinstance(pattern, str):
                raise SecurityError("ACL policy 'broker_user' must be a string like 'broker.{id}'")
            spark = body.get("spark_users", [])
            if not isinstance(spark, list) or not all(isinstance(u, str) for u in spark):
                raise SecurityError("ACL policy 'spark_users' must be a list of SASL user names")
            return cls(
                {r: tuple(v) for r, v in roles.items()},
                {b: (v,) if isinstance(v, str) else tuple(v) for b, v in brokers.items()},
                pattern,
                tuple(spark),
            )
        except (ValueError, KeyError, RecursionError, AttributeError) as exc:
            if isinstance(exc, SecurityError):
                raise
            raise SecurityError(f"unreadable ACL policy: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_credentials(
        cls,
        credentials: Mapping[str, Iterable[str]],
        brokers: Mapping[str, Iterable[str]] | None = None,
        broker_user: str | None = None,
    ) -> AclPolicy:
        """A policy from ``user:password`` credentials per role and per broker id (hashed here)."""
        return cls(
            {role: tuple(digest_id(c, f"{role} credential") for c in creds) for role, creds in credentials.items()},
            {b: tuple(digest_id(c, f"broker {b} credential") for c in creds) for b, creds in (brokers or {}).items()},
            broker_user,
        )


# ---- the ACL of every path ---------------------------------------------------------------------------
# (role -> permissions) per kind of znode; "*" = every role not named (READ for all roles by default)


def _rule(**perms: int) -> dict[str, int]:
    out = {r: R for r in ROLES}
    out["admin"] = R | A
    out.update({k: v for k, v in perms.items()})
    return out


RULES: dict[str, dict[str, int]] = {
    "root": _rule(admin=R | C | A, controller=R | C | D),
    "controller": _rule(controller=ALL),  # /controller, /controller_epoch
    "candidates": _rule(controller=ALL),  # /controller_candidates
    "candidate": _rule(controller=ALL),  # /controller_candidates/<id>
    "summary": _rule(controller=ALL),  # /cluster_summary (task counts, written under the epoch fence)
    "brokers": _rule(admin=R | C | A),  # /brokers
    # Containers a broker's credentials may create children in give the controller and the admin DELETE: a
    # child whose name is not ours (``names.legal_children``) is swept by the controller, or by the operator.
    "broker_ids": _rule(broker=R | C | D, controller=R | D, admin=R | D | A),  # /brokers/ids
    "broker": _rule(broker=RWCD),  # /brokers/ids/<b>
    "layout": _rule(admin=ALL),  # /layout (version, buckets)
    "tasks": _rule(admin=ALL, controller=R | D),  # /tasks
    "task_bucket": _rule(admin=ALL, controller=R | D),  # /tasks/<bucket>
    "task": _rule(
        admin=R | W | A, broker=R | C | D, controller=R | D
    ),  # /tasks/<bucket>/<t> (brokers: owner; controller: strays)
    "owner": _rule(broker=RWCD),  # /tasks/<bucket>/<t>/owner
    "groups": _rule(controller=ALL, broker=R | C, admin=R | D | A),  # /groups
    "group": _rule(controller=ALL, broker=R | C, admin=R | D | A),  # /groups/<g>
    "group_state": _rule(controller=ALL),  # /groups/<g>/state
    "members": _rule(broker=R | C | D, controller=R | D, admin=R | D | A),  # /groups/<g>/members
    "member": _rule(broker=RWCD),  # /groups/<g>/members/<m>
    "joins": _rule(controller=ALL),  # /groups/<g>/join
    "join": _rule(controller=ALL),  # /groups/<g>/join/<gen>
    "syncs": _rule(controller=ALL, broker=R | C),  # /groups/<g>/sync (controller deletes old gens)
    "sync": _rule(broker=RWCD),  # /groups/<g>/sync/<gen> (the leader's proposal)
    "assignments": _rule(controller=ALL),  # /groups/<g>/assignment
    "assignment": _rule(controller=ALL),  # /groups/<g>/assignment/<m>
    "statuses": _rule(admin=R | C | A, broker=R | C | D, controller=R | C | D),  # /status (admin: lays out buckets)
    "status_bucket": _rule(broker=R | C | D, controller=R | C | D, admin=R | D | A),  # /status/<bucket>
    "status": _rule(broker=RWCD, controller=ALL),  # /status/<bucket>/<t> (workers; controller: invalid specs)
    "intervals": _rule(broker=R | C | D, controller=R | D, admin=R | D | A),  # /intervals
    "interval": _rule(broker=RWCD),  # /intervals/<b>
    "admin": _rule(admin=ALL),  # /admin
    "admin_queue": _rule(admin=ALL, controller=R | D),  # /admin/{rebalance,reassign,delete_tasks,task_history}
    "admin_request": _rule(admin=ALL),  # their children
    # the operator's and the planned roll's requests: no broker may create one, not even for itself (a broker
    # leaves by saying so in its own join request); CREATE cannot be limited to one child name
    "shutdown_queue": _rule(admin=ALL, controller=R | C | D),  # /admin/controlled_shutdown
    "shutdown_request": _rule(admin=ALL, controller=ALL),  # /admin/controlled_shutdown/<b>
    "storage_queue": _rule(admin=ALL, broker=R),  # /admin/storage
    "storage_request": _rule(admin=ALL, broker=R | C),  # /admin/storage/<t>
    "storage_reply": _rule(admin=ALL, broker=RWCD),  # /admin/storage/<t>/{claim,result,miss-<b>}
    "tallies": _rule(admin=ALL),  # /admin/group_tasks
    "tally": _rule(admin=ALL),  # /admin/group_tasks/<g> (written by creates)
    "settings": _rule(admin=ALL),  # /admin/settings (throttles, auto maintenance)
    "maintenance": _rule(admin=ALL, controller=R | W),  # /admin/maintenance (controller: automatic)
    "roll": _rule(admin=ALL, controller=R | W),  # /admin/roll (the controller writes its progress)
    # /security (the policy): its digests are read by the processes that write ACLs naming them, never by the
    # read-only role (ZooKeeper's getACL shows a digest only to a caller with ADMIN on the znode)
    "security": _rule(admin=ALL, reader=0),
    "other": _rule(admin=ALL),  # anything else under the root
    # <root>/spark and below: the Spark masters' recovery state; their SASL identity gets RWCD here alone
    "spark": _rule(admin=ALL),
}
#: what the Spark masters' SASL identity (``AclPolicy.spark_users``) gets on a znode of the kind "spark"
SPARK_PERMS = RWCD


def classify(layout: ZkLayout, path: str) -> str:
    """The kind of znode ``path`` is, for :data:`RULES`."""
    base = "" if layout.root == "/" else layout.root
    if path == layout.root:
        return "root"
    if not path.startswith(base + "/"):
        return "other"
    parts = path[len(base) + 1 :].split("/")
    n, head = len(parts), parts[0]
    if n == 1:
        return {
            "controller": "controller",
            "controller_epoch": "controller",
            "controller_candidates": "candidates",
            "cluster_summary": "summary",
            "brokers": "brokers",
            "tasks": "tasks",
            "groups": "groups",
            "status": "statuses",
            "intervals": "intervals",
            "admin": "admin",
            "security": "security",
            "layout": "layout",
            "spark": "spark",
        }.get(head, "other")
    if head == "spark":
        return "spark"
    if head == "controller_candidates":
        return "candidate" if n == 2 else "other"
    if head == "brokers":
        return "broker_ids" if n == 2 and parts[1] == "ids" else "broker" if n == 3 and parts[1] == "ids" else "other"
    if head in ("tasks", "status") and not is_bucket(parts[1]):
        return "other"
    if head == "tasks":
        return "task_bucket" if n == 2 else "task" if n == 3 else "owner" if n == 4 and parts[3] == "owner" else "other"
    if head == "groups":
        if n == 2:
            return "group"
        kinds = {
            "state": ("group_state", None),
            "members": ("members", "member"),
            "join": ("joins", "join"),
            "sync": ("syncs", "sync"),
            "assignment": ("assignments", "assignment"),
        }
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
        if n == 2 and parts[1] in ("settings", "maintenance", "roll"):
            return parts[1]
        if parts[1] == "group_tasks":
            return "tallies" if n == 2 else "tally" if n == 3 else "other"
        if parts[1] == "storage":
            return (
                "storage_queue" if n == 2 else "storage_request" if n == 3 else "storage_reply" if n == 4 else "other"
            )
        if parts[1] == "controlled_shutdown":
            return "shutdown_queue" if n == 2 else "shutdown_request" if n == 3 else "other"
        if parts[1] in ("rebalance", "reassign", "delete_tasks", "task_history"):
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
    "task": (R, R | C | D),  # the assignee creates and deletes its owner child; granted by the controller
    "owner": (R, R | W),
    "groups": (R | C, 0),
    "group": (R | C, 0),
    "members": (R | C, 0),
    "member": (R, R | W),
    "syncs": (R | C, 0),
    "sync": (R, R | W),
    "statuses": (R | C, 0),
    "status_bucket": (R | C, 0),
    "status": (R, R | W),  # the controller hands it to a task's new assignee
    "intervals": (R | C, 0),
    "interval": (R, R | W),
    "storage_request": (R | C, 0),
    "storage_reply": (R, R | W | D),  # the broker that claimed or answered
}
# what the controller needs on top with per-broker identities: ADMIN on a task, to hand it to its assignee
CONTROLLER_PER_BROKER: dict[str, int] = {"task": A}
# every kind whose shared broker rights are more than READ says what a broker's own identity gets instead
assert all(kind in PER_BROKER for kind, rule in RULES.items() if rule["broker"] != R)


# znodes named after the broker that creates them: their owner is in their path
NAMED_BY_OWNER = frozenset({"broker", "member", "interval"})


def acl_perms(policy: AclPolicy, layout: ZkLayout, path: str, owner: str | None = None) -> dict[str, int]:
    """The permissions a znode at ``path`` gets under ``policy``, per digest identity. ``owner`` is the broker
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
    return perms


def sasl_perms(policy: AclPolicy, layout: ZkLayout, path: str) -> dict[str, int]:
    """The SASL identities (user -> permissions) a znode gets on top of ``acl_perms``' digest ones: the Spark
    masters' on ``<root>/spark`` and below, nothing elsewhere."""
    if classify(layout, path) != "spark":
        return {}
    return {u: SPARK_PERMS for u in policy.spark_users}


def grants_needed(assigned: Iterable[tuple[str, Iterable[str]]], granted: Mapping[str, str]) -> dict[str, str]:
    """Tasks whose ``/tasks/<t>`` (and status) must be handed to a new broker before the assignments
    ``(broker, tasks)`` are written: those not already granted to that broker (``granted``: task -> broker)."""
    out: dict[str, str] = {}
    for broker, tasks in assigned:
        for t in tasks:
            if granted.get(t) != broker:
                out[t] = broker
    return out
