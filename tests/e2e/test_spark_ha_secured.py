"""Spark's masters on a secured cluster, for real: a ZooKeeper taking digest credentials (zkcontroller's roles)
and SASL DIGEST-MD5 (the only way Spark's Curator can log in: a JAAS ``Client`` section), a root secured with a
policy whose ``spark_users`` is the masters' SASL user, two masters in recovery mode under ``<root>/spark`` and a
worker. What Spark creates there (with Curator's open ACL) gets the policy's ACL (``seal_spark``); the active
master is killed -9 and the standby recovers the worker from that sealed state; and the masters' identity,
through ZooKeeper's own Java client and the same JAAS file, may change nothing outside ``<root>/spark``."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from broker_sim.deploy.spark_ha import SASL_DIGEST_OPT, SparkHA, SparkHASpec, write_client_jaas
from controller.protocol.cluster.acl import ROLES, AclPolicy
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.security import check_acls, init_security, seal_spark, spark_dir
from controller.zk.server import ZooKeeperServer, default_jvm_options, find_java, free_port, zookeeper_classpath
from tests.security_support import CREDS
from tests.spark_support import TEST_JVM_OPTS, require_spark, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SPARK_USER, SPARK_PASSWORD = "spark-masters", "made-up-spark-pw"
ROOT = "/secured"


def _sasl_server(tmp: Path) -> ZooKeeperServer:
    """A ZooKeeper that also takes SASL logins: the Spark masters' user in its JAAS ``Server`` section."""
    jaas = tmp / "server.jaas"
    jaas.write_text(
        "Server {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        f'  user_{SPARK_USER}="{SPARK_PASSWORD}";\n}};\n'
    )
    return ZooKeeperServer(
        data_dir=tmp / "zk",
        port=free_port(),
        tick_ms=200,
        max_session_timeout_ms=6000,  # Spark asks for 60 s: a killed master hands over when its session expires
        extra_config={"authProvider.sasl": "org.apache.zookeeper.server.auth.SASLAuthenticationProvider"},
        jvm_options=(*default_jvm_options(), f"-Djava.security.auth.login.config={jaas}", SASL_DIGEST_OPT),
    )


def _as_spark(zk: ZooKeeperServer, jaas: Path, script: list[str]) -> str:
    """``script``'s commands run by ZooKeeper's own CLI (the Java client Spark's Curator wraps), logged in as
    the masters through their JAAS file; its output."""
    cmd = [find_java(), f"-Djava.security.auth.login.config={jaas}", SASL_DIGEST_OPT, "-XX:TieredStopAtLevel=1"]
    cmd += ["-cp"]
    cmd += [zookeeper_classpath(), "org.apache.zookeeper.ZooKeeperMain", "-server", zk.address]
    out = subprocess.run(cmd, input="\n".join([*script, "quit"]) + "\n", capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


def test_spark_masters_recover_through_their_sasl_identity_and_write_nowhere_else(tmp_path: Path) -> None:
    require_spark()
    zk = _sasl_server(tmp_path)
    zk.start()
    layout = ZkLayout(ROOT)
    admin: KazooClient | None = None
    try:
        admin = make_client(ZkSettings(hosts=zk.address, root=ROOT, auth=CREDS["admin"]))
        policy = AclPolicy(AclPolicy.from_credentials({r: [CREDS[r]] for r in ROLES}).roles, spark_users=(SPARK_USER,))
        init_security(admin, layout, policy, CREDS["admin"])
        assert admin.exists(f"{ROOT}/spark/master_status"), "the admin lays out Spark's containers"
        jaas = write_client_jaas(tmp_path / "client.jaas", f"{SPARK_USER}:{SPARK_PASSWORD}")
        assert jaas.stat().st_mode & 0o077 == 0, "the masters' password is for their eyes only"
        spec = SparkHASpec(
            zk.address, ROOT, tmp_path / "spark", worker_memory="512m", java_opts=TEST_JVM_OPTS, jaas_file=jaas
        )
        with SparkHA(spec) as ha:  # started: one master ALIVE (it won the latch), the worker registered with it
            assert sorted(str(ha.status(m)) for m in ha.masters) == ["ALIVE", "STANDBY"]
            state = ha.state(ha.active())  # type: ignore[arg-type]
            assert state is not None
            worker_ids = {w["id"] for w in state["workers"]}
            assert len(worker_ids) == 1
            persisted = admin.get_children(f"{spark_dir(layout)}/master_status")
            assert any(c.startswith("worker_") for c in persisted), persisted
            # Curator created these with ZooKeeper's open ACL: sealed, the tree is all the policy's
            fixed = seal_spark(admin, layout, policy)
            assert any("/master_status/worker_" in p for p in fixed), fixed
            assert check_acls(admin, layout, policy, credential=CREDS["admin"]) == []

            active = ha.active()
            assert active is not None
            t_kill = time.time()
            ha.kill(active)
            standby = wait_for(ha.active, 120, "the standby master to become ALIVE")
            assert standby is not active
            # the worker it knows of is the one it read back from the sealed state (then re-registered)
            wait_for(lambda: {w["id"] for w in (ha.state(standby) or {}).get("workers", [])} >= worker_ids, 60, "")
            wait_for(lambda: ha.alive_workers() == 1, 120, "the recovered worker ALIVE with the new master")
            print(f"secured: standby ALIVE {time.time() - t_kill:.1f}s after the kill, its state read back")
            logs = "".join(m.log.read_text(errors="replace") for m in ha.masters)
            assert "NoAuth" not in logs and "AuthFailed" not in logs

        out = _as_spark(
            zk,
            jaas,
            [
                f"create {ROOT}/spark/probe x",  # its own subtree: allowed
                f"create {ROOT}/intruder x",
                f"set {ROOT}/tasks x",
                f"create {ROOT}/tasks/t x",
                f"set {ROOT}/security x",
                f"delete {ROOT}/layout",
                f"setAcl {ROOT}/spark world:anyone:cdrwa",
            ],
        )
        assert admin.exists(f"{ROOT}/spark/probe"), out
        for path in ("intruder", "tasks/t"):
            assert not admin.exists(f"{ROOT}/{path}"), out
        assert admin.get(f"{ROOT}/tasks")[0] != b"x" and admin.get(f"{ROOT}/security")[0] != b"x", out
        assert admin.exists(f"{ROOT}/layout"), out
        assert out.count("Insufficient permission") >= 6, out
        # what it created there is open (the CLI's default ACL, as Curator's) until sealed
        assert seal_spark(admin, layout, policy) == [f"{ROOT}/spark/probe"]
        # the whole tree under the root: no open ACL, and the masters' identity only under <root>/spark
        frontier = [ROOT]
        while frontier:
            path = frontier.pop()
            for a in admin.get_acls(path)[0]:
                assert a.id.scheme != "world" or a.perms == 0, (path, a)
                if a.id.scheme == "sasl":
                    assert path.startswith(f"{ROOT}/spark"), (path, a)
            frontier += [f"{path}/{c}" for c in admin.get_children(path)]
    finally:
        if admin is not None:
            admin.stop()
            admin.close()
        zk.stop()
