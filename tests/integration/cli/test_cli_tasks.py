"""``zkctl task ...`` against the real ZooKeeper: listing by pages, the task lifecycle (create, pause, resume,
restart, delete), restarting every failed task, the schema, and STOPPED with offsets and their reset.

Every process a test starts is stopped by its pid in a ``finally``; the helpers are ``tests.cli_support``, the
``cluster`` fixture (a controller and two no-op workers in this process) ``tests/integration/conftest.py``."""

from __future__ import annotations

import json
import re
import subprocess

from tests.cli_support import ZKCTL, assert_user_error, invoke, ok, ok_json, until, write_specs, zkctl


def test_task_list_pages_with_a_cursor(cli_env, zk, layout):
    from controller.admin import AdminClient
    from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

    ids = [f"pg-{i}" for i in range(7)]
    AdminClient(zk, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    seen: list[str] = []
    args = ["task", "list", "--limit", "3"]
    for _ in range(5):
        result = invoke(args, env=cli_env)
        assert result.exit_code == 0, result.output
        seen += [t for t in ids if f"\n{t} " in "\n" + result.output]
        nxt = [line for line in result.output.splitlines() if line.startswith("next page: --cursor ")]
        if not nxt:
            break
        args = ["task", "list", "--limit", "3", "--cursor", nxt[0].rsplit(" ", 1)[1]]
    assert sorted(seen) == ids
    page = json.loads(invoke(["--json", "task", "list", "--limit", "2", "--group", "nope"], env=cli_env).output)
    assert page["rows"] == [] and page["next_cursor"] is None
    assert invoke(["task", "list", "--limit", "0"], env=cli_env).exit_code == 2  # click's usage error
    assert_user_error(invoke(["task", "list", "--cursor", "no such/id"], env=cli_env), "invalid cursor")


# ---- behaviour (subprocesses against the real ZooKeeper) -------------------------------------------
def test_task_lifecycle_create_pause_resume_restart_delete(noop_cluster, cli_env, tmp_path, zk, layout):
    out = ok(cli_env, "task", "create", "-f", str(write_specs(tmp_path / "s.yaml", "t1", "t2", "t3", "t4")))
    assert "Created 4 tasks: t1, t2, t3, t4" in out
    placed = noop_cluster.wait_running({"t1", "t2", "t3", "t4"})
    assert set(placed.values()) == {"b0", "b1"}
    rows = {r["task_id"]: r for r in ok_json(cli_env, "task", "list")}
    until(lambda: all(r["status"] == "RUNNING" for r in ok_json(cli_env, "task", "list")), what="statuses")
    assert {t: r["owner"] for t, r in rows.items()} == placed
    table = ok(cli_env, "task", "list").splitlines()
    header = ["ID", "GROUP", "STATE", "KIND", "OWNER", "GEN", "STATUS", "RESTARTS", "RATE", "BACKLOG", "ERROR"]
    assert table[0].split() == header and len(table) == 5

    assert "Task t1 paused" in ok(cli_env, "task", "pause", "t1")
    noop_cluster.wait_running({"t2", "t3", "t4"})
    until(lambda: zk.exists(layout.task_owner("t1")) is None, what="t1 released")
    row = next(r for r in ok_json(cli_env, "task", "list") if r["task_id"] == "t1")
    assert row["state"] == "PAUSED" and row["owner"] is None
    assert "already PAUSED" in ok(cli_env, "task", "pause", "t1")

    assert "Task t1 resumed" in ok(cli_env, "task", "resume", "t1")
    noop_cluster.wait_running({"t1", "t2", "t3", "t4"})

    runner_of_t2 = noop_cluster.workers[noop_cluster.running()["t2"]]
    runs_before = sum(1 for i in runner_of_t2.intervals if i.task_id == "t2")
    assert "restart nonce 1" in ok(cli_env, "task", "restart", "t2")
    until(
        lambda: (
            sum(1 for i in runner_of_t2.intervals if i.task_id == "t2") > runs_before
            and "t2" in runner_of_t2.running_tasks()
        ),
        what="t2 restarted in place",
    )
    desc = ok_json(cli_env, "task", "describe", "t2")
    assert desc["spec"]["restart_nonce"] == 1 and desc["owner"]["broker"] == runner_of_t2.id
    human = ok(cli_env, "task", "describe", "t2")
    assert "Owner:" in human and runner_of_t2.id in human and '"restart_nonce": 1' in human

    assert "Task t1 deleted" in ok(cli_env, "task", "delete", "t1", "--wait", "--timeout", "20")
    assert zk.exists(layout.task("t1")) is None and zk.exists(layout.status("t1")) is None
    noop_cluster.wait_running({"t2", "t3", "t4"})
    p = zkctl(cli_env, "task", "describe", "t1")
    assert p.returncode == 1 and p.stderr.strip() == "Error: unknown task 't1'" and p.stdout == ""


def test_restart_failed_restarts_every_failed_task_in_one_write(noop_cluster, cli_env, tmp_path, zk, layout):
    specs = tmp_path / "failing.yaml"
    specs.write_text(
        "".join(
            f"- id: {t}\n  restart: {{max_attempts: 0}}\n  pipeline: {{kind: noop, fail_after_s: 0.1, "
            f"fail_message: {t} broke}}\n"
            for t in ("f1", "f2")
        )
        + "- id: ok\n  pipeline: {kind: noop}\n"
    )
    assert "No FAILED tasks; nothing to restart" in ok(cli_env, "task", "restart", "--failed")
    ok(cli_env, "task", "create", "-f", str(specs))
    until(
        lambda: (
            {r["task_id"]: r["shown"] for r in ok_json(cli_env, "task", "list")}
            == {"f1": "FAILED", "f2": "FAILED", "ok": "RUNNING"}
        ),
        30,
        "f1 and f2 FAILED",
    )
    human = ok(cli_env, "task", "describe", "f1")
    assert (
        "Restarts:" in human
        and "up to 0 automatic restarts" in human
        and "gave up after 1 failure: FAILED until `zkctl task restart`" in human
    )
    assert "Last error:" in human and "f1 broke" in human

    assert ok(cli_env, "task", "restart", "--failed").splitlines() == ["Restarted 2 FAILED tasks: f1, f2"]
    assert {t: zk.exists(layout.task(t)).version for t in ("f1", "f2", "ok")} == {"f1": 1, "f2": 1, "ok": 0}
    assert len({zk.exists(layout.task(t)).mzxid for t in ("f1", "f2")}) == 1, "one multi"
    assert "No FAILED tasks in group other; nothing to restart" in ok(
        cli_env, "task", "restart", "--failed", "--group", "other"
    )
    until(
        lambda: (
            {r["task_id"]: r["shown"] for r in ok_json(cli_env, "task", "list")}
            == {"f1": "FAILED", "f2": "FAILED", "ok": "RUNNING"}
        ),
        30,
        "f1 and f2 FAILED again",
    )
    ok(cli_env, "task", "pause", "f2")
    out = ok_json(cli_env, "task", "restart", "--failed", "--group", "default")
    assert [c["task_id"] for c in out["restarted"]] == ["f1"] and out["restarted"][0]["restart_nonce"] == 2
    assert out["skipped"] == [{"task_id": "f2", "reason": "PAUSED: resume it to run it again"}]
    assert out["multis"] == 1 and out["group"] == "default" and out["only_failed"] is True
    desc = ok_json(cli_env, "task", "describe", "f1")
    assert desc["restart"]["max_attempts"] == 0 and desc["spec"]["restart"]["backoff_initial_s"] == 0.5


def test_task_schema_needs_no_zookeeper_and_is_the_specs_schema(tmp_path):
    p = subprocess.run([ZKCTL, "--zk", "127.0.0.1:1", "task", "schema"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    schema = json.loads(p.stdout)
    assert schema["$defs"]["TaskSpec"]["required"] == ["id", "pipeline"] and "anyOf" in schema


def test_stop_offsets_and_reset_offsets_commands(noop_cluster, cli_env, tmp_path, zk, layout):
    """`task stop --wait`, `task offsets`, `task reset-offsets` and `task delete --purge-checkpoint` over a
    checkpoint in Spark's format on the brokers' storage: the CLI never reads it, the broker that ran the task
    does."""
    from tests.offsets_support import fake_checkpoint, spark_spec

    noop_cluster.admin.create_tasks([spark_spec("o1", tmp_path)])
    noop_cluster.wait_running({"o1"})
    ck = noop_cluster.checkpoint_root / "o1"
    fake_checkpoint(ck, tmp_path)
    run = lambda *a: invoke(list(a), env=cli_env)  # noqa: E731
    assert_user_error(run("task", "reset-offsets", "o1", "--to-earliest"), "must be STOPPED", "RUNNING")

    res = run("task", "stop", "o1", "--wait", "--timeout", "20")
    assert res.exit_code == 0 and res.stdout.strip() == "Task o1 stopped; it runs nowhere", res.output
    out = run("task", "offsets", "o1").stdout
    assert "last committed batch 2 (planned " in out and "batches kept from 0" in out, out
    assert "1 file(s) in that batch, 3 taken so far, 1 waiting" in out, out
    assert run("--json", "task", "offsets", "o1").stdout.count('"last_committed": 2') == 1
    log = ck / "sources" / "0" / "2"
    kept = log.read_bytes()
    log.write_text('v1\n{"path":"file:///x\\u001b[2J\\nforged line","timestamp":1,"batchId":2}')
    out = run("task", "offsets", "o1").stdout  # a name from the checkpoint cannot drive the terminal
    assert "  file:///x\\x1b[2J forged line\n" in out and "\x1b" not in out, out
    log.write_bytes(kept)

    for args, needle in [
        ((), "give exactly one of --to-earliest, --to-latest, --to-batch N"),
        (("--to-earliest", "--to-latest"), "give exactly one of"),
        (("--to-batch", "-1"), "-1 is not in the range x>=0"),
    ]:
        res = run("task", "reset-offsets", "o1", *args)
        assert res.exit_code == 2 and needle in res.stderr, (args, res.output)
    assert_user_error(run("task", "reset-offsets", "o1", "--to-batch", "9"), "(kept: 0 to 2)")
    dry = run("task", "reset-offsets", "o1", "--to-batch", "1", "--dry-run").stdout
    assert (
        dry.startswith("Dry run: task o1 reset to batch 1 on broker b")
        and ("the next start reads after batch 1" in dry)
        and ("sink: would remove batches 2-2 (1 data file(s))" in dry)
    ), dry
    assert (ck / "offsets" / "2").exists()
    got = json.loads(run("--json", "task", "reset-offsets", "o1", "--to-earliest").stdout)
    assert (got["position"], got["dry_run"], got["sink_files_removed"]) == (-1, False, 3) and not ck.exists()
    human = run("task", "describe", "o1").stdout
    assert re.search(
        r"History: +[-0-9]+ [:0-9]+ \(\d+s ago\) stop \(was RUNNING\); .* reset-offsets \(to earliest: ", human
    ), human
    assert re.search(rf"Checkpoint: +{re.escape(str(ck))} \(none there, on broker b[01]\)", human), human

    res = run("task", "delete", "o1", "--purge-checkpoint")
    assert res.exit_code == 2 and "--purge-checkpoint needs --wait" in res.stderr
    assert "Task o1 resumed" in run("task", "resume", "o1").stdout
    noop_cluster.wait_running({"o1"})
    ck.mkdir(parents=True)
    (ck / "metadata").write_text("{}")
    res = run("task", "delete", "o1", "--wait", "--timeout", "20", "--purge-checkpoint")
    assert res.exit_code == 0 and f"note: checkpoint {ck} removed on broker b" in res.stdout, res.output
    assert not ck.exists() and zk.exists(layout.task_history("o1")) is None
