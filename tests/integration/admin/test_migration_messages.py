"""``zkctl layout`` after a migration was killed: ``layout show`` counts a half-migrated root's tasks in
their buckets as well as those still flat, and a rerun while the killed run's session has not expired yet
says whose lock it is and when it goes (issue "Hostile input, round 3")."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cli.main import cli
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.subtrees import delete_tree


@pytest.fixture
def flat(zk_hosts: str, zk_root: str):
    layout = ZkLayout(zk_root + "-halfway")
    client = make_client(ZkSettings(hosts=zk_hosts, root=layout.root, session_timeout_s=4.0))
    try:
        for p in layout.persistent_roots():
            client.ensure_path(p)
        for t in ("a", "b", "c", "d"):
            client.create(f"{layout.tasks}/{t}", TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")).encode())
        yield client, layout
    finally:
        delete_tree(client, layout.root)
        client.stop()
        client.close()


def test_a_half_migrated_root_counts_every_task_and_a_held_lock_says_when_it_goes(flat, zk_hosts):
    client, layout = flat
    run = lambda *a: CliRunner().invoke(cli, ["--zk", zk_hosts, "--zk-root", layout.root, *a], prog_name="zkctl")  # noqa: E731
    for t in ("a", "b"):  # a run killed half-way: two tasks in their buckets already
        client.ensure_path(layout.task_bucket(t))
        tx = client.transaction()
        tx.create(layout.task(t), client.get(f"{layout.tasks}/{t}")[0])
        tx.delete(f"{layout.tasks}/{t}")
        tx.commit()
    r = run("--json", "layout", "show")
    shown = json.loads(r.output)
    assert r.exit_code == 1 and shown["state"] == "half-migrated", r.output
    assert (shown["tasks"], shown["flat_tasks"], shown["bucketed_tasks"]) == (4, 2, 2), shown
    assert "half-migrated: 4 tasks" in run("layout", "show").output

    # the killed run's lock: an ephemeral of a session that has not expired yet
    holder = make_client(ZkSettings(hosts=zk_hosts, root=layout.root, session_timeout_s=4.0))
    try:
        holder.create(layout.layout_migration, b"", ephemeral=True)
        r = run("layout", "migrate")
        assert r.exit_code == 1, r.output
        assert f"held by ZooKeeper session 0x{holder.client_id[0]:x}" in r.output, r.output
        assert "has not expired yet" in r.output and "goes when its session expires" in r.output, r.output
    finally:
        holder.stop()
        holder.close()
    r = run("--json", "layout", "migrate")
    assert r.exit_code == 0 and json.loads(r.output)["done"] is True, r.output
