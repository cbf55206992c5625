"""ZooKeeper digest authentication and ACLs: who may change what.

Roles (each is one or more ``digest`` identities, ``user:password`` credentials):

============  ===================================================================================
controller    ``/controller``, ``/controller_epoch``, group state, join results, assignments; deletes
              tasks and admin requests once handled; writes FAILED statuses of invalid task specs
broker        its registration, group membership (join requests, the leader's proposal), task owner
              znodes, task statuses, run intervals, claims and answers of storage requests
admin         the operator: tasks and admin requests (rebalance, controlled shutdown, reassign,
              delete); READ and ADMIN (setACL) everywhere, so ``zkctl security init`` can re-apply
              the policy; no WRITE on the controller's or the brokers' znodes
reader        read-only
============  ===================================================================================

Every role can read everything but the policy (``/security``: admins, the controller and brokers only); an
unauthenticated client can read nothing and change nothing.

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

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.serialization import Auth, Create, Create2, Transaction
from kazoo.security import ACL, Id

from controller.protocol.cluster.acl import (
    NAMED_BY_OWNER,
    PER_BROKER,
    ROLES,
    AclPolicy,
    R,
    SecurityError,
    acl_perms,
    classify,
    digest_id,
    parse_credential,
    sasl_perms,
)
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records.codecs import encode_epoch
from controller.zk.layout_io import check_root, create_buckets, write_layout_info

log = logging.getLogger(__name__)


def read_credential_file(path: str, source: str = "credentials file") -> str:
    """The one ``user:password`` line of a credentials file, checked. A path that names no file but looks
    like a credential (someone gave ``file:user:password``) is refused without being repeated."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError as exc:
        if ":" in path and not os.path.exists(path):
            raise SecurityError(
                f"{source}: no such file (the value looks like 'user:password': credentials never go "
                "on the command line or in a path; put them in a file readable only by you and give "
                "its path)"
            ) from None
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


def acl_for(policy: AclPolicy, layout: ZkLayout, path: str, owner: str | None = None) -> list[ACL]:
    """The ACL a znode at ``path`` gets under ``policy`` (one entry per identity; see ``acl_perms``)."""
    digest = [ACL(p, Id("digest", i)) for i, p in acl_perms(policy, layout, path, owner).items()]
    return digest + [ACL(p, Id("sasl", u)) for u, p in sasl_perms(policy, layout, path).items()]


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


# ---- the client ------------------------------------------------------------------------------------


class SecureKazooClient(KazooClient):  # type: ignore[misc]  # kazoo ships no types: its classes are Any
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
        raise SecurityError(
            "run `security init` with admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE) "
            "that are among the policy's admin identities"
        )
    created: list[str] = []
    laid_out = check_root(client, layout)  # a flat root is migrated first (LayoutError, nothing written)
    paths = [layout.root, layout.security, layout.controller_epoch, *_containers(layout)]
    if policy.spark_users:  # Spark would create these with an open ACL (Curator's default)
        paths += [spark_dir(layout), *(f"{spark_dir(layout)}/{d}" for d in SPARK_CONTAINERS)]
    for path in paths:
        if client.exists(path) is None:
            data = (
                policy.encode()
                if path == layout.security
                else encode_epoch(0)
                if path == layout.controller_epoch
                else b""
            )
            try:
                client.create(path, data, acl=acl_for(policy, layout, path), makepath=True)
                created.append(path)
            except Exception as exc:
                if type(exc).__name__ != "NodeExistsError":
                    raise
    if not laid_out:  # the buckets in two multis, then the marker, each with the policy's ACL
        acl_of = partial(acl_for, policy, layout)
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
                sent.append(
                    (
                        path,
                        client.set_acls_async(path, expected_acl(policy, layout, path, got[0])),
                        client.get_children_async(path),
                    )
                )
            elif isinstance(err, NoAuthError):
                refused.append(path)  # (not even its ACL may be read)
        for path, set_done, children in sent:
            _, err = _outcome(set_done)
            if isinstance(err, NoAuthError):  # someone took ADMIN away from us on this znode: report it,
                refused.append(path)  # secure the rest
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


#: the containers Spark's masters keep their state in, under ``<root>/spark``: the leader latch's, the recovery's
SPARK_CONTAINERS = ("leader_election", "master_status")
#: at most this many znodes under ``<root>/spark`` are looked at per ``seal_spark``
SPARK_WALK_LIMIT = 10_000


def spark_dir(layout: ZkLayout) -> str:
    return f"{layout.root.rstrip('/')}/spark"


def seal_spark(client: KazooClient, layout: ZkLayout, policy: AclPolicy) -> list[str]:
    """Give every znode under ``<root>/spark`` whose ACL differs the policy's (returned). Spark's Curator
    creates its znodes with ZooKeeper's open ACL, which would let any client rewrite the state a master
    deserializes when it takes the lead; run by an admin (``zkctl spark up`` every few seconds)."""
    fixed: list[str] = []
    frontier, seen = [spark_dir(layout)], 0
    while frontier and seen < SPARK_WALK_LIMIT:
        chunk, frontier = frontier[:ACL_WINDOW], frontier[ACL_WINDOW:]
        seen += len(chunk)
        asked = [(p, client.get_acls_async(p), client.get_children_async(p)) for p in chunk]
        for path, acls, children in asked:
            got, err = _outcome(acls)
            names, err2 = _outcome(children)
            if err is not None or err2 is not None:
                continue  # gone meanwhile (an ephemeral latch node), or not ours to see
            want = acl_for(policy, layout, path)
            if {(a.perms, a.id.scheme, a.id.id) for a in got[0]} != {(a.perms, a.id.scheme, a.id.id) for a in want}:
                _, err = _outcome(client.set_acls_async(path, want))
                if err is None:
                    fixed.append(path)
            frontier += [f"{path}/{c}" for c in names]
    return fixed


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
        parts = p[len(layout.root.rstrip("/")) :].strip("/").split("/")
        for i in range(1, len(parts) + 1):
            q = layout.root.rstrip("/") + "/" + "/".join(parts[:i])
            if q not in out:
                out.append(q)
    return out


def check_acls(
    client: KazooClient, layout: ZkLayout, policy: AclPolicy, limit: int = 100_000, credential: str | None = None
) -> list[str]:
    """Znodes under the root whose ACL differs from the policy's (empty = all as designed).

    Needs admin credentials: ZooKeeper shows the digests of an ACL only to a client with ADMIN on the
    znode, so any other credential would see every digest ACL as different (false alarms)."""
    if credential is None or digest_id(credential) not in policy.ids("admin"):
        raise SecurityError(
            "security check needs admin credentials (--zk-auth / ZKC_AUTH / ZKC_AUTH_FILE with an "
            "identity the policy lists as admin): ZooKeeper shows ACL digests only to clients with "
            "ADMIN on a znode, so any other credentials would report every znode as wrong"
        )
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
