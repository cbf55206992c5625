"""Status that does not lie: a task's status names the session that wrote it, and every admin read (``task list``,
``status``, ``describe``, the HTTP API's rows) shows a status its session no longer backs as STALE and a task to
run that nobody holds as UNASSIGNED, with how long (the rules alone: tests/unit/admin/test_views.py)."""

from __future__ import annotations

import time

from controller.admin import AdminClient, to_dict
from controller.protocol.records import codecs, task_records
from controller.protocol.records.task_records import OwnerInfo, TaskStatus
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from tests.cli_support import ok, ok_json, until


# ---- against a real ZooKeeper ----------------------------------------------------------------------------------
def test_a_dead_brokers_tasks_show_unassigned_and_its_statuses_stale_everywhere(noop_cluster, cli_env, zk, layout):
    tasks = [f"s{i}" for i in range(6)]
    noop_cluster.admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    where = noop_cluster.wait_running(set(tasks))
    until(
        lambda: all(r.status == "RUNNING" and r.shown == "RUNNING" for r in noop_cluster.admin.list_tasks()),
        20,
        "every status RUNNING",
    )
    rows = {r.task_id: r for r in noop_cluster.admin.list_tasks()}
    for r in rows.values():  # every status names its writer's session: the owner znode's
        owner_session = zk.exists(layout.task_owner(r.task_id)).ephemeralOwner
        status = codecs.decode(TaskStatus, zk.get(layout.status(r.task_id))[0])
        assert status.session == task_records.session_hex(owner_session)
    noop_cluster.controller.stop()  # nothing moves from here on
    victim = where["s0"]
    survivor = next(b for b in noop_cluster.workers if b != victim)
    gone = sorted(t for t, b in where.items() if b == victim)
    kept = sorted(t for t, b in where.items() if b != victim)
    noop_cluster.workers[victim].kill()  # its session closes: its owner znodes vanish, its RUNNING statuses stay
    until(lambda: all(zk.exists(layout.task_owner(t)) is None for t in gone), 10, "the dead broker's owners gone")
    first = {r.task_id: r for r in noop_cluster.admin.list_tasks()}
    for t in gone:
        assert first[t].shown == "UNASSIGNED" and first[t].status == "RUNNING", first[t]
        assert first[t].unassigned_since is not None and first[t].unassigned_since <= time.time()
    for t in kept:
        assert first[t].shown == "RUNNING" and not first[t].status_stale and first[t].owner == survivor
    since = first[gone[0]].unassigned_since
    until(lambda: time.time() >= since + 1.0, 10, "a second since the task was left unassigned")
    listing = ok(cli_env, "task", "list")
    line = next(ln for ln in listing.splitlines() if ln.startswith(gone[0] + " "))
    assert "UNASSIGNED" in line and "RUNNING" not in line.split("UNASSIGNED")[1], line
    waited = int(line.split("UNASSIGNED")[1].split()[0].rstrip("s"))
    assert waited >= 1  # it grows
    status_out = ok(cli_env, "status", "--full")
    assert f"UNASSIGNED {len(gone)}" in status_out, status_out
    assert ok_json(cli_env, "status", "--full")["tasks"]["unassigned_oldest"] <= first[gone[0]].unassigned_since + 1e-3
    described = ok(cli_env, "task", "describe", gone[0])
    assert "UNASSIGNED: last reported RUNNING by " + victim in described and "nobody holds it" in described, described
    api_row = to_dict(first[gone[0]])
    assert api_row["shown"] == "UNASSIGNED" and api_row["unassigned_since"] == first[gone[0]].unassigned_since

    # the broker comes back under a new session and holds one task again before reporting: the old status is stale
    zk.create(layout.task_owner(gone[0]), codecs.encode(OwnerInfo(broker=victim, generation=9)), ephemeral=True)
    row = next(r for r in noop_cluster.admin.list_tasks() if r.task_id == gone[0])
    assert row.status_stale and row.shown == "STALE" and row.unassigned_since is None, row
    line = next(ln for ln in ok(cli_env, "task", "list").splitlines() if ln.startswith(gone[0] + " "))
    assert f"STALE (last RUNNING by {victim}" in line, line
    described = AdminClient(zk, layout).describe_task(gone[0])
    assert described.shown == "STALE" and described.status_stale
    assert ok_json(cli_env, "status", "--full")["tasks"]["by_status"].get("STALE", 0) >= 1
