"""Per-broker identities: one broker cannot take, delete or rewrite what another broker created, against the
real ZooKeeper (two workers with credentials of their own, a controller, the operator), while the cluster
keeps running every task once and tasks still move between them. (The ACL computation for every path, the
policy format and the hand-over bookkeeping, without ZooKeeper: tests/unit/protocol/cluster/test_acl.py.)"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, Id

from broker_sim.sim.checker import double_ownership
from broker_sim.worker import IdentityMismatch, Worker, WorkerConfig
from cli.main import cli
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.acl import ROLES, AclPolicy, digest_id
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.security import acl_for, check_acls, init_security, owner_in_acl
from tests.integration.security.test_security import _denied
from tests.security_fixtures import remove_secured_root
from tests.security_support import BROKER_CREDS, CREDS, SHARED, R, W


# ---- against ZooKeeper ---------------------------------------------------------------------------
def _settings(zk_hosts: str, zk_root: str, cred: str) -> ZkSettings:
    return ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=cred)


def test_one_broker_cannot_take_or_touch_another_brokers_znodes(per_broker, zk_hosts, zk_root):
    layout, policy, client = per_broker
    admin = AdminClient(client(CREDS["admin"]), layout)
    tasks = [f"t{i}" for i in range(6)]
    admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    ctl = Controller(
        ControllerConfig("c0", _settings(zk_hosts, zk_root, CREDS["controller"]), GroupConfig(rebalance_timeout_s=3.0))
    ).start()
    workers = {
        b: Worker(
            WorkerConfig(
                broker_id=b,
                settings=_settings(zk_hosts, zk_root, BROKER_CREDS[b]),
                status_interval_s=0.2,
                intervals_flush_s=0.3,
            )
        ).start()
        for b in ("b0", "b1")
    }
    a, b = workers["b0"], workers["b1"]
    reader = client(CREDS["reader"])

    def running_once() -> bool:
        ra, rb = a.running_tasks(), b.running_tasks()
        return not ra & rb and ra | rb == set(tasks)

    def statuses_of(w: Worker) -> bool:
        """Each task ``w`` runs has its owner znode and a status written by ``w``."""
        try:
            return all(
                codecs.decode(task_records.TaskStatus, reader.get(layout.status(t))[0], "s").broker == w.id
                and reader.exists(layout.task_owner(t)) is not None
                for t in w.running_tasks()
            )
        except NoNodeError:
            return False

    try:
        assert ctl.wait_active(10)
        assert wait_for(
            lambda: (
                running_once()
                and a.running_tasks()
                and b.running_tasks()
                and a.state() == b.state() == "Stable"
                and statuses_of(a)
                and statuses_of(b)
            ),
            30,
        ), "the cluster with per-broker identities did not converge"
        # every znode carries the policy's ACL, the owner's rights with the broker that owns it
        assert check_acls(client(CREDS["admin"]), layout, policy, credential=CREDS["admin"]) == []
        tb = sorted(b.running_tasks())[0]
        assert policy.broker_of(digest_id(BROKER_CREDS["b1"])) == "b1"
        acls, _ = client(CREDS["admin"]).get_acls(layout.task(tb))
        assert owner_in_acl(policy, layout, layout.task(tb), acls) == "b1"

        # broker A (b0's own credentials, our client) against B's znodes: NoAuth every time
        za = client(BROKER_CREDS["b0"])
        owner_before = reader.get(layout.task_owner(tb))
        b_paths = [layout.task_owner(tb), layout.broker("b1"), layout.group_member("default", "b1"), layout.status(tb)]
        for path in b_paths:
            assert _denied(lambda: za.delete(path)), path
            assert _denied(lambda: za.set(path, b"{}")), path
        assert wait_for(lambda: reader.exists(layout.broker_intervals("b1")) is not None, 10)
        assert _denied(lambda: za.set(layout.broker_intervals("b1"), b"{}"))
        # nor take B's task by creating its owner znode, nor hand B's task to itself
        assert _denied(lambda: za.create(layout.task_owner(tb) + "-x", b"{}", ephemeral=True))
        assert _denied(lambda: za.set_acls(layout.task(tb), acl_for(policy, layout, layout.task(tb), "b0")))
        # the shared broker credentials cannot change an existing znode's ACL either (no ADMIN)
        assert _denied(
            lambda: client(SHARED).set_acls(layout.status(tb), acl_for(policy, layout, layout.status(tb), "b0"))
        )
        # B's znodes are as they were, and every task still runs exactly once
        assert reader.get(layout.task_owner(tb)) == owner_before
        assert running_once() and tb in b.running_tasks()

        # a task moved from B to A (reassign): B lets go, the controller hands the task to A, A takes it (A's
        # right to it comes with the assignment of the round after B let go: no early handoff of planned moves)
        assert ctl.ctx is not None and ctl.ctx.groups["default"].config.handoff is False
        admin.reassign(tb, to="b0", wait=15)
        assert wait_for(lambda: tb in a.running_tasks() and running_once() and statuses_of(a), 30), (
            "the reassigned task did not move"
        )
        acls, _ = client(CREDS["admin"]).get_acls(layout.task(tb))
        assert owner_in_acl(policy, layout, layout.task(tb), acls) == "b0"
        zb = client(BROKER_CREDS["b1"])  # now B cannot touch it
        assert _denied(lambda: zb.delete(layout.task_owner(tb)))
        assert _denied(lambda: zb.set(layout.status(tb), b"{}"))
        # B's controlled shutdown moves everything else to A
        b.request_shutdown()
        assert wait_for(lambda: b.exited.is_set() and a.running_tasks() == set(tasks) and statuses_of(a), 40), (
            "the controlled shutdown did not move B's tasks"
        )
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
        admin.delete(foreign)  # policy leaves out, to remove a znode it cannot touch)


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
    args = [
        "--controller-auth-file",
        str(files["controller"]),
        "--admin-auth-file",
        str(files["admin"]),
        "--reader-auth-file",
        str(files["reader"]),
        "--broker-id-auth-file",
        f"b0={files['b0']}",
        "--broker-id-digest",
        f"b2={digest_id(BROKER_CREDS['b2'])}",
        "--broker-digest",
        digest_id(BROKER_CREDS["b1"]),
        "--broker-user",
        "broker.{id}",
    ]
    bad = runner.invoke(
        cli,
        base
        + ["--zk-auth-file", str(files["admin"]), "security", "init", "--broker-id-digest", "no-equals-sign", *args],
    )
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
                admin.set_acls(
                    layout.broker("b1"), list(acls) + [ACL(R | W, Id("digest", digest_id(BROKER_CREDS["b0"])))]
                )
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
        remove_secured_root(zk_hosts, ZkLayout(zk_root))
