"""The bucketed layout against a real ZooKeeper: a fresh root is laid out once, a flat root of an earlier
release is refused by every process (nothing written) and migrated offline by ``zkctl layout migrate``,
garbage in a bucket is isolated, and a migrated root runs its tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions

from cli.main import cli
from controller.admin import AdminClient, ensure_layout
from controller.admin.migration import migrate
from controller.protocol.cluster.layout import BUCKETS, ZkLayout, bucket_of
from controller.protocol.records import admin_records, codecs, registration_records
from controller.protocol.records.task_records import TaskStatus
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.layout_io import LayoutError, check_root, list_statuses, list_tasks
from controller.zk.subtrees import delete_tree
from tests.controller_support import Cluster
from tests.waiting import wait_until


def _spec(t: str, **kw) -> bytes:
    return TaskSpec(id=t, pipeline=NoopPipeline(kind="noop"), **kw).encode()


def _status(t: str) -> bytes:
    return codecs.encode(TaskStatus(broker="b-old", state="RUNNING", generation=3, updated=1.0))


def _flat_root(client: KazooClient, layout: ZkLayout, ids: list[str], statuses: list[str] | None = None) -> None:
    """A root as releases before buckets laid it out: ``/tasks/<id>``, ``/status/<id>``, no marker."""
    for p in layout.persistent_roots():
        client.ensure_path(p)
    for lo in range(0, len(ids), 200):
        tx = client.transaction()
        for t in ids[lo : lo + 200]:
            tx.create(f"{layout.tasks}/{t}", _spec(t))
        for t in (ids if statuses is None else statuses)[lo : lo + 200]:
            tx.create(f"{layout.statuses}/{t}", _status(t))
        assert not any(isinstance(r, Exception) for r in tx.commit())


def _snapshot(client: KazooClient, path: str) -> list[tuple[str, bytes]]:
    out, stack = [], [path]
    while stack:
        p = stack.pop()
        data, _ = client.get(p)
        out.append((p, data))
        stack += [f"{p}/{c}" for c in client.get_children(p)]
    return sorted(out)


@pytest.fixture
def flat(zk_hosts: str, zk_root: str):
    """A client and the layout of a second root, left for the test to lay out (or not)."""
    layout = ZkLayout(zk_root + "-flat")
    client = make_client(ZkSettings(hosts=zk_hosts, root=layout.root, session_timeout_s=4.0))
    try:
        yield client, layout
    finally:
        delete_tree(client, layout.root)
        client.stop()
        client.close()


def test_a_fresh_root_gets_its_buckets_and_marker_once(flat):
    client, layout = flat
    assert check_root(client, layout) is False
    ensure_layout(client, layout)
    assert len(client.get_children(layout.tasks)) == len(client.get_children(layout.statuses)) == BUCKETS
    info = codecs.decode(admin_records.LayoutInfo, client.get(layout.layout_info)[0])
    assert (info.layout, info.buckets) == (2, BUCKETS)
    mzxid = client.exists(layout.layout_info).mzxid
    ensure_layout(client, layout)  # laid out already: one read, nothing written
    assert check_root(client, layout) is True and client.exists(layout.layout_info).mzxid == mzxid


def test_every_process_refuses_a_flat_root_and_writes_nothing(flat, zk_hosts: str, tmp_path: Path):
    client, layout = flat
    _flat_root(client, layout, ["t1", "t2"])
    before = _snapshot(client, layout.root)
    with pytest.raises(
        LayoutError, match=r"2 task\(s\) and 2 status\(es\) in the flat layout.*zkctl --zk-root .* layout migrate"
    ):
        ensure_layout(client, layout)
    c = Cluster(ZkSettings(hosts=zk_hosts, root=layout.root, session_timeout_s=4.0), tmp_path)
    try:
        with pytest.raises(LayoutError):
            c.controller("c1")
        with pytest.raises(LayoutError):
            c.worker("b1")
    finally:
        c.close()
    assert _snapshot(client, layout.root) == before
    # reads refuse it too, rather than showing an empty cluster
    with pytest.raises(LayoutError):
        AdminClient(client, layout).list_tasks()
    with pytest.raises(LayoutError):
        AdminClient(client, layout).status()
    r = CliRunner().invoke(cli, ["--zk", zk_hosts, "--zk-root", layout.root, "status"], prog_name="zkctl")
    assert r.exit_code == 1 and "layout migrate" in r.output and "Traceback" not in r.output, r.output
    # the operator's commands say it in one line, exit 1
    spec_file = tmp_path / "t3.json"
    spec_file.write_text(json.dumps({"id": "t3", "pipeline": {"kind": "noop"}}))
    r = CliRunner().invoke(
        cli, ["--zk", zk_hosts, "--zk-root", layout.root, "task", "create", "-f", str(spec_file)], prog_name="zkctl"
    )
    assert r.exit_code != 0 and "flat layout of an earlier release" in r.output and "Traceback" not in r.output, (
        r.output
    )
    assert _snapshot(client, layout.root) == before


def test_migrate_refuses_while_a_broker_or_controller_is_registered(flat):
    client, layout = flat
    _flat_root(client, layout, ["t1"])
    client.create(layout.broker("b9"), b"{}", ephemeral=True)
    before = _snapshot(client, layout.root)
    with pytest.raises(LayoutError, match=r"1 broker\(s\) \(b9\) still registered"):
        migrate(client, layout)
    client.delete(layout.broker("b9"))
    client.create(
        layout.controller, codecs.encode(registration_records.ControllerInfo("c7", 4, "h", 0.0)), ephemeral=True
    )
    with pytest.raises(LayoutError, match="controller c7"):
        migrate(client, layout)
    client.delete(layout.controller)
    assert _snapshot(client, layout.root) == [(p, d) for p, d in before if p != layout.broker("b9")]


def test_migration_moves_specs_statuses_and_acls_then_the_cluster_runs(flat, zk_hosts: str, tmp_path: Path):
    client, layout = flat
    ids = [f"task-{i}" for i in range(450)]
    _flat_root(client, layout, ids, statuses=ids[:300])
    client.set(f"{layout.tasks}/task-7", _spec("task-7", state="PAUSED", weight=3))
    odd_acl = [ACL(Permissions.ALL, Id("world", "anyone")), ACL(Permissions.READ, Id("ip", "10.9.8.7"))]
    client.set_acls(f"{layout.tasks}/task-8", odd_acl)
    dry = migrate(client, layout, dry_run=True)
    assert (dry.tasks, dry.statuses, dry.moved, dry.done, dry.blocked) == (450, 300, 0, False, ())
    assert client.exists(layout.tasks + "/_00") is None  # a dry run writes nothing
    result = migrate(client, layout)
    assert (result.moved, result.done, result.blocked) == (750, True, ())
    assert result.multis == 8  # 100 moves per multi
    assert list_tasks(client, layout) == sorted(ids) and list_statuses(client, layout) == sorted(ids[:300])
    assert [c for c in client.get_children(layout.tasks) if not c.startswith("_")] == []
    assert client.get(layout.task("task-7"))[0] == _spec("task-7", state="PAUSED", weight=3)
    assert client.get(layout.status("task-5"))[0] == _status("task-5")
    assert sorted(client.get_acls(layout.task("task-8"))[0]) == sorted(odd_acl)
    assert check_root(client, layout) is True
    assert migrate(client, layout).already  # a second run has nothing to do
    # the migrated root runs: a controller loads every task, brokers run all but the paused one
    c = Cluster(ZkSettings(hosts=zk_hosts, root=layout.root, session_timeout_s=4.0), tmp_path)
    try:
        ctl = c.controller("c1")
        wait_until(lambda: ctl.active and ctl.ctx is not None and len(ctl.ctx.tasks) == 450, 20, "every task loaded")
        c.worker("b1")
        c.worker("b2")
        admin = AdminClient(client, layout)
        wait_until(lambda: sum(1 for r in admin.list_tasks() if r.owner) == 449, 60, "449 tasks owned")
        assert next(r for r in admin.list_tasks() if r.task_id == "task-7").owner is None
    finally:
        c.close()


def test_an_interrupted_or_blocked_migration_is_finished_by_running_it_again(flat, zk_hosts: str):
    client, layout = flat
    ids = [f"t{i}" for i in range(40)]
    _flat_root(client, layout, ids)
    client.create(f"{layout.tasks}/t3/owner", b"{}")  # left behind (a real one would be a live session's)
    client.create(f"{layout.tasks}/t4/stray", b"")
    client.create(f"{layout.tasks}/Bad Name", b"")
    # an earlier run that stopped half way: some tasks moved already
    client.ensure_path(layout.task_bucket("t10"))
    client.ensure_path(layout.task_bucket("t11"))
    for t in ("t10", "t11"):
        tx = client.transaction()
        tx.create(layout.task(t), client.get(f"{layout.tasks}/{t}")[0])
        tx.delete(f"{layout.tasks}/{t}")
        tx.commit()
    with pytest.raises(LayoutError):
        ensure_layout(client, layout)  # still flat: refused
    first = migrate(client, layout)
    assert not first.done and first.moved == 36 + 40  # 38 flat tasks but t3 and t4, and every status
    assert {p.rsplit("/", 1)[1]: w for p, w in first.blocked}.keys() == {"t3", "t4", "Bad Name"}
    assert "owner" in dict(first.blocked)[f"{layout.tasks}/t3"] and "stray" in dict(first.blocked)[f"{layout.tasks}/t4"]
    assert client.exists(layout.layout_info) is None and client.exists(layout.layout_migration) is None
    with pytest.raises(LayoutError, match=r"3 task\(s\)"):
        ensure_layout(client, layout)
    r = CliRunner().invoke(cli, ["--zk", zk_hosts, "--zk-root", layout.root, "layout", "migrate"], prog_name="zkctl")
    assert r.exit_code == 1 and "3 cannot move" in r.output and "t3: its owner znode" in r.output, r.output
    client.delete(f"{layout.tasks}/t3/owner")
    client.delete(f"{layout.tasks}/t4", recursive=True)
    client.delete(f"{layout.tasks}/Bad Name")
    second = migrate(client, layout)
    assert second.done and second.moved == 1 and second.blocked == ()
    assert list_tasks(client, layout) == sorted(set(ids) - {"t4"})
    ensure_layout(client, layout)


def test_layout_commands(flat, zk_hosts: str):
    client, layout = flat
    run = lambda *a: CliRunner().invoke(
        cli, ["--zk", zk_hosts, "--zk-root", layout.root, "--json", *a], prog_name="zkctl"
    )
    _flat_root(client, layout, ["a", "b", "c"], statuses=["a"])
    r = run("layout", "show")
    assert r.exit_code == 1 and json.loads(r.output) == {
        "root": layout.root,
        "layout": 1,
        "state": "flat",
        "flat_tasks": 3,
        "flat_statuses": 1,
        "bucketed_tasks": 0,
        "bucketed_statuses": 0,
        "tasks": 3,
        "statuses": 1,
    }
    r = run("layout", "migrate", "--dry-run")
    assert r.exit_code == 0 and json.loads(r.output)["tasks"] == 3 and client.exists(layout.layout_info) is None
    r = run("layout", "migrate")
    assert r.exit_code == 0 and json.loads(r.output)["done"] is True, r.output
    shown = json.loads(run("layout", "show").output)
    assert (shown["layout"], shown["buckets"], shown["tasks"], shown["statuses"], shown["missing_buckets"]) == (
        2,
        256,
        3,
        1,
        0,
    )
    assert shown["largest_bucket"] == 1 and shown["largest_listing_bytes"] == 5
    assert json.loads(run("layout", "migrate").output)["already"] is True


def test_garbage_in_a_bucket_is_logged_and_isolated(cluster, zk: KazooClient, layout: ZkLayout, caplog):
    other = next(b for b in (layout.task_buckets) if b.rsplit("/", 1)[1] != bucket_of("t1"))
    zk.create(layout.task("t1"), _spec("t1"))
    zk.create(f"{other}/t1", _spec("t1"))  # a task in another id's bucket
    zk.create(f"{layout.task_bucket('t1')}/-bad", b"")  # not a task id
    zk.create(f"{layout.status_bucket('t2')}/zz z", b"")
    assert list_tasks(zk, layout) == ["t1"] and list_statuses(zk, layout) == []
    assert "its bucket is" in caplog.text and "not a legal id" in caplog.text
    ctl = cluster.controller("c1")
    cluster.worker("b1")
    wait_until(lambda: ctl.active and ctl.ctx is not None and set(ctl.ctx.tasks) == {"t1"}, 10, "t1 loaded")
    zk.create(layout.task("t2"), _spec("t2"))
    wait_until(lambda: "t2" in ctl.ctx.tasks, 10, "t2 seen")
    admin = AdminClient(zk, layout)
    wait_until(lambda: {r.task_id: r.owner for r in admin.list_tasks()} == {"t1": "b1", "t2": "b1"}, 30, "both run")
    assert ctl.active


def test_large_specs_move_in_multis_under_the_request_limit(flat):
    """A multi is bounded by bytes too: 60 specs of ~40 KB are 2.4 MB, more than one ZooKeeper request."""
    client, layout = flat
    ids = [f"big-{i}" for i in range(60)]
    for p in layout.persistent_roots():
        client.ensure_path(p)
    for t in ids:
        client.create(
            f"{layout.tasks}/{t}",
            TaskSpec(id=t, pipeline=NoopPipeline(kind="noop", fail_message="x" * 40_000)).encode(),
        )
    result = migrate(client, layout)
    assert result.done and result.moved == 60 and result.multis >= 5, result
    assert list_tasks(client, layout) == sorted(ids)
