"""Operator mistakes and hostile input that used to break the cluster, each reproduced against a real
ZooKeeper (and real processes where the mistake involves them):

1. a second ``broker run`` with an id already running must exit 1 at once and never act in the other's name;
2. a stray znode under a task must not hang its deletion nor make the controller spin;
3. no size a user can create may make a group unschedulable, and a group that is must not stop the rest;
4. a broker credential holds no ADMIN anywhere; admin reads go on past a znode they may not read;
5. a controlled shutdown after a session expiry ends;
6. names and credentials are checked the same way everywhere and never echoed.
"""

from __future__ import annotations

import os
import random
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, Id, Permissions

from broker_sim.worker import Worker, WorkerConfig
from cli.main import cli
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.acl import SecurityError, digest_id
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, registration_records, task_records
from controller.protocol.tasks.spec import NoopPipeline, SpecError, TaskSpec, parse_spec
from controller.zk.client import ZkSettings
from controller.zk.layout_io import list_tasks
from tests.security_support import CREDS, PASSWORDS
from tests.waiting import wait_until

ZKCTL = [sys.executable, "-m", "cli.main"]


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(10)


# ---- 1. a duplicate broker id -----------------------------------------------------------------------
def test_a_duplicate_broker_id_exits_at_once_and_leaves_the_original_alone(zk, layout, cli_env):
    env = {**cli_env, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    first = subprocess.Popen(
        ZKCTL + ["broker", "run", "--id", "o1", "--runner", "noop", "--session-timeout", "6"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    second: subprocess.Popen | None = None
    try:
        wait_until(lambda: zk.exists(layout.broker("o1")) is not None, 30, "o1 to register")
        owner = zk.exists(layout.broker("o1")).ephemeralOwner
        started = time.monotonic()
        second = subprocess.Popen(
            ZKCTL + ["broker", "run", "--id", "o1", "--runner", "noop", "--session-timeout", "6"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = second.communicate(timeout=60)
        took = time.monotonic() - started
        assert second.returncode == 1, (out, err)
        assert took < 15, f"the duplicate took {took:.1f}s to give up (it must not wait for a live session)"
        assert err.strip().splitlines() == [err.strip()] and "already running" in err and "Traceback" not in err, err
        assert "started" not in out, out
        # the original is untouched: still registered by its own session, no shutdown filed in its name
        assert first.poll() is None
        assert zk.exists(layout.broker("o1")).ephemeralOwner == owner
        assert zk.exists(layout.admin_controlled_shutdown_of("o1")) is None
    finally:
        for p in (second, first):
            if p is not None:
                _stop(p)


def test_a_worker_whose_id_another_live_session_holds_fails_without_acting_in_its_name(zk, layout, zk_settings):
    """In one process (no pid to look at), the wait for the holder's session is bounded; then the worker
    reports the conflict, and a shutdown request from it files nothing."""
    holder = KazooClient(hosts=zk_settings.hosts, timeout=4.0)
    holder.start(10)
    try:
        holder.create(
            layout.broker("o2"),
            codecs.encode(registration_records.BrokerInfo(broker_id="o2", host="elsewhere", pid=1)),
            ephemeral=True,
        )
        settings = ZkSettings(hosts=zk_settings.hosts, root=zk_settings.root, session_timeout_s=1.0)
        w = Worker(WorkerConfig("o2", settings, on_halt="kill")).start()
        try:
            wait_until(w.failed.is_set, 15, "the worker to give up")
            assert "registered by another live session" in (w.failure or "") and "elsewhere" in w.failure
            w.request_shutdown()
            assert zk.exists(layout.admin_controlled_shutdown_of("o2")) is None
            assert zk.exists(layout.broker("o2")).ephemeralOwner == holder.client_id[0]
        finally:
            w.stop()
    finally:
        holder.stop()
        holder.close()


# ---- 2. a stray znode under a task ------------------------------------------------------------------
@pytest.fixture
def one_broker(zk, zk_settings, layout):
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    w = None
    try:
        assert ctl.wait_active(15)
        w = Worker(WorkerConfig("b0", zk_settings, status_interval_s=0.1, on_halt="kill")).start()
        yield ctl, w, AdminClient(zk, layout)
    finally:
        if w is not None:
            w.stop()
        ctl.stop()


def _deletion_attempts(ctl: Controller) -> int:
    stats = ctl.thread.snapshot()
    return sum(stats[k].count for k in ("TaskDeletion", "Tick") if k in stats)


def test_a_stray_child_under_a_task_neither_hangs_its_deletion_nor_spins_the_controller(one_broker, zk, layout):
    ctl, w, admin = one_broker
    admin.create_tasks(
        [parse_spec({"id": "t1", "pipeline": {"kind": "noop"}}), parse_spec({"id": "t2", "pipeline": {"kind": "noop"}})]
    )
    wait_until(lambda: set(w.running_tasks()) == {"t1", "t2"}, 20, "both tasks running")

    zk.create(layout.task("t1") + "/note", b"someone else's")
    zk.create(layout.task("t1") + "/note/deeper", b"")
    admin.delete_task("t1", wait=20)  # raises if it does not finish
    assert zk.exists(layout.task("t1")) is None and set(w.running_tasks()) == {"t2"}

    # a stray the controller may not delete (the task znode denies DELETE): retries back off
    zk.create(layout.task("t2") + "/note", b"")
    zk.set_acls(layout.task("t2"), [ACL(Permissions.ALL & ~Permissions.DELETE, Id("world", "anyone"))])
    before = _deletion_attempts(ctl)
    admin.delete_task("t2")
    time.sleep(4)  # the scenario: the window the deletion attempts are counted in
    attempts = _deletion_attempts(ctl) - before
    assert attempts < 20, f"{attempts} deletion attempts in 4 s: the retry does not back off"
    assert zk.exists(layout.task("t2")) is not None
    zk.set_acls(layout.task("t2"), [ACL(Permissions.ALL, Id("world", "anyone"))])
    wait_until(lambda: zk.exists(layout.task("t2")) is None, 40, "t2 deleted once its stray can go")


# ---- 3. sizes that would break the protocol's payloads --------------------------------------------
def _long_ids(n: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    return ["t" + "".join(rnd.choice(alphabet) for _ in range(199)) for _ in range(n)]


def test_creates_that_would_make_a_group_unschedulable_are_refused_with_the_limit(zk, layout):
    admin = AdminClient(zk, layout)
    many = [TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in _long_ids(7500)]
    with pytest.raises(SpecError, match=r"group 'default' would hold 7500 tasks .* over the [\d,]+-byte limit"):
        admin.create_tasks(many)
    assert list_tasks(zk, layout) == [], "nothing may be written"
    brokers = [f"b{i}" for i in range(4000)]
    with pytest.raises(SpecError, match="at most 256 may be pinned"):
        parse_spec({"id": "p1", "pipeline": {"kind": "noop"}, "placement": {"pinned": brokers}})
    # what fits is accepted, and the limit counts the group's tasks already there
    admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in _long_ids(1000, seed=1)])
    with pytest.raises(SpecError, match="would hold"):
        admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in _long_ids(6000, seed=2)])
    admin.create_tasks(
        [TaskSpec(id=t, group="other", pipeline=NoopPipeline(kind="noop")) for t in _long_ids(1000, seed=3)]
    )  # another group


def test_an_oversized_group_does_not_stop_the_controller_from_activating(zk, layout, zk_settings):
    """Written past the admin's check (an older version, a raw client): the big group cannot be scheduled,
    the controller says so, and every other group and admin request works."""
    from controller.zk.io import Create, FencedWriter

    ops = [
        Create(layout.task(t), TaskSpec(id=t, group="big", pipeline=NoopPipeline(kind="noop")).encode())
        for t in _long_ids(7500)
    ]
    FencedWriter(zk, None).write(ops)
    AdminClient(zk, layout).create_tasks([TaskSpec(id="small-1", group="small", pipeline=NoopPipeline(kind="noop"))])
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    w = None
    try:
        assert ctl.wait_active(20)
        w = Worker(WorkerConfig("s0", zk_settings, group="small", status_interval_s=0.1, on_halt="kill")).start()
        wait_until(lambda: w.running_tasks() == {"small-1"}, 30, "the small group's task running")
        admin = AdminClient(zk, layout)
        before = admin.describe_group("small")[0].summary.generation
        admin.rebalance("small", wait=20)  # the admin-request watches were armed despite the big group
        assert admin.describe_group("small")[0].summary.generation > before
    finally:
        if w is not None:
            w.stop()
        ctl.stop()


# ---- 4. ACLs: brokers hold no ADMIN; admin reads go on --------------------------------------------
def test_a_broker_cannot_lock_the_admin_out_and_admin_reads_go_on(secured, zk_hosts, zk_root, tmp_path):
    layout, policy, client = secured
    admin = AdminClient(client("admin"), layout)
    admin.create_tasks(
        [TaskSpec(id="t0", pipeline=NoopPipeline(kind="noop")), TaskSpec(id="t1", pipeline=NoopPipeline(kind="noop"))]
    )
    broker = client("broker")
    # an owner znode made the policy's way: the broker may not change its ACL
    broker.create(
        layout.task_owner("t0"), codecs.encode(task_records.OwnerInfo(broker="b0", generation=1)), ephemeral=True
    )
    with pytest.raises(NoAuthError):
        broker.set_acls(layout.task_owner("t0"), [ACL(Permissions.ALL, Id("digest", digest_id(CREDS["broker"])))])
    with pytest.raises(NoAuthError):
        broker.set_acls(layout.task("t1"), [ACL(Permissions.ALL, Id("digest", digest_id(CREDS["broker"])))])

    # a hostile client may still create a znode readable only by itself (ZooKeeper lets a creator choose)
    raw = KazooClient(hosts=zk_hosts, auth_data=[("digest", CREDS["broker"])])
    raw.start(10)
    try:
        raw.create(
            layout.task_owner("t1"),
            b"{}",
            ephemeral=True,
            acl=[ACL(Permissions.ALL, Id("digest", digest_id(CREDS["broker"])))],
        )
        rows = {r.task_id: r for r in admin.list_tasks()}
        assert set(rows) == {"t0", "t1"} and rows["t0"].owner == "b0"
        assert layout.task_owner("t1") in admin.unreadable
        described = admin.describe_task("t1")
        assert described.task_id == "t1"
        assert admin.status().tasks["total"] == 2
        runner = CliRunner()
        files = {r: tmp_path / f"{r}.cred" for r in ("admin", "reader")}
        for r, f in files.items():
            f.write_text(CREDS[r] + "\n")
        base = ["--zk", zk_hosts, "--zk-root", zk_root]
        res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "task", "list"])
        assert res.exit_code == 0 and "t1" in res.output and "not readable" in res.output, res.output
        res = runner.invoke(cli, base + ["--zk-auth-file", str(files["admin"]), "status"])
        assert res.exit_code == 0, res.output
        # security init re-applies the policy everywhere it may, and names the znode it may not
        res = runner.invoke(
            cli,
            base
            + [
                "--zk-auth-file",
                str(files["admin"]),
                "security",
                "init",
                *[
                    a
                    for r in ("admin", "controller", "broker", "reader")
                    for a in (f"--{r}-auth-file", str(_cred(tmp_path, r)))
                ],
            ],
        )
        assert res.exit_code == 1 and layout.task_owner("t1") in res.output and "Traceback" not in res.output, (
            res.output
        )
    finally:
        raw.stop()
        raw.close()
    # with reader credentials, `security check` says it needs admin rights instead of false alarms
    res = CliRunner().invoke(
        cli, ["--zk", zk_hosts, "--zk-root", zk_root, "--zk-auth-file", str(files["reader"]), "security", "check"]
    )
    assert res.exit_code == 1 and "needs admin credentials" in res.output, res.output


def _cred(tmp_path: Path, role: str) -> Path:
    f = tmp_path / f"{role}.role.cred"
    f.write_text(CREDS[role] + "\n")
    return f


# ---- 5. controlled shutdown after a session expiry ----------------------------------------------------
def _expire(client: KazooClient, hosts: str) -> None:
    """Expire ``client``'s session the way ZooKeeper does: another connection with its id closes it."""
    session_id, password = client.client_id
    other = KazooClient(hosts=hosts, client_id=(session_id, password))
    other.start(10)
    other.stop()
    other.close()


def test_a_controlled_shutdown_after_a_session_expiry_ends(one_broker, zk, layout, zk_hosts):
    ctl, w, admin = one_broker
    admin.create_tasks([parse_spec({"id": "t1", "pipeline": {"kind": "noop"}})])
    wait_until(lambda: w.running_tasks() == {"t1"}, 20, "t1 running")
    old_session = w.session_id
    _expire(w.client, zk_hosts)
    wait_until(
        lambda: (
            w.session_id not in (None, old_session)
            and w.state() == "Stable"
            and zk.exists(layout.broker("b0")) is not None
        ),
        30,
        "b0 back with a new session",
    )
    admin.shutdown_broker("b0", wait=20)
    wait_until(w.exited.is_set, 20, "the worker to finish its controlled shutdown")


# ---- 6. names and credentials (the pure name checks: tests/unit/cli/test_main.py) --------------------
def test_every_credential_source_is_checked_and_never_echoed(tmp_path, monkeypatch, zk_hosts):
    runner = CliRunner()
    monkeypatch.delenv("ZKC_AUTH", raising=False)
    monkeypatch.delenv("ZKC_AUTH_FILE", raising=False)
    base = ["--zk", zk_hosts]
    # a credential given where a path belongs
    res = runner.invoke(cli, base + ["--zk-auth", f"file:{CREDS['admin']}", "security", "digest"])
    assert res.exit_code != 0 and PASSWORDS["admin"] not in res.output and "user:password" in res.output, res.output
    # a malformed ZKC_AUTH
    monkeypatch.setenv("ZKC_AUTH", "no-colon-" + PASSWORDS["reader"])
    res = runner.invoke(cli, base + ["task", "list"])
    assert res.exit_code == 1 and "ZKC_AUTH" in res.output and PASSWORDS["reader"] not in res.output, res.output
    monkeypatch.delenv("ZKC_AUTH")
    # a two-line credentials file
    two = tmp_path / "two.cred"
    two.write_text(CREDS["admin"] + "\n" + CREDS["reader"] + "\n")
    monkeypatch.setenv("ZKC_AUTH_FILE", str(two))
    res = runner.invoke(cli, base + ["task", "list"])
    assert res.exit_code == 1 and "one line" in res.output and PASSWORDS["admin"] not in res.output, res.output
    # a ZKC_AUTH_FILE that does not exist is named as such, not "cannot connect"
    monkeypatch.setenv("ZKC_AUTH_FILE", str(tmp_path / "missing.cred"))
    res = runner.invoke(cli, base + ["task", "list"])
    assert res.exit_code == 1 and "ZKC_AUTH_FILE" in res.output and "cannot connect" not in res.output, res.output
    with pytest.raises(SecurityError):
        from controller.zk.security import credential_from_env

        credential_from_env({"ZKC_AUTH": "a:b\nc:d"})
    assert os.environ.get("ZKC_AUTH") is None
