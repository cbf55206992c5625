"""The admin client library against a real ZooKeeper (no controller needed): validation before any write,
one multi, conditional spec writes, pipelined reads, requests under /admin and the watch generator (the
timeline library alone: tests/unit/sim/test_timeline.py)."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections import Counter

import pytest

from controller.admin import AdminClient, AdminError
from controller.protocol.records import admin_records, codecs, registration_records, task_records
from controller.protocol.tasks.spec import SpecError, parse_spec
from controller.zk.layout_io import list_tasks
from controller.zk.subtrees import delete_tree


class CountingClient:
    """Counts synchronous and asynchronous kazoo calls (to prove reads are pipelined)."""

    SYNC = ("get", "exists", "get_children", "create", "set", "delete", "transaction")

    def __init__(self, client) -> None:
        self._client = client
        self.sync: Counter[str] = Counter()
        self.asynchronous: Counter[str] = Counter()
        self.before_write = None  # runs once, before the next spec write (a set, or a multi)

    def __getattr__(self, name: str):
        attr = getattr(self._client, name)
        if name in self.SYNC:

            def call(*args, **kwargs):
                self.sync[name] += 1
                if name in ("set", "transaction") and self.before_write is not None:
                    hook, self.before_write = self.before_write, None
                    hook()
                return attr(*args, **kwargs)

            return call
        if name.endswith("_async"):

            def call_async(*args, **kwargs):
                self.asynchronous[name] += 1
                return attr(*args, **kwargs)

            return call_async
        return attr


def specs(*ids: str, **extra):
    return [parse_spec({"id": t, "pipeline": {"kind": "noop"}, **extra}) for t in ids]


def test_create_writes_all_specs_in_one_multi_and_refuses_existing_ids(zk, layout):
    admin = AdminClient(zk, layout)
    dry = admin.create_tasks(specs("a", "b"), dry_run=True)
    assert dry.dry_run and dry.tasks == ("a", "b") and list_tasks(zk, layout) == []
    result = admin.create_tasks(specs("a", "b", "c"))
    assert result.multis == 1 and list_tasks(zk, layout) == ["a", "b", "c"]
    with pytest.raises(AdminError, match=r"already exist: a, c; nothing was created"):
        admin.create_tasks(specs("a", "d", "c"))
    assert "d" not in list_tasks(zk, layout)
    with pytest.raises(SpecError, match="appears twice"):
        admin.create_tasks(specs("x", "x"))


def test_create_removes_a_stale_status_of_a_reused_id(zk, layout):
    zk.create(
        layout.status("old"),
        codecs.encode(task_records.TaskStatus(broker="b", state="FAILED", generation=1, updated=0.0)),
    )
    AdminClient(zk, layout).create_tasks(specs("old"))
    assert zk.exists(layout.status("old")) is None


def test_declarative_specs_use_the_colleagues_validator_when_it_exists(zk, layout, monkeypatch):
    decl = [parse_spec({"id": "d1", "pipeline": {"kind": "declarative", "project": "/nowhere"}})]
    admin = AdminClient(zk, layout)
    monkeypatch.setitem(sys.modules, "broker_sim.runners.declarative", None)  # the module is missing
    result = admin.create_tasks(decl, dry_run=True)
    assert any("not checked" in n and "d1" in n for n in result.notes)

    fake = types.ModuleType("broker_sim.runners.declarative")

    def validate_declarative(pipeline):
        raise ValueError(f"no spark-pipeline.yml in {pipeline.project}")

    fake.validate_declarative = validate_declarative
    monkeypatch.setitem(sys.modules, "broker_sim.runners.declarative", fake)
    with pytest.raises(SpecError, match=r"task 'd1': pipeline.project: no spark-pipeline.yml in /nowhere"):
        admin.create_tasks(decl + specs("plain"))
    assert list_tasks(zk, layout) == []  # nothing written, not even the valid one

    fake.validate_declarative = lambda project: None  # a validator taking the project directory
    assert any("checked: d1" in n for n in admin.create_tasks(decl).notes)


def test_reads_are_pipelined_whatever_the_number_of_tasks(zk, layout):
    AdminClient(zk, layout).create_tasks(specs(*[f"t{i:03d}" for i in range(60)]))
    counting = CountingClient(zk)
    admin = AdminClient(counting, layout)
    rows = admin.list_tasks()
    status = admin.status()
    admin.describe_group()
    admin.brokers()
    assert len(rows) == 60 and status.tasks["total"] == 60 and status.tasks["unowned"] == 60
    assert sum(counting.sync.values()) == 0, counting.sync
    # the bulk (3 znodes per task) goes in multiRead requests: far fewer requests than znodes
    assert counting.asynchronous["get_async"] < 60, counting.asynchronous


def test_pause_resume_restart_are_conditional_writes(zk, zk_settings, layout):
    admin_client = CountingClient(zk)
    admin = AdminClient(admin_client, layout)
    admin.create_tasks(specs("t1"))

    def concurrent_change():  # another operator changes the spec between our read and our write
        spec = parse_spec({"id": "t1", "weight": 7, "pipeline": {"kind": "noop"}})
        zk.set(layout.task("t1"), spec.encode())

    admin_client.before_write = concurrent_change
    writes = admin_client.sync["transaction"]
    change = admin.pause("t1")
    assert change.changed and change.state == "PAUSED"
    assert admin_client.sync["transaction"] - writes == 2  # the first write failed on the version, the retry won
    desc = admin.describe_task("t1")
    assert desc.spec["state"] == "PAUSED" and desc.spec["weight"] == 7  # the concurrent change was kept
    assert not admin.pause("t1").changed
    assert admin.resume("t1").state == "RUNNING"
    assert admin.restart("t1").restart_nonce == 1 and admin.restart("t1").restart_nonce == 2
    with pytest.raises(AdminError, match="unknown task 'nope'"):
        admin.pause("nope")


def test_admin_requests_are_written_under_admin(zk, layout):
    admin = AdminClient(zk, layout)
    admin.create_tasks(specs("t1"))
    req = admin.delete_task("t1")
    assert req.path == layout.admin_delete_task("t1") and not req.already_pending
    assert admin.delete_task("t1").already_pending
    assert any("no active controller" in n for n in req.notes)
    with pytest.raises(AdminError, match="being deleted"):
        admin.pause("t1")
    zk.ensure_path(layout.group_members("g"))
    r1 = admin.rebalance("g")
    r2 = admin.rebalance()
    assert r1.path.startswith(layout.admin_rebalance_request_prefix) and r1.path != r2.path
    assert codecs.decode(admin_records.RebalanceRequest, zk.get(r1.path)[0]).group == "g"
    with pytest.raises(AdminError, match=r"unknown group 'h' \(groups: g\)"):
        admin.rebalance("h")
    with pytest.raises(AdminError, match="unknown broker 'b9'"):
        admin.shutdown_broker("b9")
    zk.create(
        layout.broker("b1"),
        codecs.encode(registration_records.BrokerInfo(broker_id="b1", host="h", pid=1, group="other")),
        ephemeral=True,
    )
    admin.create_tasks(specs("t2"))
    with pytest.raises(AdminError, match="broker 'b1' is in group 'other'"):
        admin.reassign("t2", "b1")
    with pytest.raises(AdminError, match="broker 'b2' is not live"):
        admin.reassign("t2", "b2")
    req = admin.shutdown_broker("b1")
    assert codecs.decode(admin_records.ControlledShutdownRequest, zk.get(req.path)[0]).broker == "b1"
    assert [b.broker_id for b in admin.brokers()] == ["b1"] and admin.brokers()[0].shutting_down
    assert admin.brokers()[0].epoch == zk.exists(layout.broker("b1")).czxid


def test_watch_yields_events_from_zookeeper_watches(zk, layout):
    admin = AdminClient(zk, layout)
    admin.create_tasks(specs("t0"))
    events = []
    gen = admin.watch(duration=20, max_events=4)
    first = next(gen)
    assert first.kind == "watching" and first.detail["tasks"] == 1

    def act():  # the scenario: four changes, each a moment after the last, as an operator makes them
        admin.create_tasks(specs("t1"))
        time.sleep(0.2)
        zk.create(
            layout.task_owner("t1"), codecs.encode(task_records.OwnerInfo(broker="b7", generation=3)), ephemeral=True
        )
        time.sleep(0.2)
        admin.pause("t0")
        time.sleep(0.2)
        zk.delete(layout.task_owner("t1"))

    t = threading.Thread(target=act)
    t.start()
    started = time.monotonic()
    events = [(e.kind, e.subject, e.detail.get("owner"), e.detail.get("state")) for e in gen]
    t.join()
    assert time.monotonic() - started < 10
    assert events == [
        ("task_created", "t1", None, "RUNNING"),
        ("task_owner", "t1", "b7", None),
        ("task_state", "t0", None, "PAUSED"),
        ("task_owner", "t1", None, None),
    ]
    started = time.monotonic()
    assert [e.kind for e in admin.watch(duration=0.3)] == ["watching"]
    assert time.monotonic() - started < 3


def test_watch_on_an_empty_root_writes_nothing_and_sees_the_cluster_appear(zk, zk_settings):
    from controller.protocol.cluster.layout import ZkLayout

    fresh = ZkLayout(zk_settings.root + "-fresh")
    admin = AdminClient(zk, fresh)
    gen = admin.watch(duration=15, max_events=2)
    assert next(gen).kind == "watching"
    assert zk.exists(fresh.root) is None  # a read command creates nothing
    try:
        admin.create_tasks(specs("t1"))  # lays out the root, then creates the task
        zk.create(
            fresh.controller, codecs.encode(registration_records.ControllerInfo("c1", 1, "h", 0.0)), ephemeral=True
        )
        assert sorted((e.kind, e.subject) for e in gen) == [("controller", "c1"), ("task_created", "t1")]
    finally:
        delete_tree(zk, fresh.root)
