"""``task apply`` / ``rollback`` / ``history`` / ``wait`` against a real ZooKeeper, a controller and a no-op worker
in this process (it runs a spark spec as simulated work): a change restarts the task in place (same owner znode,
same generation), a stale version and a change Spark cannot resume are refused and change nothing, every change
is in the history, and ``PUT /api/v1/tasks/{id}`` with ``If-Match`` does the same over HTTP. The same with real
Spark: tests/e2e/test_spark_apply.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, AdminError, Conflict, NotFound, wait_for
from controller.admin.task_apply import StaleVersion
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import admin_records, codecs, group_messages
from controller.protocol.tasks.spec import TaskSpec, decode_task, parse_spec
from tests.offsets_support import fake_checkpoint


def spec(task_id: str, tmp: Path, sql: str = "SELECT id FROM input", sink: str = "out", **extra: Any) -> TaskSpec:
    return parse_spec(
        {
            "id": task_id,
            "pipeline": {
                "source": {"type": "files", "format": "json", "path": str(tmp / "in"), "schema": "id LONG"},
                "transform": {"sql": sql},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp / sink)},
            },
            **extra,
        }
    )


@pytest.fixture
def cluster(zk, zk_settings, layout, tmp_path) -> Iterator[tuple[AdminClient, Worker]]:
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    worker = None
    try:
        assert ctl.wait_active(15)
        worker = Worker(
            WorkerConfig("b0", zk_settings, status_interval_s=0.1, on_halt="kill", checkpoint_root=str(tmp_path / "ck"))
        ).start()  # its checkpoint root holds the checkpoints a reset rewinds (it carries the reset out)
        yield AdminClient(zk, layout), worker
    finally:
        if worker is not None:
            worker.stop()
        ctl.stop()


def owner_and_generation(zk, layout, task_id: str) -> tuple[int, int]:
    """The owner znode's creation zxid (a new owner znode is a new one) and the group's generation."""
    _, stat = zk.get(layout.task_owner(task_id))
    state = codecs.decode(group_messages.GroupStateInfo, zk.get(layout.group_state("default"))[0])
    return stat.czxid, state.generation


def stored(zk, layout, task_id: str) -> tuple[TaskSpec, int]:
    data, stat = zk.get(layout.task(task_id))
    return decode_task(data, layout.task(task_id)), stat.version


def test_apply_changes_in_place_records_and_rolls_back(cluster, zk, layout, tmp_path):
    admin, worker = cluster
    first = admin.apply([spec("a1", tmp_path, revision=5)])  # a revision in a file is the cluster's to count
    assert [(i.task_id, i.action, i.to_revision) for i in first.items] == [("a1", "create", 1)]
    assert admin.wait(["a1"], "running", 30).reached
    assert stored(zk, layout, "a1")[0].revision == 1
    again = admin.apply([spec("a1", tmp_path)])
    assert not again.changed and again.items[0].action == "unchanged"  # idempotent
    before = owner_and_generation(zk, layout, "a1")
    starts = len([i for i in worker.intervals if i.task_id == "a1"])

    new_sql = "SELECT id, id * 2 AS twice FROM input"
    dry = admin.apply([spec("a1", tmp_path, new_sql)], dry_run=True)
    assert dry.items[0].action == "update" and [c.path for c in dry.items[0].changes] == ["pipeline.transform.sql"]
    assert stored(zk, layout, "a1")[0].revision == 1  # a dry run writes nothing

    done = admin.apply([spec("a1", tmp_path, new_sql)], if_version=1)
    item = done.items[0]
    assert (item.action, item.from_revision, item.to_revision) == ("update", 1, 2)
    new, _ = stored(zk, layout, "a1")
    assert new.revision == 2 and new.pipeline.transform.sql == new_sql and new.state == "RUNNING"
    # restarted in place: a new run on the same broker, the same owner znode, no new generation
    assert wait_for(lambda: len([i for i in worker.intervals if i.task_id == "a1"]) > starts, 30)
    assert admin.wait(["a1"], "running", 30).reached
    assert owner_and_generation(zk, layout, "a1") == before
    d = admin.describe_task("a1")
    assert d.spec_version == 2 and d.status is not None and d.status["revision"] == 2  # the owner says it runs v2
    assert [r.status_revision for r in admin.list_tasks() if r.task_id == "a1"] == [2]

    # a stale version is refused and changes nothing
    _, zk_version = stored(zk, layout, "a1")
    with pytest.raises(StaleVersion, match="at spec version 2, not 1"):
        admin.apply([spec("a1", tmp_path, "SELECT id + 1 AS id FROM input")], if_version=1)
    assert stored(zk, layout, "a1")[1] == zk_version

    h = admin.history("a1")
    assert [(e.action, e.from_revision, e.to_revision) for e in h.events] == [("apply", 1, 2)]
    assert h.events[0].who == "anonymous" and "pipeline.transform.sql" in h.events[0].detail
    assert [r.revision for r in h.specs] == [1, 2]

    back = admin.rollback("a1", 1)
    assert (back.from_revision, back.to_revision) == (2, 3)
    assert stored(zk, layout, "a1")[0].pipeline.transform.sql == "SELECT id FROM input"
    assert [e.action for e in admin.history("a1").events] == ["apply", "rollback to 1"]
    with pytest.raises(NotFound, match=r"kept: 1, 2, 3"):
        admin.rollback("a1", 9)
    assert admin.wait(["a1"], "running", 30).reached
    assert owner_and_generation(zk, layout, "a1") == before

    # a change that is no new pipeline (the restart policy) is no restart; the owner reports the version all the same
    runs = len([i for i in worker.intervals if i.task_id == "a1"])
    admin.apply([spec("a1", tmp_path, restart={"max_attempts": 9})])
    assert admin.wait(["a1"], "running", 30).reached
    assert admin.describe_task("a1").status["revision"] == 4
    assert len([i for i in worker.intervals if i.task_id == "a1"]) == runs


def test_incompatible_changes_need_a_stopped_task_and_a_reset(cluster, zk, layout, tmp_path):
    admin, _worker = cluster
    admin.apply([spec("a2", tmp_path)])
    assert admin.wait(["a2"], "running", 30).reached
    _, zk_version = stored(zk, layout, "a2")
    other_sink = spec("a2", tmp_path, sink="out2")
    with pytest.raises(Conflict, match="another sink path.*stop the task, then apply it with a reset"):
        admin.apply([other_sink])
    with pytest.raises(Conflict, match="a reset needs it STOPPED"):
        admin.apply([other_sink], reset=True)
    with pytest.raises(Conflict, match="another group"):
        admin.apply([spec("a2", tmp_path, group="g2")])
    assert stored(zk, layout, "a2")[1] == zk_version  # nothing was changed
    # the whole apply is refused when one of its changes is: the new task of the same file is not created
    with pytest.raises(Conflict):
        admin.apply([spec("a3", tmp_path), other_sink])
    assert zk.exists(layout.task("a3")) is None

    assert admin.stop("a2", wait=30).confirmed
    with pytest.raises(Conflict, match="apply it with a reset"):
        admin.apply([other_sink])
    fake_checkpoint(tmp_path / "ck" / "a2", tmp_path)
    done = admin.apply([other_sink], reset=True).items[0]
    assert done.to_revision == 2 and any("checkpoint reset to earliest" in n for n in done.notes)
    assert not (tmp_path / "ck" / "a2").exists()
    assert stored(zk, layout, "a2")[0].state == "STOPPED"  # apply keeps the run state
    assert [e.action for e in admin.history("a2").events] == ["stop", "apply", "reset-offsets"]

    # garbage kept in the history is refused by a rollback, named, and changes nothing
    hist = admin.history("a2")
    bad = admin_records.SpecRevision(9, '{"id": "a2", "pipeline": {"kind": "sprak"}}')
    zk.set(layout.task_history("a2"), codecs.encode(admin_records.TaskHistory(hist.events, None, (*hist.specs, bad))))
    _, zk_version = stored(zk, layout, "a2")
    with pytest.raises(AdminError, match="kept spec version 9 is unreadable"):
        admin.rollback("a2", 9)
    assert stored(zk, layout, "a2")[1] == zk_version

    # while a reset is under way, apply is refused
    hist = admin.history("a2")
    zk.set(layout.task_history("a2"), codecs.encode(admin_records.TaskHistory(hist.events, 9e12, hist.specs)))
    with pytest.raises(Conflict, match="a reset of its offsets began"):
        admin.apply([spec("a2", tmp_path, sink="out2", weight=2)])


def test_wait_says_what_each_task_waits_for(cluster, zk, layout, tmp_path):
    admin, _worker = cluster
    admin.apply([spec("w1", tmp_path), spec("w2", tmp_path, state="PAUSED")])
    res = admin.wait(["w1", "w2"], "running", 1.0)
    assert not res.reached and dict(res.waiting)["w2"] == "a resume (the task is PAUSED)"
    assert admin.wait(["w1"], "running", 30).reached
    assert admin.resume("w2").changed
    assert admin.wait(["w1", "w2"], "running", 30).reached
    admin.stop("w1")
    assert admin.wait(["w1"], "stopped", 30).reached
    gone = admin.wait(["w2"], "deleted", 0.2)
    assert not gone.reached and gone.waiting == (("w2", "its deletion"),)
    admin.delete_task("w2")
    assert admin.wait(["w2"], "deleted", 30).reached
    assert not admin.wait(["nope"], "running", 0.2).reached


def test_cli_apply_from_stdin_and_wait(cluster, zk, layout, zk_settings, tmp_path):
    env = {"ZKC_ZK": zk_settings.hosts, "ZKC_ROOT": layout.root}
    text = json.dumps([spec("c1", tmp_path).model_dump(mode="json", by_alias=True)])
    r = invoke(["task", "apply", "-f", "-", "--wait", "--timeout", "30"], env=env, input=text)
    assert r.exit_code == 0, r.output
    assert "c1: created" in r.output
    r = invoke(["task", "apply", "-f", "-"], env=env, input=text)
    assert r.exit_code == 0 and "Nothing to change" in r.output and "c1: unchanged" in r.output
    changed = json.dumps(spec("c1", tmp_path, "SELECT id, 1 AS one FROM input").model_dump(mode="json", by_alias=True))
    r = invoke(["task", "apply", "-f", "-", "--dry-run"], env=env, input=changed)
    assert r.exit_code == 0 and "would change" in r.output and "pipeline.transform.sql" in r.output
    r = invoke(["task", "apply", "-f", "-", "--if-version", "7"], env=env, input=changed)
    assert r.exit_code == 1 and "at spec version 1, not 7" in r.output
    r = invoke(["task", "apply", "-f", "-", "--if-version", "1", "--wait", "--timeout", "30"], env=env, input=changed)
    assert r.exit_code == 0 and "spec version 1 -> 2" in r.output, r.output
    r = invoke(["task", "history", "c1"], env=env)
    assert r.exit_code == 0 and "1 -> 2" in r.output and "kept for rollback: 1, 2" in r.output
    r = invoke(["task", "history", "nope"], env=env)
    assert r.exit_code == 1 and "unknown task 'nope'" in r.output
    r = invoke(["task", "pause", "c1"], env=env)
    r = invoke(["task", "wait", "c1", "--for", "running", "--timeout", "0.5"], env=env)
    assert r.exit_code == 1 and "c1 is waiting for a resume (the task is PAUSED)" in r.output
    r = invoke(["task", "resume", "c1", "--wait", "--timeout", "30"], env=env)
    assert r.exit_code == 0, r.output
    r = invoke(["task", "rollback", "c1", "--to-version", "1", "--wait", "--timeout", "30"], env=env)
    assert r.exit_code == 0 and "spec version 2 -> 3" in r.output, r.output


def invoke(args: list[str], env: dict[str, str], input: str | None = None) -> Result:
    from cli.main import cli

    return CliRunner().invoke(cli, args, env=env, input=input, prog_name="zkctl")


def _http(base: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def test_put_with_if_match(cluster, zk, layout, tmp_path):
    import uvicorn

    from controller.api.app import create_app
    from controller.api.context import ApiConfig
    from controller.zk.server import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ApiConfig(zk, layout)), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api-server", daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: server.started, 30)
        base = f"http://127.0.0.1:{port}/api/v1/tasks"
        body = spec("p1", tmp_path).model_dump(mode="json", by_alias=True)
        status, out, headers = _http(base, "PUT", "/p1", body, {"If-Match": '"1"'})
        assert status == 412 and out["error"] == "stale_version"  # If-Match on a task that does not exist
        status, out, headers = _http(base, "PUT", "/p1", body, {"If-Match": "*"})
        assert status == 412 and "does not" in out["message"]
        status, out, headers = _http(base, "PUT", "/p1?wait=true&timeout=30", body)
        assert status == 201 and out["action"] == "create" and headers["etag"] == '"1"'
        status, out, headers = _http(base, "GET", "/p1")
        assert status == 200 and headers["etag"] == '"1"' and out["spec_version"] == 1
        changed = {**body, "pipeline": {**body["pipeline"], "transform": {"sql": "SELECT id, 2 AS two FROM input"}}}
        status, out, headers = _http(base, "PUT", "/p1", changed, {"If-Match": '"1"'})
        assert status == 200 and out["to_revision"] == 2 and headers["etag"] == '"2"'
        status, out, _ = _http(base, "PUT", "/p1", {**changed, "weight": 3}, {"If-Match": '"1"'})
        assert status == 412 and "at spec version 2, not 1" in out["message"]
        status, out, _ = _http(base, "PUT", "/p1", {**changed, "weight": 3}, {"If-Match": "v2; drop"})
        assert status == 412 and "If-Match must name one spec version" in out["message"]
        status, out, headers = _http(base, "PUT", "/p1", {**changed, "weight": 3}, {"If-Match": 'W/"2"'})
        assert status == 200 and headers["etag"] == '"3"' and "rebalance may move" in out["notes"][0]
        status, out, _ = _http(base, "PUT", "/p1", {**body, "id": "other"})
        assert status == 422
        status, out, _ = _http(
            base, "PUT", "/p1", {**body, "pipeline": {**body["pipeline"], "sink": {"type": "console"}}}
        )
        assert status == 409 and "another sink" in out["message"]
        status, out, _ = _http(base, "GET", "/p1/history")
        assert status == 200 and out["events"][0]["who"].startswith("api (no token")
        status, out, _ = _http(base, "POST", "/p1/rollback", {"to_version": 1})
        assert status == 200 and out["to_revision"] == 4
        status, out, _ = _http(base, "POST", "/p1/rollback", {"to_version": "1"})
        assert status == 422
        status, out, _ = _http(base, "GET", "/p1/wait?for=running&timeout=30")
        assert status == 200 and out["reached"] is True
        status, out, _ = _http(base, "GET", "/p1/wait?for=deleted&timeout=0.2")
        assert status == 504 and "its deletion" in out["message"]
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_change_right_after_the_start_ends_on_the_new_version(cluster, tmp_path):
    """A change that comes while the owner starts the task (busy) is looked at again once the start is over."""
    admin, _worker = cluster
    admin.apply([spec(f"r{i}", tmp_path) for i in range(5)])
    admin.apply([spec(f"r{i}", tmp_path, "SELECT id, 3 AS three FROM input") for i in range(5)])
    res = admin.wait([f"r{i}" for i in range(5)], "running", 30)
    assert res.reached, res.waiting
    assert {admin.describe_task(f"r{i}").status["revision"] for i in range(5)} == {2}
