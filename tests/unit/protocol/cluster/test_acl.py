"""The ACL of every ZooKeeper path, computed without ZooKeeper: which role (and which broker's own identity)
gets which permission on each kind of znode, the policy format with its versions and the policies refused, and
the hand-over bookkeeping of task grants. Applied to a real ZooKeeper: tests/integration/security/test_security.py and
tests/integration/security/test_identities.py."""

from __future__ import annotations

import json

import pytest
from kazoo.security import ACL, Id

from controller.protocol.cluster.acl import (
    NAMED_BY_OWNER,
    PER_BROKER,
    ROLES,
    RULES,
    AclPolicy,
    SecurityError,
    classify,
    digest_id,
    grants_needed,
)
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.security import acl_for, expected_acl, owner_in_acl
from tests.security_support import BROKER_CREDS, CREDS, SHARED, A, C, D, R, W, broker_policy


def test_acl_of_every_layout_path():
    layout = ZkLayout("/zkc")
    policy = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    ids = {r: digest_id(CREDS[r]) for r in ROLES}

    def perms(path: str) -> dict[str, int]:
        return {next(r for r in ROLES if ids[r] == a.id.id): a.perms for a in acl_for(policy, layout, path)}

    write, create, delete = 2, 4, 8
    kinds = {
        layout.root: "root",
        layout.controller: "controller",
        layout.controller_epoch: "controller",
        layout.cluster_summary: "summary",
        layout.broker_ids: "broker_ids",
        layout.broker("b"): "broker",
        layout.tasks: "tasks",
        layout.task("t"): "task",
        layout.task_owner("t"): "owner",
        layout.group_state("g"): "group_state",
        layout.group_member("g", "m"): "member",
        layout.group_join("g", 3): "join",
        layout.group_sync("g", 3): "sync",
        layout.group_assignment("g", "m"): "assignment",
        layout.status("t"): "status",
        layout.broker_intervals("b"): "interval",
        layout.admin_reassign_of("t"): "admin_request",
        layout.admin_controlled_shutdown_of("b"): "shutdown_request",
        layout.security: "security",
        "/elsewhere": "other",
    }
    for path, kind in kinds.items():
        assert classify(layout, path) == kind, path
    # the controller's znodes: only the controller writes
    for path in (layout.controller_epoch, layout.group_state("g"), layout.group_assignment("g", "m")):
        p = perms(path)
        assert [r for r in ROLES if p.get(r, 0) & write] == ["controller"], path
    # ZooKeeper checks CREATE/DELETE on the parent
    assert perms(layout.tasks)["admin"] & (create | delete) and perms(layout.tasks)["controller"] & delete
    assert not perms(layout.tasks)["broker"] & create
    assert perms(layout.task("t"))["broker"] & (create | delete)  # the owner child
    assert perms(layout.broker_ids)["broker"] & create and not perms(layout.broker_ids)["admin"] & write
    assert perms(layout.root)["controller"] & (create | delete)  # /controller, /controller_epoch
    # everyone reads, the reader only reads; the policy's digests are not the read-only role's
    for path, kind in kinds.items():
        readers = [r for r in ROLES if r != "reader"] if kind == "security" else ROLES
        assert all(perms(path).get(r, 0) & 1 for r in readers)
        assert perms(path).get("reader", 0) == (0 if kind == "security" else 1)


def _layout_paths(layout: ZkLayout) -> dict[str, str]:
    """One path of every kind (kind -> path)."""
    paths = {
        "root": layout.root,
        "controller": layout.controller,
        "brokers": layout.root + "/brokers",
        "broker_ids": layout.broker_ids,
        "broker": layout.broker("b0"),
        "tasks": layout.tasks,
        "task": layout.task("t"),
        "owner": layout.task_owner("t"),
        "groups": layout.groups,
        "group": layout.group("g"),
        "group_state": layout.group_state("g"),
        "members": layout.group_members("g"),
        "member": layout.group_member("g", "b0"),
        "joins": layout.group_joins("g"),
        "join": layout.group_join("g", 3),
        "syncs": layout.group_syncs("g"),
        "sync": layout.group_sync("g", 3),
        "assignments": layout.group_assignments("g"),
        "assignment": layout.group_assignment("g", "b0"),
        "statuses": layout.root + "/status",
        "status": layout.status("t"),
        "intervals": layout.root + "/intervals",
        "interval": layout.broker_intervals("b0"),
        "admin": layout.root + "/admin",
        "admin_queue": layout.admin_delete_tasks,
        "admin_request": layout.admin_reassign_of("t"),
        "shutdown_queue": layout.root + "/admin/controlled_shutdown",
        "shutdown_request": layout.admin_controlled_shutdown_of("b0"),
        "storage_queue": layout.admin_storage,
        "storage_request": layout.storage_request("t"),
        "storage_reply": layout.storage_result("t"),
        "security": layout.security,
        "summary": layout.cluster_summary,
        "settings": layout.settings,
        "maintenance": layout.maintenance,
        "roll": layout.admin_roll,
        "tallies": layout.group_tallies,
        "tally": layout.group_tally("g"),
        "other": layout.root + "/elsewhere",
        "layout": layout.layout_info,
        "task_bucket": layout.task_bucket("t"),
        "status_bucket": layout.status_bucket("t"),
        "candidates": layout.controller_candidates,
        "candidate": layout.controller_candidate("c1"),
        "spark": layout.root + "/spark/master_status/app_1",
    }
    assert set(paths) == set(RULES)
    for kind, path in paths.items():
        assert classify(layout, path) == kind, path
    return paths


@pytest.mark.parametrize("pattern", [False, True])
def test_per_broker_acl_of_every_path(pattern):
    layout = ZkLayout("/zkc")
    policy = broker_policy(pattern=pattern)
    me, other = digest_id(BROKER_CREDS["b0"]), digest_id(BROKER_CREDS["b1"])
    shared, controller = digest_id(SHARED), digest_id(CREDS["controller"])
    v1 = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    assert policy.per_broker and not v1.per_broker
    assert policy.broker_of(me) == "b0" and policy.broker_of(shared) is None
    for kind, path in _layout_paths(layout).items():
        owned = {a.id.id: a.perms for a in acl_for(policy, layout, path, owner="b0")}
        unowned = {a.id.id: a.perms for a in acl_for(policy, layout, path)}
        every, own = PER_BROKER.get(kind, (R, 0))
        # another broker's own identity only ever gets what every broker gets: never WRITE on b0's znodes,
        # never DELETE anywhere (ZooKeeper checks DELETE on the parent), CREATE only on shared containers
        assert owned[other] == every == unowned[other], kind
        assert not owned[other] & (W | D | A), kind
        assert owned[me] == every | own, kind
        # a znode named after a broker is that broker's whoever creates it; any other needs an owner
        assert unowned[me] == (every | own if kind in NAMED_BY_OWNER else every), kind
        named_b1 = {a.id.id: a.perms for a in acl_for(policy, layout, path.replace("b0", "b1"), owner="b0")}
        if kind in NAMED_BY_OWNER:
            assert named_b1[me] == every and named_b1[other] == every | own, kind
        # the shared broker identity keeps the role's old rights, and a policy without per-broker
        # identities computes what it always did
        assert owned[shared] == RULES[kind]["broker"], kind
        assert {a.id.id: a.perms for a in acl_for(v1, layout, path, owner="b0")} == {
            digest_id(CREDS[r]): RULES[kind][r] for r in ROLES if RULES[kind][r]
        }, kind
        # everyone reads, the reader only reads (not the policy's digests)
        assert all(p & R for p in owned.values())
        assert owned.get(digest_id(CREDS["reader"]), 0) == (0 if kind == "security" else R)
        # the owner's rights are recognised in an existing ACL (what `security init` keeps and `check` expects)
        if own & ~every:
            assert owner_in_acl(policy, layout, path, acl_for(policy, layout, path, owner="b0")) == "b0"
            assert owner_in_acl(policy, layout, path, acl_for(policy, layout, path)) == (
                "b0" if kind in NAMED_BY_OWNER else None
            )
            both = acl_for(policy, layout, path, "b0") + [ACL(every | own, Id("digest", other))]
            # two owners: the one the znode is named after (b0's registration...), else none
            assert owner_in_acl(policy, layout, path, both) == ("b0" if kind in NAMED_BY_OWNER else None)
            assert expected_acl(policy, layout, path, both) != both
        assert expected_acl(policy, layout, path, acl_for(policy, layout, path, "b0")) == acl_for(
            policy, layout, path, "b0"
        )
    # what each broker creates for itself is WRITE for it alone; the task is its assignee's to take and let go
    for kind in ("broker", "member", "owner", "status", "interval", "sync"):
        assert PER_BROKER[kind] == (R, R | W), kind
    task = {a.id.id: a.perms for a in acl_for(policy, layout, layout.task("t"), owner="b1")}
    assert task[other] == R | C | D and task[me] == R and task[controller] & A
    assert {a.id.id: a.perms for a in acl_for(policy, layout, layout.task("t"))}[controller] == R | D | A
    # no broker's own identity may delete children of a container whose children are other brokers'
    for kind in ("broker_ids", "members", "statuses", "status_bucket", "intervals", "syncs"):
        assert PER_BROKER[kind] == (R | C, 0), kind
    # a controlled-shutdown request is the operator's or the controller's (a broker leaves by its join request)
    for kind in ("shutdown_queue", "shutdown_request"):
        assert kind not in PER_BROKER and not RULES[kind]["broker"] & ~R, kind


def test_policy_versions_and_bad_policies():
    layout = ZkLayout("/zkc")
    v1 = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    assert json.loads(v1.encode())["version"] == 1  # readable by processes of earlier releases
    assert AclPolicy.decode(v1.encode()).roles == v1.roles
    for pattern in (False, True):
        p = broker_policy(pattern=pattern)
        body = json.loads(p.encode())
        assert body["version"] == 2
        back = AclPolicy.decode(p.encode())
        assert back.per_broker_ids() == p.per_broker_ids() and back.shared_broker_ids() == (digest_id(SHARED),)
        assert all(
            acl_for(back, layout, x, "b1") == acl_for(p, layout, x, "b1") for x in _layout_paths(layout).values()
        )
    # one identity string per broker is accepted as well as a list (several: a credential being rotated)
    body = json.loads(broker_policy().encode())
    body["brokers"]["b0"] = digest_id(BROKER_CREDS["b0"])
    body["brokers"]["b1"] = [digest_id(BROKER_CREDS["b1"]), digest_id("broker.b1:new-pw")]
    p = AclPolicy.decode(json.dumps(body).encode())
    assert p.identities_of("b0") == (digest_id(BROKER_CREDS["b0"]),) and len(p.identities_of("b1")) == 2
    assert p.broker_of(digest_id("broker.b1:new-pw")) == "b1"
    # a pattern matches only broker-role identities whose user name fits and yields a legal broker id
    p = AclPolicy.from_credentials(
        {"broker": ["broker.b9:x", "broker.:y", "other:z"], "controller": ["c:1"], "admin": ["a:1"]},
        broker_user="broker.{id}",
    )
    assert p.per_broker_ids() == (digest_id("broker.b9:x"),) and len(p.shared_broker_ids()) == 2
    bad = [
        lambda: AclPolicy.from_credentials({"broker": []}, {"b0": [BROKER_CREDS["b0"]], "b1": [BROKER_CREDS["b0"]]}),
        lambda: AclPolicy.from_credentials({"admin": [BROKER_CREDS["b0"]]}, {"b0": [BROKER_CREDS["b0"]]}),
        lambda: AclPolicy({}, {"bad/id": ("u:d",)}),
        lambda: AclPolicy({}, {"b0": ()}),
        lambda: AclPolicy({}, {"b0": ("no-digest",)}),
        lambda: AclPolicy({}, {}, "broker.{id}.{id}"),
        lambda: AclPolicy({}, {}, "no-placeholder"),
        lambda: AclPolicy.decode(json.dumps({"version": 2, "roles": {}, "brokers": ["b0"]}).encode()),
        lambda: AclPolicy.decode(json.dumps({"version": 2, "roles": {}, "brokers": {"b0": 5}}).encode()),
        lambda: AclPolicy.decode(json.dumps({"version": 2, "roles": {}, "broker_user": 3}).encode()),
        lambda: AclPolicy.decode(json.dumps({"version": 3, "roles": {}}).encode()),
        lambda: AclPolicy.decode(json.dumps({"version": True, "roles": {}}).encode()),
    ]
    for make in bad:
        with pytest.raises(SecurityError) as exc:
            make()
        assert "pw-of" not in str(exc.value)
    # version 1 ignores fields it does not know (a v1 reader would): no per-broker identities
    assert not AclPolicy.decode(json.dumps({"version": 1, "roles": {}, "brokers": {"b0": "u:d"}}).encode()).per_broker


def test_grants_needed_hands_over_only_what_changed_hands():
    granted = {"t1": "b0", "t2": "b1"}
    assert grants_needed([("b0", ("t1",)), ("b1", ("t2",))], granted) == {}
    assert grants_needed([("b0", ("t1", "t2", "t3")), ("b1", ())], granted) == {"t2": "b0", "t3": "b0"}
    assert grants_needed([("b1", ("t1",))], {}) == {"t1": "b1"}  # after a failover: everything it assigns


def test_the_spark_masters_sasl_identity_may_change_their_subtree_and_nothing_else():
    layout = ZkLayout("/zkc")
    p = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    p = AclPolicy(p.roles, spark_users=("spark", "spark"))
    assert p.spark_users == ("spark",)
    back = AclPolicy.decode(p.encode())
    assert back.spark_users == ("spark",) and json.loads(p.encode())["version"] == 1  # earlier readers ignore it
    spark_paths = ["/zkc/spark", "/zkc/spark/leader_election", "/zkc/spark/master_status/worker_w1"]
    for path in spark_paths:
        assert classify(layout, path) == "spark", path
        acl = acl_for(back, layout, path)
        assert [(a.perms, a.id.id) for a in acl if a.id.scheme == "sasl"] == [(R | W | C | D, "spark")], path
        admin = next(a for a in acl if a.id.id == digest_id(CREDS["admin"]))
        assert admin.perms == R | W | C | D | A  # the admin may repair or remove Spark's state
    for path in [x for x in _layout_paths(layout).values() if classify(layout, x) != "spark"] + ["/zkc/sparkle"]:
        assert all(a.id.scheme == "digest" for a in acl_for(back, layout, path)), path
    for bad in ("", "a b", "a:b", 'q"', "x" * 300):
        with pytest.raises(SecurityError):
            AclPolicy({}, spark_users=(bad,))
    with pytest.raises(SecurityError):
        AclPolicy.decode(json.dumps({"version": 1, "roles": {}, "spark_users": "spark"}).encode())
