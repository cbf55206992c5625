"""The embedded ZooKeeper, the CLI's zk commands, and garbage in znodes (real server, raw kazoo writes)."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest
from kazoo.client import KazooClient

from controller.admin import ZkInspector, ensure_layout
from controller.protocol.records import admin_records, codecs, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.zk.server import MAIN_CLASS, ZooKeeperServer, four_letter_word, free_port

ZKCTL = [sys.executable, "-m", "cli.main"]


def run(args, env, check=True):
    proc = subprocess.run(ZKCTL + args, env=env, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"zkctl {args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_zkctl_zk_start_tree_stop_leaves_no_java(tmp_path, cli_env):
    port = free_port()
    env = dict(cli_env, ZKC_ZK=f"127.0.0.1:{port}", ZKC_ROOT="/zkc")
    started = run(["--json", "zk", "start", "--port", str(port)], env)
    pid = json.loads(started.stdout)["pid"]
    try:
        assert psutil.pid_exists(pid)
        status = json.loads(run(["--json", "zk", "status"], env).stdout)
        assert status["running"] and status["mode"] == "standalone" and status["version"].startswith("3.9")
        tree = run(["zk", "tree", "/"], env).stdout
        assert "zookeeper" in tree.splitlines()[1]
        # starting twice is idempotent (same pid)
        assert json.loads(run(["--json", "zk", "start", "--port", str(port)], env).stdout)["pid"] == pid
    finally:
        stopped = run(["zk", "stop"], env)
    assert "stopped" in stopped.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    leftovers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if MAIN_CLASS in (p.info["cmdline"] or []) and str(tmp_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []
    assert run(["zk", "status"], env, check=False).returncode == 3


def test_the_server_jvm_runs_c1_only_unless_server_jvmflags_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("SERVER_JVMFLAGS", raising=False)
    assert "-XX:TieredStopAtLevel=1" in ZooKeeperServer(data_dir=tmp_path / "a", port=free_port()).command()
    monkeypatch.setenv("SERVER_JVMFLAGS", "-Xss1m -Dzkc.flag='two words'")
    server = ZooKeeperServer(data_dir=tmp_path / "b", port=free_port())
    pid = server.start()
    try:
        cmdline = psutil.Process(pid).cmdline()
        assert "-Xss1m" in cmdline and "-Dzkc.flag=two words" in cmdline and "-XX:TieredStopAtLevel=1" not in cmdline
        assert server.is_serving()
    finally:
        server.stop()


def test_a_started_server_serves_requests_not_only_answers_ruok(tmp_path):
    """``ruok`` answers ``imok`` from the moment the port is open, before the server has loaded its data and
    serves a request (0.15 s on a fresh server here, longer the more data): a start that returned then left the
    first client's requests to fail under load. Data to load widens that window."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk", port=free_port(), tick_ms=200)
    server.start(timeout=90)
    try:
        client = KazooClient(hosts=server.address)
        client.start(30)
        for i in range(40):
            client.create(f"/load-{i}", b"x" * 900_000)
        client.stop()
        client.close()
    finally:
        server.stop()
    server.start(timeout=90)
    client = KazooClient(hosts=server.address, connection_retry={"max_tries": 0})
    try:
        srvr = four_letter_word(server.host, server.port, "srvr")  # at once
        assert "Mode: standalone" in srvr, srvr
        client.start(10)
        assert client.exists("/load-39") is not None
    finally:
        client.stop()
        client.close()
        server.stop()


def test_missing_java_from_cli_exits_1_with_one_line(tmp_path, cli_env):
    env = dict(cli_env, PATH=str(tmp_path))
    env.pop("JAVA_HOME", None)
    proc = run(["zk", "start", "--port", str(free_port())], env, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("Error: java not found") and "Traceback" not in proc.stderr


def test_zk_tree_and_get_on_our_root(zk, layout, cli_env):
    zk.create(layout.controller_epoch, codecs.encode_epoch(3))
    zk.create(
        layout.broker("b1"),
        codecs.encode(registration_records.BrokerInfo(broker_id="b1", host="h", pid=1)),
        ephemeral=True,
    )
    tree = run(["zk", "tree"], cli_env).stdout
    assert "b1 (ephemeral)" in tree and "controller_epoch" in tree
    got = json.loads(run(["--json", "zk", "get", layout.broker("b1")], cli_env).stdout)
    assert got["data"]["broker_id"] == "b1" and got["stat"]["ephemeral_owner"]
    assert run(["zk", "get", "--raw", layout.controller_epoch], cli_env).stdout.strip() == "3"
    missing = run(["zk", "get", layout.task("nope")], cli_env, check=False)
    assert missing.returncode == 1 and "no znode" in missing.stderr


GARBAGE = [
    b"{oops",
    b"\xff\xfe",
    b'{"version": 1}',
    b'{"version": 42, "broker": "b"}',
    b"[1,2,3]",
    b'{"version":1,"broker":5,"generation":"x"}',
    b"x" * 800_000,
]


@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_in_every_znode_type_gives_the_documented_error(zk, layout, garbage, cli_env):
    """Write garbage with a raw kazoo client into each kind of znode; decoding reports PayloadError."""
    ensure_layout(zk, layout)
    targets = {
        layout.controller: registration_records.ControllerInfo,
        layout.broker("b1"): registration_records.BrokerInfo,
        layout.task("t1"): None,
        layout.task_owner("t1"): task_records.OwnerInfo,
        layout.group_state("g"): group_messages.GroupStateInfo,
        layout.group_member("g", "m1"): group_messages.JoinRequest,
        layout.group_join("g", 1): group_messages.JoinResult,
        layout.group_sync("g", 1): group_messages.SyncProposal,
        layout.group_assignment("g", "m1"): group_messages.Assignment,
        layout.status("t1"): task_records.TaskStatus,
        layout.admin_controlled_shutdown_of("b1"): admin_records.ControlledShutdownRequest,
        layout.admin_reassign_of("t1"): admin_records.ReassignRequest,
    }
    inspector = ZkInspector(zk, layout)
    for path, cls in targets.items():
        zk.create(path, garbage, makepath=True)
        data, _ = zk.get(path)
        with pytest.raises(PayloadError) as info:
            decode_task(data, path) if cls is None else codecs.decode(cls, data, path)
        assert info.value.path == path and info.value.reason
        view = inspector.get(path)
        assert view.error and path in view.error
    with pytest.raises(PayloadError):
        codecs.decode_epoch(garbage, layout.controller_epoch)
    proc = run(["zk", "get", layout.group_state("g")], cli_env, check=False)
    assert proc.returncode == 1 and "malformed payload at" in proc.stderr and "Traceback" not in proc.stderr
