"""Digest authentication and ACLs against the real ZooKeeper: the system works end to end with role
credentials; an unauthenticated client, a reader and the wrong roles cannot change assignments, tasks or
the controller (NoAuth); secrets never appear in logs or reprs; the CLI never takes them on the command
line."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from broker_sim.worker import Worker, WorkerConfig
from cli.main import cli
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.acl import ROLES, digest_id
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, group_messages
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.layout_io import list_tasks
from controller.zk.security import check_acls
from controller.zk.subtrees import delete_tree
from tests.security_fixtures import remove_secured_root
from tests.security_support import CREDS, PASSWORDS


def _settings(zk_hosts: str, zk_root: str, role: str) -> ZkSettings:
    return ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0, auth=CREDS[role])


def _denied(fn) -> bool:
    try:
        fn()
    except NoAuthError:
        return True
    return False


def test_roles_end_to_end_and_what_each_may_not_do(secured, zk_hosts, zk_root):
    layout, policy, client = secured
    admin = AdminClient(client("admin"), layout)
    admin.create_tasks([TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")) for i in range(6)])
    ctl = Controller(
        ControllerConfig("c0", _settings(zk_hosts, zk_root, "controller"), GroupConfig(rebalance_timeout_s=3.0))
    ).start()
    workers = [
        Worker(
            WorkerConfig(
                broker_id=f"b{i}",
                settings=_settings(zk_hosts, zk_root, "broker"),
                status_interval_s=0.2,
                on_halt="kill",
            )
        ).start()
        for i in range(2)
    ]
    try:
        assert ctl.wait_active(10)
        assert wait_for(
            lambda: sum(len(w.running_tasks()) for w in workers) == 6 and all(w.state() == "Stable" for w in workers),
            30,
        ), "the secured cluster did not converge"
        # the operator's requests work through the controller: delete a task, rebalance
        admin.delete_task("t5", wait=15)
        assert "t5" not in list_tasks(client("reader"), layout)
        assert wait_for(lambda: sum(len(w.running_tasks()) for w in workers) == 5, 15)

        # every znode the processes created carries the policy's ACL for its path
        assert check_acls(client("admin"), layout, policy, credential=CREDS["admin"]) == []

        assignment = layout.group_assignment("default", "b0")
        forged = codecs.encode(
            group_messages.Assignment(generation=10**6, controller_epoch=10**6, assigned=("t0",), revoked=())
        )
        anon, reader, broker, operator, controller = (
            client(None),
            client("reader"),
            client("broker"),
            client("admin"),
            client("controller"),
        )
        # nobody but the controller changes assignments, group state or the controller znodes
        for c in (anon, reader, broker, operator):
            assert _denied(lambda: c.set(assignment, forged))
            assert _denied(lambda: c.set(layout.group_state("default"), b"{}"))
            assert _denied(lambda: c.set(layout.controller_epoch, b"999"))
            assert _denied(lambda: c.delete(layout.controller))
            assert _denied(lambda: c.create(layout.group_assignment("default", "intruder"), forged))
        # nobody but the admin creates tasks or admin requests, or changes a task spec
        for c in (anon, reader, broker, controller):
            assert _denied(
                lambda: c.create(layout.task("evil"), TaskSpec(id="evil", pipeline=NoopPipeline(kind="noop")).encode())
            )
            assert _denied(
                lambda: c.set(
                    layout.task("t0"), TaskSpec(id="t0", state="PAUSED", pipeline=NoopPipeline(kind="noop")).encode()
                )
            )
            assert _denied(lambda: c.create(layout.admin_rebalance_request_prefix, b"{}", sequence=True))
        # nobody but brokers register, join or take task ownership
        for c in (anon, reader, operator, controller):
            assert _denied(lambda: c.create(layout.broker("fake"), b"{}", ephemeral=True))
            assert _denied(lambda: c.create(layout.group_member("default", "fake"), b"{}", ephemeral=True))
            assert _denied(lambda: c.create(layout.task_owner("t0") + "x", b"{}", ephemeral=True))
        # unauthenticated: not even reading; a reader reads everything
        assert _denied(lambda: list_tasks(anon, layout))
        assert _denied(lambda: anon.get(layout.controller))
        assert list_tasks(reader, layout) == [f"t{i}" for i in range(5)]
        assert reader.get(assignment)[0]
        # after all that, the cluster still runs every task once
        assert sum(len(w.running_tasks()) for w in workers) == 5
    finally:
        for w in workers:
            w.stop()
        ctl.stop()


def test_secrets_never_in_logs_or_reprs(zk_hosts, zk_root, caplog, tmp_path):
    caplog.set_level(1)  # everything, down to kazoo's lowest levels
    for name in ("kazoo", "kazoo.client", "kazoo.protocol.connection", "controller", "broker_sim"):
        logging.getLogger(name).setLevel(1)
    try:
        settings = ZkSettings(hosts=zk_hosts, root=zk_root, auth=CREDS["admin"])
        client = make_client(settings)
        client.ensure_path(zk_root + "/x")
        delete_tree(client, zk_root)
        text = repr(settings) + str(settings) + repr(client)
        client.stop()
        client.close()
    finally:
        for name in ("kazoo", "kazoo.client", "kazoo.protocol.connection", "controller", "broker_sim"):
            logging.getLogger(name).setLevel(logging.NOTSET)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Auth" in logged or caplog.records, "expected kazoo to log the session"
    assert PASSWORDS["admin"] not in logged and PASSWORDS["admin"] not in text
    from cli.common import Ctx

    ctx = Ctx(hosts=zk_hosts, root=zk_root, json_out=False, verbose=0, state_dir=tmp_path, auth=CREDS["admin"])
    assert PASSWORDS["admin"] not in repr(ctx) + repr(ctx.settings)


def test_cli_takes_credentials_from_env_or_file_never_the_command_line(zk_hosts, zk_root, tmp_path, monkeypatch):
    runner = CliRunner()
    monkeypatch.delenv("ZKC_AUTH", raising=False)
    monkeypatch.delenv("ZKC_AUTH_FILE", raising=False)
    base = ["--zk", zk_hosts, "--zk-root", zk_root]
    # the secret itself on the command line: refused, and not repeated
    res = runner.invoke(cli, base + ["--zk-auth", CREDS["admin"], "security", "digest"])
    assert res.exit_code == 2 and PASSWORDS["admin"] not in res.output and "env:NAME or file:PATH" in res.output
    files = {}
    for r in ROLES:
        files[r] = tmp_path / f"{r}.cred"
        files[r].write_text(CREDS[r] + "\n")
    res = runner.invoke(cli, base + ["--zk-auth", f"file:{files['admin']}", "security", "digest"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == digest_id(CREDS["admin"]) and PASSWORDS["admin"] not in res.output
    monkeypatch.setenv("MY_ZK_SECRET", CREDS["admin"])
    res = runner.invoke(cli, base + ["--zk-auth", "env:MY_ZK_SECRET", "security", "digest"])
    assert res.output.strip() == digest_id(CREDS["admin"])
    bad = tmp_path / "bad.cred"
    bad.write_text("no-colon-here")
    res = runner.invoke(cli, base + ["--zk-auth-file", str(bad), "security", "digest"])
    assert res.exit_code == 2 and "user:password" in res.output and "no-colon-here" not in res.output
    # init through the CLI, then the CLI works with role credentials and refuses without
    role_args = [a for r in ROLES for a in (f"--{r}-auth-file", str(files[r]))]
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "init", *role_args])
    assert res.exit_code == 0, res.output
    spec = tmp_path / "t.json"
    spec.write_text('{"id": "cli-task", "pipeline": {"kind": "noop"}}')
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["reader"]), "task", "create", "-f", str(spec)])
    assert res.exit_code == 1 and "NoAuth" in res.output
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "task", "create", "-f", str(spec)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "security", "check"])
    assert res.exit_code == 0, res.output
    monkeypatch.delenv("ZKC_AUTH_FILE", raising=False)  # resolve_auth exports it for child processes
    res = runner.invoke(cli, base + ["task", "list"])
    assert res.exit_code == 1 and "NoAuth" in res.output
    remove_secured_root(zk_hosts, ZkLayout(zk_root))


def test_tls_to_zookeeper_with_a_self_signed_certificate(tmp_path, monkeypatch):
    """A private ZooKeeper with Netty TLS on a secure port (keystore made by Java's keytool; the
    netty jars come with pyspark's), and our client
    connecting through ZkSettings' TLS options: with the CA it works (digest auth on top), and a plaintext
    client cannot talk to the TLS port."""
    import shutil
    import subprocess

    from kazoo.handlers.threading import KazooTimeoutError

    from controller.zk.client import settings_from_env
    from controller.zk.server import ZooKeeperServer, free_port

    keytool = shutil.which("keytool")
    assert keytool, "keytool ships with Java 17"
    ks, ca = tmp_path / "zk.p12", tmp_path / "ca.pem"
    subprocess.run(
        [
            keytool,
            "-genkeypair",
            "-alias",
            "zk",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-dname",
            "CN=localhost",
            "-ext",
            "SAN=ip:127.0.0.1,dns:localhost",
            "-validity",
            "2",
            "-keystore",
            str(ks),
            "-storetype",
            "PKCS12",
            "-storepass",
            "changeit",
            "-keypass",
            "changeit",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            keytool,
            "-exportcert",
            "-rfc",
            "-alias",
            "zk",
            "-keystore",
            str(ks),
            "-storepass",
            "changeit",
            "-file",
            str(ca),
        ],
        check=True,
        capture_output=True,
    )
    trust = tmp_path / "trust.p12"
    subprocess.run(
        [
            keytool,
            "-importcert",
            "-noprompt",
            "-alias",
            "zk",
            "-file",
            str(ca),
            "-keystore",
            str(trust),
            "-storetype",
            "PKCS12",
            "-storepass",
            "changeit",
        ],
        check=True,
        capture_output=True,
    )
    secure_port = free_port()
    server = ZooKeeperServer(
        data_dir=tmp_path / "zk",
        port=free_port(),
        tick_ms=200,
        extra_config={
            "secureClientPort": str(secure_port),
            "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
            "ssl.keyStore.location": str(ks),
            "ssl.keyStore.password": "changeit",
            "ssl.keyStore.type": "PKCS12",
            "ssl.trustStore.location": str(trust),
            "ssl.trustStore.password": "changeit",
            "ssl.trustStore.type": "PKCS12",
            "ssl.clientAuth": "none",
        },
    )
    server.start(timeout=90)
    try:
        monkeypatch.setenv("ZKC_ZK_TLS", "1")
        monkeypatch.setenv("ZKC_ZK_CA", str(ca))
        monkeypatch.setenv("ZKC_AUTH", CREDS["admin"])
        settings = settings_from_env(hosts=f"127.0.0.1:{secure_port}", root="/tls")
        assert settings.use_ssl and settings.ca == str(ca) and settings.verify_certs
        client = make_client(settings)
        try:
            client.ensure_path("/tls/x")
            assert client.get_children("/tls") == ["x"]
        finally:
            client.stop()
            client.close()
        plain = KazooClient(hosts=f"127.0.0.1:{secure_port}", timeout=4.0)
        with pytest.raises(KazooTimeoutError):
            plain.start(timeout=3)
        plain.stop()
        plain.close()
    finally:
        server.stop()
