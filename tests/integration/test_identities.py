"""Per-broker identities: one broker cannot take, delete or rewrite what another broker created, against the
real ZooKeeper (two workers with credentials of their own, a controller, the operator), while the cluster
keeps running every task once and tasks still move between them; and the ACL computation for every path,
the policy format and the hand-over bookkeeping, without ZooKeeper."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Id

from broker_sim.sim.checker import double_ownership
from broker_sim.worker import IdentityMismatch, Worker, WorkerConfig
from cli.main import cli
from controller.protocol import codecs
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group import GroupConfig
from controller.protocol.layout import ZkLayout
from controller.protocol.acl import NAMED_BY_OWNER, PER_BROKER, ROLES, RULES, AclPolicy, SecurityError, classify, digest_id, grants_needed
from controller.zk.security import acl_for, check_acls, expected_acl, init_security, owner_in_acl
from controller.protocol.taskspec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from tests.integration.test_security import CREDS, _denied, _remove_secured_root

R, W, C, D, A = 1, 2, 4, 8, 16
BROKER_CREDS = {b: f"broker.{b}:pw-of-{b}" for b in ("b0", "b1", "b2")}
SHARED = CREDS["broker"]


def _policy(shared: bool = True, pattern: bool = False) -> AclPolicy:
    roles = {r: [CREDS[r]] for r in ROLES if r != "broker"}
    roles["broker"] = [SHARED] if shared else []
    if pattern:  # identities listed in the broker role, recognised by user name
        roles["broker"] += list(BROKER_CREDS.values())
        return AclPolicy.from_credentials(roles, broker_user="broker.{id}")
    return AclPolicy.from_credentials(roles, {b: [c] for b, c in BROKER_CREDS.items()})


def _layout_paths(layout: ZkLayout) -> dict[str, str]:
    """One path of every kind (kind -> path)."""
    paths = {
        "root": layout.root, "controller": layout.controller, "brokers": layout.root + "/brokers",
        "broker_ids": layout.broker_ids, "broker": layout.broker("b0"), "tasks": layout.tasks, "task": layout.task("t"),
        "owner": layout.task_owner("t"), "groups": layout.groups, "group": layout.group("g"),
        "group_state": layout.group_state("g"), "members": layout.group_members("g"),
        "member": layout.group_member("g", "b0"), "joins": layout.group_joins("g"), "join": layout.group_join("g", 3),
        "syncs": layout.group_syncs("g"), "sync": layout.group_sync("g", 3),
        "assignments": layout.group_assignments("g"), "assignment": layout.group_assignment("g", "b0"),
        "statuses": layout.root + "/status", "status": layout.status("t"), "intervals": layout.root + "/intervals",
        "interval": layout.broker_intervals("b0"), "admin": layout.root + "/admin",
        "admin_queue": layout.admin_delete_tasks, "admin_request": layout.admin_reassign_of("t"),
        "shutdown_queue": layout.root + "/admin/controlled_shutdown",
        "shutdown_request": layout.admin_controlled_shutdown_of("b0"), "security": layout.security,
        "settings": layout.settings, "maintenance": layout.maintenance,
        "other": layout.root + "/elsewhere", "layout": layout.layout_info,
        "task_bucket": layout.task_bucket("t"), "status_bucket": layout.status_bucket("t"),
    }
    assert set(paths) == set(RULES)
    for kind, path in paths.items():
        assert classify(layout, path) == kind, path
    return paths


# ---- pure: the ACL of every path ---------------------------------------------------------------------

@pytest.mark.parametrize("pattern", [False, True])
def test_per_broker_acl_of_every_path(pattern):
    layout = ZkLayout("/zkc")
    policy = _policy(pattern=pattern)
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
            digest_id(CREDS[r]): RULES[kind][r] for r in ROLES}, kind
        # everyone reads, the reader only reads
        assert all(p & R for p in owned.values()) and owned[digest_id(CREDS["reader"])] == R
        # the owner's rights are recognised in an existing ACL (what `security init` keeps and `check` expects)
        if own & ~every:
            assert owner_in_acl(policy, layout, path, acl_for(policy, layout, path, owner="b0")) == "b0"
            assert owner_in_acl(policy, layout, path, acl_for(policy, layout, path)) == (
                "b0" if kind in NAMED_BY_OWNER else None)
            both = acl_for(policy, layout, path, "b0") + [ACL(every | own, Id("digest", other))]
            # two owners: the one the znode is named after (b0's registration...), else none
            assert owner_in_acl(policy, layout, path, both) == ("b0" if kind in NAMED_BY_OWNER else None)
            assert expected_acl(policy, layout, path, both) != both
        assert expected_acl(policy, layout, path, acl_for(policy, layout, path, "b0")) == acl_for(policy, layout, path, "b0")
    # what each broker creates for itself is WRITE for it alone; the task is its assignee's to take and let go
    for kind in ("broker", "member", "owner", "status", "interval", "shutdown_request", "sync"):
        assert PER_BROKER[kind] == (R, R | W), kind
    task = {a.id.id: a.perms for a in acl_for(policy, layout, layout.task("t"), owner="b1")}
    assert task[other] == R | C | D and task[me] == R and task[controller] & A
    assert {a.id.id: a.perms for a in acl_for(policy, layout, layout.task("t"))}[controller] == R | D | A
    # no broker's own identity may delete children of a container whose children are other brokers'
    for kind in ("broker_ids", "members", "statuses", "status_bucket", "intervals", "shutdown_queue", "syncs"):
        assert PER_BROKER[kind] == (R | C, 0), kind


def test_policy_versions_and_bad_policies():
    layout = ZkLayout("/zkc")
    v1 = AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES})
    assert json.loads(v1.encode())["version"] == 1  # readable by processes of earlier releases
    assert AclPolicy.decode(v1.encode()).roles == v1.roles
    for pattern in (False, True):
        p = _policy(pattern=pattern)
        body = json.loads(p.encode())
        assert body["version"] == 2
        back = AclPolicy.decode(p.encode())
        assert back.per_broker_ids() == p.per_broker_ids() and back.shared_broker_ids() == (digest_id(SHARED),)
        assert all(acl_for(back, layout, x, "b1") == acl_for(p, layout, x, "b1") for x in _layout_paths(layout).values())
    # one identity string per broker is accepted as well as a list (several: a credential being rotated)
    body = json.loads(_policy().encode())
    body["brokers"]["b0"] = digest_id(BROKER_CREDS["b0"])
    body["brokers"]["b1"] = [digest_id(BROKER_CREDS["b1"]), digest_id("broker.b1:new-pw")]
    p = AclPolicy.decode(json.dumps(body).encode())
    assert p.identities_of("b0") == (digest_id(BROKER_CREDS["b0"]),) and len(p.identities_of("b1")) == 2
    assert p.broker_of(digest_id("broker.b1:new-pw")) == "b1"
    # a pattern matches only broker-role identities whose user name fits and yields a legal broker id
    p = AclPolicy.from_credentials({"broker": ["broker.b9:x", "broker.:y", "other:z"], "controller": ["c:1"],
                                    "admin": ["a:1"]}, broker_user="broker.{id}")
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


# ---- against ZooKeeper ---------------------------------------------------------------------------

@pytest.fixture
def per_broker(zk_hosts: str, zk_root: str):
    """A root secured with a policy naming b0's and b1's own identities (and the shared broker one)."""
    layout = ZkLayout(zk_root)
    policy = _policy()
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
    _remove_secured_root(zk_hosts, layout)


def _settings(zk_hosts: str, zk_root: str, cred: str) -> ZkSettings:
    return ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=cred)


def test_one_broker_cannot_take_or_touch_another_brokers_znodes(per_broker, zk_hosts, zk_root):
    layout, policy, client = per_broker
    admin = AdminClient(client(CREDS["admin"]), layout)
    tasks = [f"t{i}" for i in range(6)]
    admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    ctl = Controller(ControllerConfig("c0", _settings(zk_hosts, zk_root, CREDS["controller"]),
                                      GroupConfig(rebalance_timeout_s=3.0))).start()
    workers = {b: Worker(WorkerConfig(broker_id=b, settings=_settings(zk_hosts, zk_root, BROKER_CREDS[b]),
                                      status_interval_s=0.2, intervals_flush_s=0.3)).start()
               for b in ("b0", "b1")}
    a, b = workers["b0"], workers["b1"]
    reader = client(CREDS["reader"])

    def running_once() -> bool:
        ra, rb = a.running_tasks(), b.running_tasks()
        return not ra & rb and ra | rb == set(tasks)

    def statuses_of(w: Worker) -> bool:
        """Each task ``w`` runs has its owner znode and a status written by ``w``."""
        try:
            return all(codecs.decode(codecs.TaskStatus, reader.get(layout.status(t))[0], "s").broker == w.id
                       and reader.exists(layout.task_owner(t)) is not None for t in w.running_tasks())
        except NoNodeError:
            return False
    try:
        assert ctl.wait_active(10)
        assert wait_for(lambda: running_once() and a.running_tasks() and b.running_tasks()
                        and a.state() == b.state() == "Stable" and statuses_of(a) and statuses_of(b), 30), \
            "the cluster with per-broker identities did not converge"
        # every znode carries the policy's ACL, the owner's rights with the broker that owns it
        assert check_acls(client(CREDS["admin"]), layout, policy, credential=CREDS["admin"]) == []
        tb = sorted(b.running_tasks())[0]
        assert policy.broker_of(digest_id(BROKER_CREDS["b1"])) == "b1"
        acls, _ = client(CREDS["admin"]).get_acls(layout.task(tb))
        assert owner_in_acl(policy, layout, layout.task(tb), acls) == "b1"

        # broker A (b0's own credentials, our client) against B's znodes: NoAuth every time
        za = client(BROKER_CREDS["b0"])
        owner_before = reader.get(layout.task_owner(tb))
        b_paths = [layout.task_owner(tb), layout.broker("b1"), layout.group_member("default", "b1"),
                   layout.status(tb)]
        for path in b_paths:
            assert _denied(lambda: za.delete(path)), path
            assert _denied(lambda: za.set(path, b"{}")), path
        assert wait_for(lambda: reader.exists(layout.broker_intervals("b1")) is not None, 10)
        assert _denied(lambda: za.set(layout.broker_intervals("b1"), b"{}"))
        # nor take B's task by creating its owner znode, nor hand B's task to itself
        assert _denied(lambda: za.create(layout.task_owner(tb) + "-x", b"{}", ephemeral=True))
        assert _denied(lambda: za.set_acls(layout.task(tb), acl_for(policy, layout, layout.task(tb), "b0")))
        # the shared broker credentials cannot change an existing znode's ACL either (no ADMIN)
        assert _denied(lambda: client(SHARED).set_acls(layout.status(tb), acl_for(policy, layout, layout.status(tb), "b0")))
        # B's znodes are as they were, and every task still runs exactly once
        assert reader.get(layout.task_owner(tb)) == owner_before
        assert running_once() and tb in b.running_tasks()

        # a task moved from B to A (reassign): B lets go, the controller hands the task to A, A takes it
        admin.reassign(tb, to="b0", wait=15)
        assert wait_for(lambda: tb in a.running_tasks() and running_once() and statuses_of(a), 30), \
            "the reassigned task did not move"
        acls, _ = client(CREDS["admin"]).get_acls(layout.task(tb))
        assert owner_in_acl(policy, layout, layout.task(tb), acls) == "b0"
        zb = client(BROKER_CREDS["b1"])  # now B cannot touch it
        assert _denied(lambda: zb.delete(layout.task_owner(tb)))
        assert _denied(lambda: zb.set(layout.status(tb), b"{}"))
        # B's controlled shutdown moves everything else to A
        b.request_shutdown()
        assert wait_for(lambda: b.exited.is_set() and a.running_tasks() == set(tasks) and statuses_of(a), 40), \
            "the controlled shutdown did not move B's tasks"
        assert check_acls(client(CREDS["admin"]), layout, policy, credential=CREDS["admin"]) == []
        intervals = [i for w in (a, b) for i in list(w.intervals) + w.open_intervals()]
        assert double_ownership(intervals) == []
    finally:
        for w in workers.values():
            w.stop()
        ctl.stop()


def test_init_and_check_walk_a_root_larger_than_their_window_and_report_what_they_may_not_touch(per_broker):
    """``security init`` and ``check`` walk the tree in pipelined rounds of ``ACL_WINDOW`` znodes: every znode
    of a root larger than one round is checked and set; one whose ACL denies us ADMIN is reported (init's
    ``refused``, check's list) and the rest secured all the same."""
    from kazoo.security import OPEN_ACL_UNSAFE, Permissions

    from controller.zk.security import ACL_WINDOW

    layout, policy, client = per_broker
    admin = client(CREDS["admin"])
    tasks = [f"w{i}" for i in range(ACL_WINDOW + 200)]
    AdminClient(admin, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    opened = [layout.task(t) for t in tasks]  # every one wrong: the walks must reach them all
    for pending in [admin.set_acls_async(path, OPEN_ACL_UNSAFE) for path in opened]:
        pending.get()
    foreign = layout.root + "/foreign"
    admin.create(foreign, b"")  # (created with the policy's ACL: our client sees to that), then taken from us
    admin.set_acls(foreign, [ACL(Permissions.READ, Id("world", "anyone"))])
    try:
        assert check_acls(admin, layout, policy, credential=CREDS["admin"]) == sorted(opened + [foreign])
        result = init_security(admin, layout, policy, CREDS["admin"])
        assert result.refused == [foreign]
        stack, znodes = [layout.root], 0
        while stack:  # (a plain walk, one znode at a time)
            path = stack.pop()
            znodes += 1
            stack += [f"{path.rstrip('/')}/{c}" for c in admin.get_children(path)]
        assert result.acls_set == znodes - 1  # every znode but the one refused
        assert check_acls(admin, layout, policy, credential=CREDS["admin"]) == [foreign]
    finally:
        admin.set_acls(layout.root, OPEN_ACL_UNSAFE)  # (the root's ADMIN is ours: it may take DELETE, which the
        admin.delete(foreign)                          # policy leaves out, to remove a znode it cannot touch)


def test_a_broker_with_another_brokers_credentials_does_not_start(per_broker, zk_hosts, zk_root):
    layout, _policy_, client = per_broker
    w = Worker(WorkerConfig(broker_id="b1", settings=_settings(zk_hosts, zk_root, BROKER_CREDS["b0"])))
    try:
        with pytest.raises(IdentityMismatch, match="broker b0's own"):
            w.start()
        assert client(CREDS["reader"]).exists(layout.broker("b1")) is None
    finally:
        w.stop(graceful=False)


def test_cli_init_check_and_digest_with_per_broker_identities(zk_hosts, zk_root, tmp_path, monkeypatch):
    runner = CliRunner()
    for var in ("ZKC_AUTH", "ZKC_AUTH_FILE"):
        monkeypatch.delenv(var, raising=False)
    base = ["--zk", zk_hosts, "--zk-root", zk_root]
    files = {}
    for name, cred in [*((r, CREDS[r]) for r in ROLES), *BROKER_CREDS.items()]:
        files[name] = tmp_path / f"{name}.cred"
        files[name].write_text(cred + "\n")
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["b2"]), "security", "digest", "--broker", "b2"])
    assert res.exit_code == 0 and res.output.strip() == f"b2={digest_id(BROKER_CREDS['b2'])}", res.output
    assert "pw-of" not in res.output
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["b2"]), "security", "digest", "--broker", "bad/id"])
    assert res.exit_code == 1 and "invalid broker id" in res.output
    args = ["--controller-auth-file", str(files["controller"]), "--admin-auth-file", str(files["admin"]),
            "--reader-auth-file", str(files["reader"]), "--broker-id-auth-file", f"b0={files['b0']}",
            "--broker-id-digest", f"b2={digest_id(BROKER_CREDS['b2'])}",
            "--broker-digest", digest_id(BROKER_CREDS["b1"]), "--broker-user", "broker.{id}"]
    bad = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "init",
                                     "--broker-id-digest", "no-equals-sign", *args])
    assert bad.exit_code == 1 and "ID=VALUE" in bad.output
    try:
        res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "init", *args])
        assert res.exit_code == 0, res.output
        assert "single-broker 3" in res.output
        admin = make_client(ZkSettings(hosts=zk_hosts, root=zk_root, auth=CREDS["admin"]))
        try:
            policy = AclPolicy.decode(admin.get(ZkLayout(zk_root).security)[0])
            assert {policy.broker_of(digest_id(c)) for c in BROKER_CREDS.values()} == {"b0", "b1", "b2"}
            # b1 (recognised by its user name) registers: its registration is its own, and check agrees
            layout = ZkLayout(zk_root)
            b1 = make_client(ZkSettings(hosts=zk_hosts, root=zk_root, auth=BROKER_CREDS["b1"]))
            try:
                b1.create(layout.broker("b1"), b"{}", ephemeral=True)
                res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "check"])
                assert res.exit_code == 0, res.output
                # an ACL that also lets b0 write b1's registration is not the policy's: check names it
                acls, _ = admin.get_acls(layout.broker("b1"))
                admin.set_acls(layout.broker("b1"), list(acls) + [ACL(R | W, Id("digest", digest_id(BROKER_CREDS["b0"])))])
                res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "check"])
                assert res.exit_code == 1 and layout.broker("b1") in res.output
                # init again puts it right, keeping the registration b1's
                res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "init", *args])
                assert res.exit_code == 0, res.output
                acls, _ = admin.get_acls(layout.broker("b1"))
                assert owner_in_acl(policy, layout, layout.broker("b1"), acls) == "b1"
                res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "check"])
                assert res.exit_code == 0, res.output
            finally:
                b1.stop()
                b1.close()
        finally:
            admin.stop()
            admin.close()
    finally:
        _remove_secured_root(zk_hosts, ZkLayout(zk_root))
