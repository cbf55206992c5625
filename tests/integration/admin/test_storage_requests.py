"""Storage requests through a real ZooKeeper, answered by no-op brokers in this process: two clusters on one
state dir keep apart, a pipeline's own log comes back through the cluster, and garbage under
``/admin/storage`` is logged and skipped while the next request is answered."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.admin.common import Conflict
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.tasks.storage import checkpoint_root
from controller.zk.client import make_client
from controller.zk.layout_io import ensure_layout
from controller.zk.subtrees import delete_tree
from tests.cli_support import ok, until, zkctl
from tests.offsets_support import fake_checkpoint, spark_spec


@pytest.fixture
def two_clusters(zk_settings, tmp_path) -> Iterator[dict[str, tuple[AdminClient, Path]]]:
    """Clusters ``a`` and ``b`` on two roots of one ensemble, each a controller and a broker whose checkpoint
    root is decided from the same state dir (as two clusters started with one ``--state-dir`` are)."""
    state = tmp_path / "state"
    out: dict[str, tuple[AdminClient, Path]] = {}
    stops = []
    clients = []
    try:
        for name in ("a", "b"):
            settings = dataclasses.replace(zk_settings, root=f"{zk_settings.root}-{name}")
            layout = ZkLayout(settings.root)
            client = make_client(settings)
            clients.append((client, layout))
            ensure_layout(client, layout)
            ctl = Controller(ControllerConfig(f"ctl-{name}", settings, GroupConfig(rebalance_timeout_s=5.0))).start()
            stops.append(ctl.stop)
            assert ctl.wait_active(15)
            root = checkpoint_root(None, {}, str(state), settings.root, os.getcwd())
            worker = Worker(
                WorkerConfig(f"{name}0", settings, status_interval_s=0.1, on_halt="kill", checkpoint_root=root)
            ).start()
            stops.append(worker.stop)
            out[name] = (AdminClient(client, layout), Path(root))
        yield out
    finally:
        for stop in reversed(stops):
            stop()
        for client, layout in clients:
            delete_tree(client, layout.root)
            client.stop()
            client.close()


def test_a_purge_in_one_cluster_does_not_reach_the_other_on_the_same_state_dir(two_clusters, tmp_path):
    (admin_a, root_a), (admin_b, root_b) = two_clusters["a"], two_clusters["b"]
    assert root_a != root_b and root_a.parent == root_b.parent  # one state dir, a directory per cluster root
    for admin, root, sub in ((admin_a, root_a, "a"), (admin_b, root_b, "b")):
        (tmp_path / sub).mkdir()
        admin.create_tasks([spark_spec("orders", tmp_path / sub)])
        fake_checkpoint(root / "orders", tmp_path / sub)
    req = admin_a.delete_task("orders", wait=30, purge_checkpoint=True)
    assert req.done and any("removed on broker a0" in n for n in req.notes), req.notes
    assert not (root_a / "orders").exists()
    assert (root_b / "orders" / "offsets" / "2").is_file()  # cluster b's checkpoint of its own orders
    assert admin_b.offsets("orders").last_committed == 2


def test_a_pipelines_log_comes_back_through_the_cluster(noop_cluster, cli_env, tmp_path):
    noop_cluster.admin.create_tasks([spark_spec("lg", tmp_path)])
    noop_cluster.wait_running({"lg"})
    got = []

    def logged() -> bool:
        try:
            got[:] = [noop_cluster.admin.task_logs("lg", tail=50)]
        except Conflict:  # it just moved to the broker the second member's join gave it, which has not logged yet
            return False
        return any("state RUNNING" in line for line in got[0].lines)

    assert wait_for(logged, 30)
    first = got[0]
    assert first.broker in ("b0", "b1") and first.path.endswith("/lg.log")
    assert noop_cluster.admin.task_logs("lg", tail=1).lines == first.lines[-1:]
    later = noop_cluster.admin.task_logs("lg", since=first.offset)
    assert later.offset >= first.offset and not any(line in first.lines for line in later.lines if line)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**cli_env, "ZKC_STATE_DIR": str(tmp_path / "another-state")}
    out = ok(env, "task", "logs", "lg", "--tail", "5")
    # (the task may have moved to the other broker meanwhile, as a second member joins: its log is there then)
    assert re.match(r"# \S+/lg\.log on broker b[01]\n", out) and "state RUNNING" in out, out


def test_garbage_under_the_requests_is_skipped_and_the_next_request_answered(noop_cluster, zk, layout, tmp_path):
    noop_cluster.admin.create_tasks([spark_spec("gq", tmp_path)])
    fake_checkpoint(noop_cluster.checkpoint_root / "gq", tmp_path)
    zk.create(layout.admin_storage + "/bad<name>", b"x")
    zk.create(layout.storage_request("gq"), b"\x00garbage")
    assert noop_cluster.admin.offsets("gq").last_committed == 2  # the unreadable request was withdrawn first
    assert zk.exists(layout.storage_request("gq")) is None  # and ours once answered


def test_a_brokers_checkpoint_root_is_registered_and_shown(noop_cluster, cli_env):
    root = str(noop_cluster.checkpoint_root)
    until(lambda: len(noop_cluster.admin.brokers()) == 2, what="both brokers registered")
    assert {b.broker_id: b.checkpoint_root for b in noop_cluster.admin.brokers()} == {"b0": root, "b1": root}
    described = ok(cli_env, "broker", "describe", "b0")
    assert f"Checkpoints: {root}" in described, described
    assert root[:77] in ok(cli_env, "broker", "list")
    res = zkctl(cli_env, "broker", "describe", "nobody")
    assert res.returncode == 1 and "no live broker 'nobody'" in res.stderr, res


def test_describe_says_a_checkpoint_size_is_partial_when_its_walk_stopped(noop_cluster, cli_env, tmp_path, monkeypatch):
    """Many empty directories must not make `describe` report `0 B in 0 files` as if complete. The walk's
    bound is lowered here (the same code path as at 200,000 entries)."""
    from broker_sim.worker import checkpoint_files

    monkeypatch.setattr(checkpoint_files, "MAX_SIZE_ENTRIES", 100)
    noop_cluster.admin.create_tasks([spark_spec("many", tmp_path)])
    fake_checkpoint(noop_cluster.checkpoint_root / "many", tmp_path)
    for i in range(300):
        (noop_cluster.checkpoint_root / "many" / "state" / "0" / str(i)).mkdir(parents=True)
    noop_cluster.wait_running({"many"})
    d = noop_cluster.admin.describe_task("many")
    assert d.checkpoint.exists and not d.checkpoint.complete, d.checkpoint
    out = ok(cli_env, "task", "describe", "many")
    assert "(partial: the count stopped at its bound)" in out and "at least " in out, out
