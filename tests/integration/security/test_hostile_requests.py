"""What an attacker with one broker's own credentials may ask of the cluster, on a root secured with
per-broker identities, against the real ZooKeeper, controller and workers: it cannot shut another broker
down, a malformed request is refused rather than acted on, and what it may create under a name that is not
ours the operator and the controller can delete."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings
from tests.security_support import BROKER_CREDS, CREDS


def _settings(zk_hosts: str, zk_root: str, cred: str) -> ZkSettings:
    return ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=cred)


def _start(zk_hosts: str, zk_root: str) -> tuple[Controller, dict[str, Worker]]:
    ctl = Controller(
        ControllerConfig("c0", _settings(zk_hosts, zk_root, CREDS["controller"]), GroupConfig(rebalance_timeout_s=3.0))
    ).start()
    workers = {
        b: Worker(
            WorkerConfig(b, _settings(zk_hosts, zk_root, BROKER_CREDS[b]), status_interval_s=0.2, on_halt="kill")
        ).start()
        for b in ("b0", "b1")
    }
    return ctl, workers


def test_one_brokers_credentials_cannot_shut_down_another_and_a_malformed_request_is_refused(
    per_broker,
    zk_hosts: str,
    zk_root: str,
) -> None:
    layout, _policy, client = per_broker
    admin_zk = client(CREDS["admin"])
    admin = AdminClient(admin_zk, layout)
    tasks = {f"t{i}" for i in range(4)}
    admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in sorted(tasks)])
    ctl, workers = _start(zk_hosts, zk_root)
    b0, b1 = workers["b0"], workers["b1"]
    try:
        assert ctl.wait_active(10)
        assert wait_for(
            lambda: b0.running_tasks() and b1.running_tasks() and b0.running_tasks() | b1.running_tasks() == tasks, 30
        )
        # b0's own credentials: no request in b1's name, well-formed or not
        za = client(BROKER_CREDS["b0"])
        for body in (b"{}", b'{"broker": "b1"}'):
            with pytest.raises(NoAuthError):
                za.create(layout.admin_controlled_shutdown_of("b1"), body)
        # a malformed request (even the operator's): refused, deleted, never acted on
        admin_zk.create(layout.admin_controlled_shutdown_of("b1"), b"{}")
        assert wait_for(lambda: admin_zk.exists(layout.admin_controlled_shutdown_of("b1")) is None, 10)
        admin_zk.create(layout.admin_controlled_shutdown_of("b1"), b'{"broker": "b0"}')  # names another broker
        assert wait_for(lambda: admin_zk.exists(layout.admin_controlled_shutdown_of("b1")) is None, 10)
        # the handler that deleted them is the one that would have acted on them: nothing was started
        assert ctl.ctx is not None and "b1" not in ctl.ctx.shutdown_requests
        assert "b1" not in ctl.ctx.groups["default"].shutting_down and not b1.exited.is_set()
        # the operator's well-formed request is carried out, and a broker still leaves by itself
        admin.shutdown_broker("b1", wait=20)
        assert wait_for(b1.exited.is_set, 20)
        assert wait_for(lambda: b0.running_tasks() == tasks, 20)
    finally:
        for w in workers.values():
            w.stop()
        ctl.stop()


def test_names_a_broker_may_create_the_operator_and_the_controller_may_delete(
    per_broker,
    zk_hosts: str,
    zk_root: str,
) -> None:
    layout, _policy, client = per_broker
    za = client(BROKER_CREDS["b0"])
    planted = [f"{layout.groups}/bad<g>", f"{layout.intervals}/bad<i>", f"{layout.broker_ids}/evil<b>"]
    for p in planted:
        za.create(p, b"{}")
    admin_zk = client(CREDS["admin"])
    admin_zk.delete(planted[0])  # the operator may delete what a broker's credentials created there
    za.create(planted[0], b"{}")
    ctl = Controller(
        ControllerConfig("c0", _settings(zk_hosts, zk_root, CREDS["controller"]), GroupConfig(rebalance_timeout_s=3.0))
    ).start()
    try:
        assert ctl.wait_active(10)
        assert wait_for(lambda: all(admin_zk.exists(p) is None for p in planted), 15), [
            p for p in planted if admin_zk.exists(p)
        ]
    finally:
        ctl.stop()


def test_the_policys_digests_are_not_the_read_only_roles(per_broker) -> None:
    """The reader may not read the policy; ZooKeeper shows a digest in an ACL only to a caller with ADMIN."""
    layout, _policy, client = per_broker
    reader, admin_zk = client(CREDS["reader"]), client(CREDS["admin"])
    with pytest.raises(NoAuthError):
        reader.get(layout.security)
    assert b"roles" in admin_zk.get(layout.security)[0]
    shown = [a.id.id for a in reader.get_acls(layout.broker_ids)[0] if a.id.scheme == "digest"]
    assert shown and all(i.endswith(":x") for i in shown), shown
    assert reader.get_children(layout.broker_ids) == []  # it still reads the cluster


def test_a_name_the_controller_may_not_delete_stays_left_out(per_broker, zk_hosts: str, zk_root: str, caplog) -> None:
    """A client not using ours chooses the ACL of what it creates: a subtree nobody else may delete. The
    controller activates anyway, says so once, and every listing goes on leaving it out."""
    from kazoo.client import KazooClient
    from kazoo.security import make_digest_acl

    caplog.set_level("WARNING")
    layout, _policy, client = per_broker
    user, password = BROKER_CREDS["b0"].split(":", 1)
    raw = KazooClient(hosts=zk_hosts, auth_data=[("digest", BROKER_CREDS["b0"])])
    raw.start(10)
    try:
        mine = [make_digest_acl(user, password, all=True)]
        raw.create(f"{layout.groups}/bad<g>", b"", acl=mine)
        raw.create(f"{layout.groups}/bad<g>/x", b"", acl=mine)
        ctl = Controller(
            ControllerConfig(
                "c0", _settings(zk_hosts, zk_root, CREDS["controller"]), GroupConfig(rebalance_timeout_s=3.0)
            )
        ).start()
        try:
            assert ctl.wait_active(10)
            assert wait_for(lambda: "could not delete the illegal name" in caplog.text, 10)
            assert ctl.active and ctl.ctx is not None and "bad<g>" not in ctl.ctx.groups
            assert AdminClient(client(CREDS["admin"]), layout).describe_group() == []
        finally:
            ctl.stop()
    finally:
        raw.delete(f"{layout.groups}/bad<g>/x")  # its creator may empty it, the admin delete it
        client(CREDS["admin"]).delete(f"{layout.groups}/bad<g>")
        raw.stop()
        raw.close()


def test_a_broker_leaving_by_its_own_join_request_shows_as_shutting_down(zk, layout) -> None:
    """No request znode for a broker's own controlled shutdown any more: ``broker list`` reads its join
    request instead."""
    from controller.protocol.records import codecs, group_messages, registration_records

    for b, leaving in (("b1", True), ("b2", False)):
        zk.create(
            layout.broker(b),
            codecs.encode(registration_records.BrokerInfo(broker_id=b, host="h", pid=1)),
            ephemeral=True,
        )
        request = group_messages.JoinRequest(b, 1, 0, ("eager",), ("range",), leaving=leaving)
        zk.create(layout.group_member("default", b), codecs.encode(request), ephemeral=True, makepath=True)
    views = {v.broker_id: v.shutting_down for v in AdminClient(zk, layout).brokers()}
    assert views == {"b1": True, "b2": False}


def test_a_malformed_shutdown_request_is_refused_and_the_broker_keeps_its_tasks(noop_cluster, zk, layout) -> None:
    """On an open root anyone may write the request: one that does not decode (``{}``) or names another
    broker moves nothing, is deleted, and the broker stays up."""
    tasks = {f"t{i}" for i in range(4)}
    noop_cluster.admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in sorted(tasks)])
    running = noop_cluster.wait_running(tasks)
    held = {t for t, b in running.items() if b == "b1"}
    assert held
    for body in (b"{}", b'{"broker": "b0"}', b"\xff"):
        zk.create(layout.admin_controlled_shutdown_of("b1"), body)
        assert wait_for(lambda: zk.exists(layout.admin_controlled_shutdown_of("b1")) is None, 10), body
    # the handler that deleted the requests is the one that would have acted on them: nothing started
    ctx = noop_cluster.controller.ctx
    assert ctx is not None and "b1" not in ctx.shutdown_requests
    assert "b1" not in ctx.groups["default"].shutting_down
    assert {t for t, b in noop_cluster.running().items() if b == "b1"} == held
    assert not noop_cluster.workers["b1"].exited.is_set()
