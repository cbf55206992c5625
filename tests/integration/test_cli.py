"""``zkctl``: every user-error path in-process (click's CliRunner), behaviour as subprocesses
against the real ZooKeeper, with a controller and two no-op workers running in this test process where
the behaviour needs them. The long-running commands (daemons, signals, the simulator, the demo) are in
``test_cli_processes.py``; the helpers here serve both.

Every process a test starts is stopped by its pid in a ``finally``."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol import codecs
from controller.protocol.group import GroupConfig
from controller.protocol.taskspec import parse_spec
from controller.zk.layout_io import list_tasks
from controller.zk.server import free_port
from tests.cli_support import invoke

ZKCTL = shutil.which("zkctl", path=str(Path(sys.executable).parent)) or "zkctl"
PNG = b"\x89PNG\r\n\x1a\n"


# ---- helpers ----------------------------------------------------------------------------------------
def assert_user_error(result, *needles: str) -> str:
    """Exit 1, one line on stderr starting with 'Error:', no traceback, nothing on stdout."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # not an unexpected exception
    lines = result.stderr.strip().splitlines()
    # a --wait command's progress lines may come first (plain lines, as stderr is no terminal here)
    assert all(re.match(r"^\[\s*\d+\.\ds\] waiting for .*: \d+/\d+ ", line) for line in lines[:-1]), lines
    err = lines[-1] if lines else ""
    assert err.startswith("Error: "), err
    assert "Traceback" not in result.output and result.stdout == ""
    for n in needles:
        assert n in err, (n, err)
    return err


def zkctl(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ZKCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def ok(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    p = zkctl(env, *args, timeout=timeout)
    assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    return p.stdout


def ok_json(env: dict[str, str], *args: str, timeout: float = 60):
    return json.loads(ok(env, "--json", *args, timeout=timeout))


def until(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def stop_process(p: subprocess.Popen) -> None:
    """Stop a process we started, by its pid: SIGTERM, then SIGKILL."""
    if p.poll() is None:
        os.kill(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGKILL)
            p.wait(10)


def write_specs(path: Path, *ids: str) -> Path:
    path.write_text("\n".join(f"- id: {t}\n  pipeline: {{kind: noop}}" for t in ids) + "\n")
    return path


@dataclass
class Cluster:
    controller: Controller
    workers: dict[str, Worker]
    admin: AdminClient

    def running(self) -> dict[str, str]:
        """task -> the broker running it (fails on a task running twice)."""
        out: dict[str, str] = {}
        for b, w in self.workers.items():
            for t in w.running_tasks():
                assert t not in out, f"{t} runs on {out[t]} and {b}"
                out[t] = b
        return out

    def wait_running(self, tasks: set[str], timeout: float = 20.0) -> dict[str, str]:
        until(lambda: set(self.running()) == tasks, timeout, f"exactly {sorted(tasks)} running")
        return self.running()


@pytest.fixture
def cluster(zk, zk_settings, layout):
    """A controller and two no-op workers (b0, b1) in this process, on the test's root."""
    c = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    workers: dict[str, Worker] = {}
    try:
        assert c.wait_active(15)
        for b in ("b0", "b1"):
            workers[b] = Worker(
                WorkerConfig(b, zk_settings, status_interval_s=0.1, intervals_flush_s=0.2, on_halt="kill")
            ).start()
        yield Cluster(c, workers, AdminClient(zk, layout))
    finally:
        for w in workers.values():
            w.stop()
        c.stop()


# What `zkctl --version` and `zkctl --help` must not import: each would cost tenths of a second at every start.
HEAVY_IMPORTS = ("kazoo", "pydantic", "pyspark", "fastapi", "matplotlib")


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_import_nothing_heavy(args):
    """A CLI that answers at once: the commands are imported when used, so parsing the options and listing the
    commands loads neither ZooKeeper's client nor the models and libraries the commands build on."""
    p = subprocess.run([sys.executable, "-X", "importtime", ZKCTL, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert "click" in imported and "cli.main" in imported  # the trace is there to look at
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY_IMPORTS)
    assert heavy == [], heavy
    if args == ["--help"]:
        assert all(f"  {name} " in p.stdout for name in ("task", "status", "broker", "zk", "demo")), p.stdout


def test_command_summaries_match_their_help():
    """`zkctl --help` lists a command not imported yet from its summary in ``cli.main.COMMANDS``: the listing
    must read as click would make it from the command's own help, at any width."""
    from cli.cluster import broker
    from cli.main import COMMANDS, DEFAULT_HOSTS
    from controller.zk.client import DEFAULT_HOSTS as CLIENT_DEFAULT_HOSTS

    assert DEFAULT_HOSTS == CLIENT_DEFAULT_HOSTS
    lazy = dict(COMMANDS)
    lazy["broker run"] = broker.lazy.get("run") or pytest.fail("broker run is not a lazy command")
    for name, entry in lazy.items():
        if not entry.available():
            continue
        command = entry.load(name.split()[-1])
        assert command is not None and command.help is not None and "(unavailable:" not in command.help, name
        for width in (30, 45, 60, 100, 1000):
            assert entry.placeholder(name).get_short_help_str(width) == command.get_short_help_str(width), (name, width)


# ---- malformed specs: exit 1, the field named, nothing written --------------------------------------
BAD_SPECS = [
    ("missing.yaml", None, "cannot read"),
    ("bad.yaml", "id: [unclosed\n", "not valid YAML"),
    ("bad.json", '{"id": ', "not valid JSON"),
    ("empty.yaml", "", "empty file"),
    ("scalar.yaml", "42\n", "expected a mapping"),
    ("noid.yaml", "group: g\npipeline: {kind: noop}\n", "id is missing"),
    ("unknown.yaml", "id: a\ncolour: red\npipeline: {kind: noop}\n", "colour is not a field of a task spec"),
    ("nopipeline.yaml", "id: a\n", 'pipeline is missing: add "pipeline": {"kind": "spark"|"declarative"|"noop", ...}'),
    ("oldfield.yaml", "id: a\nmax_failures: 3\npipeline: {kind: noop}\n", "restart.max_attempts"),
    ("badid.yaml", "id: 'has space'\n", "task 'has space': id"),
    ("badgroup.yaml", "id: a\npipeline: {kind: noop}\ngroup: 'x/y'\n", "group"),
    ("state.yaml", "id: a\npipeline: {kind: noop}\nstate: SLEEPING\n", "state"),
    ("weight.yaml", "id: a\npipeline: {kind: noop}\nweight: 0\n", "weight"),
    ("kind.yaml", "id: a\npipeline: {kind: flink}\n", 'pipeline.kind "flink" is not one of spark, declarative, noop'),
    ("nosink.yaml", "id: a\npipeline: {kind: spark, source: {type: rate}}\n", "sink"),
    (
        "ratebatch.yaml",
        "id: a\npipeline: {kind: spark, mode: batch, source: {type: rate}, sink: {type: console}}\n",
        "streaming-only",
    ),
    (
        "noinput.yaml",
        "id: a\npipeline: {kind: spark, source: {type: rate}, sink: {type: console}, transform: {sql: 'SELECT 1'}}\n",
        "view named 'input'",
    ),
    (
        "files.yaml",
        "id: a\npipeline: {kind: spark, source: {type: files, format: xml, path: /d, schema: 'a INT'}, "
        "sink: {type: console}}\n",
        "format",
    ),
    ("pinned.yaml", "id: a\npipeline: {kind: noop}\nplacement: {pinned: ['no/pe']}\n", "broker id"),
    ("dup.yaml", "- {id: a, pipeline: {kind: noop}}\n- {id: a, pipeline: {kind: noop}}\n", "appears twice"),
    (
        "mixed.yaml",
        "- {id: good, pipeline: {kind: noop}}\n- {id: bad, weight: -3, pipeline: {kind: noop}}\n",
        "task 'bad': weight must be a whole number from 1 to 1000, not -3",
    ),
    ("decl.yaml", "id: a\npipeline: {kind: declarative}\n", "project"),
]


@pytest.mark.parametrize("name, content, needle", BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_malformed_specs_are_refused_and_nothing_is_written(name, content, needle, tmp_path, cli_env, zk, layout):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    for extra in ([], ["--dry-run"]):
        assert_user_error(invoke(["task", "create", "-f", str(path), *extra], env=cli_env), needle)
    assert list_tasks(zk, layout) == []


def test_existing_ids_are_refused_by_name_and_nothing_is_written(tmp_path, cli_env, zk, layout):
    assert (
        invoke(["task", "create", "-f", str(write_specs(tmp_path / "a.yaml", "t1", "t2"))], env=cli_env).exit_code == 0
    )
    assert_user_error(
        invoke(["task", "create", "-f", str(write_specs(tmp_path / "b.yaml", "t3", "t2"))], env=cli_env),
        "already exists: t2",
        "nothing was created",
    )
    assert list_tasks(zk, layout) == ["t1", "t2"]


def test_declarative_validator_failure_is_a_user_error(tmp_path, cli_env, zk, layout, monkeypatch):
    import types

    fake = types.ModuleType("broker_sim.runners.declarative")

    def validate_declarative(pipeline):
        raise ValueError(f"{pipeline.project}: no spark-pipeline.yml")

    fake.validate_declarative = validate_declarative
    monkeypatch.setitem(sys.modules, "broker_sim.runners.declarative", fake)
    spec = tmp_path / "d.yaml"
    spec.write_text(
        "- id: plain\n  pipeline: {kind: noop}\n- id: d1\n  pipeline: {kind: declarative, project: /nowhere}\n"
    )
    assert_user_error(
        invoke(["task", "create", "-f", str(spec)], env=cli_env),
        "task 'd1': pipeline.project: /nowhere: no spark-pipeline.yml",
    )
    assert list_tasks(zk, layout) == []
    monkeypatch.setitem(sys.modules, "broker_sim.runners.declarative", None)
    result = invoke(["task", "create", "-f", str(spec), "--dry-run"], env=cli_env)
    assert result.exit_code == 0 and "not checked" in result.output and "Dry run: 2 task specs valid" in result.output
    assert list_tasks(zk, layout) == []


# ---- other user errors: exit 1, one line -----------------------------------------------------------
def test_unknown_things_are_one_line_user_errors(cli_env, zk, layout):
    AdminClient(zk, layout).create_tasks([parse_spec({"id": "t1", "pipeline": {"kind": "noop"}})])
    for verb in ("describe", "delete", "pause", "resume", "restart"):
        assert_user_error(invoke(["task", verb, "nope"], env=cli_env), "unknown task 'nope'")
    assert_user_error(invoke(["task", "reassign", "nope", "--to", "b1"], env=cli_env), "unknown task 'nope'")
    assert_user_error(invoke(["task", "reassign", "t1", "--to", "b9"], env=cli_env), "broker 'b9' is not live")
    assert_user_error(invoke(["task", "describe", "bad/id"], env=cli_env), "invalid task id 'bad/id'")
    assert_user_error(invoke(["broker", "shutdown", "b9"], env=cli_env), "unknown broker 'b9'")
    assert_user_error(invoke(["group", "describe", "nogroup"], env=cli_env), "unknown group 'nogroup'")
    assert_user_error(invoke(["rebalance", "--group", "nogroup"], env=cli_env), "unknown group 'nogroup'")
    assert_user_error(invoke(["zk", "get", layout.root + "/nothing"], env=cli_env), "no znode at")
    # no controller: a waited-for request times out with a one-line explanation
    assert_user_error(
        invoke(["task", "delete", "t1", "--wait", "--timeout", "0.3"], env=cli_env),
        "not deleted within 0.3s",
        "no active controller",
    )


def test_zookeeper_unreachable_is_a_one_line_user_error(cli_env):
    env = {**cli_env, "ZKC_ZK": f"127.0.0.1:{free_port()}", "ZKC_CONNECT_TIMEOUT": "0.5"}
    for args in (
        ["task", "list"],
        ["status"],
        ["--json", "broker", "list"],
        ["watch", "--duration", "1"],
        ["controller", "run", "--id", "c1"],
        ["broker", "run", "--id", "b1", "--runner", "noop"],
    ):
        assert_user_error(invoke(args, env=env), "cannot connect to ZooKeeper at 127.0.0.1:")


def test_timeline_input_errors(tmp_path, cli_env):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"task_id": "t", "broker": "b"}]')
    assert_user_error(
        invoke(["timeline", "--out", str(tmp_path / "x.png"), "--intervals", str(bad)], env=cli_env),
        "missing field 'start'",
    )
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert_user_error(
        invoke(["timeline", "--out", str(tmp_path / "x.png"), "--intervals", str(empty)], env=cli_env),
        "no run intervals",
    )
    assert_user_error(
        invoke(["timeline", "--out", str(tmp_path / "x.png"), "--intervals", str(tmp_path / "no.json")], env=cli_env),
        "cannot read",
    )
    assert_user_error(
        invoke(["timeline", "--out", str(tmp_path / "x.png"), "--from-zk"], env=cli_env), "no run intervals recorded"
    )


def test_malformed_znodes_are_reported_not_raised(cli_env, zk, layout):
    zk.create(layout.task("junk"), b"{not json")
    result = invoke(["task", "list"], env=cli_env)
    assert result.exit_code == 0 and "INVALID" in result.output and "not JSON" in result.output
    assert_user_error(invoke(["task", "pause", "junk"], env=cli_env), "task 'junk' has an invalid spec")
    got = invoke(["--json", "zk", "get", layout.task("junk")], env=cli_env)
    assert got.exit_code == 1 and "malformed payload" in got.stderr and "Traceback" not in got.output


def test_task_list_pages_with_a_cursor(cli_env, zk, layout):
    from controller.admin import AdminClient
    from controller.protocol.taskspec import NoopPipeline, TaskSpec

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
def test_task_lifecycle_create_pause_resume_restart_delete(cluster, cli_env, tmp_path, zk, layout):
    out = ok(cli_env, "task", "create", "-f", str(write_specs(tmp_path / "s.yaml", "t1", "t2", "t3", "t4")))
    assert "Created 4 tasks: t1, t2, t3, t4" in out
    placed = cluster.wait_running({"t1", "t2", "t3", "t4"})
    assert set(placed.values()) == {"b0", "b1"}
    rows = {r["task_id"]: r for r in ok_json(cli_env, "task", "list")}
    until(lambda: all(r["status"] == "RUNNING" for r in ok_json(cli_env, "task", "list")), what="statuses")
    assert {t: r["owner"] for t, r in rows.items()} == placed
    table = ok(cli_env, "task", "list").splitlines()
    header = ["ID", "GROUP", "STATE", "KIND", "OWNER", "GEN", "STATUS", "RATE", "BACKLOG", "ERROR"]
    assert table[0].split() == header and len(table) == 5

    assert "Task t1 paused" in ok(cli_env, "task", "pause", "t1")
    cluster.wait_running({"t2", "t3", "t4"})
    until(lambda: zk.exists(layout.task_owner("t1")) is None, what="t1 released")
    row = next(r for r in ok_json(cli_env, "task", "list") if r["task_id"] == "t1")
    assert row["state"] == "PAUSED" and row["owner"] is None
    assert "already PAUSED" in ok(cli_env, "task", "pause", "t1")

    assert "Task t1 resumed" in ok(cli_env, "task", "resume", "t1")
    cluster.wait_running({"t1", "t2", "t3", "t4"})

    runner_of_t2 = cluster.workers[cluster.running()["t2"]]
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
    cluster.wait_running({"t2", "t3", "t4"})
    p = zkctl(cli_env, "task", "describe", "t1")
    assert p.returncode == 1 and p.stderr.strip() == "Error: unknown task 't1'" and p.stdout == ""


def test_restart_failed_restarts_every_failed_task_in_one_write(cluster, cli_env, tmp_path, zk, layout):
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


def test_status_group_describe_and_broker_list(cluster, cli_env, zk, layout):
    cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = cluster.wait_running({f"t{i}" for i in range(4)})
    until(lambda: ok_json(cli_env, "status")["groups"][0]["state"] == "Stable", what="Stable")
    st = ok_json(cli_env, "status", "--full")
    assert st["controller"]["controller_id"] == "ctl" and st["controller"]["epoch"] == cluster.controller.epoch
    assert st["controller_epoch"] == cluster.controller.epoch
    assert {b["broker_id"]: b["epoch"] for b in st["brokers"]} == {
        b: zk.exists(layout.broker(b)).czxid for b in ("b0", "b1")
    }
    (g,) = st["groups"]
    assert g["group"] == "default" and g["members"] == ["b0", "b1"] and g["leader"] in ("b0", "b1")
    assert g["protocol"] == "cooperative" and g["generation"] >= 1
    assert st["tasks"]["total"] == 4 and st["tasks"]["by_state"] == {"RUNNING": 4} and st["tasks"]["unowned"] == 0

    # the controller's summary is at most a second behind
    until(lambda: "Tasks: 4" in ok(cli_env, "status"), what="the summary counting the 4 tasks")
    human = ok(cli_env, "status")
    assert "counts from the controller's summary" in human
    assert "Controller: ctl" in human and "Stable" in human and "Tasks: 4" in human
    assert any(line.split()[:1] == ["b0"] for line in human.splitlines())

    (d,) = ok_json(cli_env, "group", "describe", "default")
    assert d["summary"]["state"] == "Stable" and d["tasks"] == 4
    members = {m["member_id"]: m for m in d["members"]}
    assert set(members) == {"b0", "b1"}
    for b, m in members.items():
        assert m["live"] and m["request"]["protocols"] == ["cooperative", "eager"]
        assert set(m["owns"]) == {t for t, o in placed.items() if o == b} == set(m["assignment"]["assigned"])
    human = ok(cli_env, "group", "describe")
    assert "Group default: Stable generation" in human and "HOLDS" in human

    brokers = ok_json(cli_env, "broker", "list")
    assert sorted((b["broker_id"], b["tasks"]) for b in brokers) == sorted(
        (b, sum(1 for o in placed.values() if o == b)) for b in ("b0", "b1")
    )
    assert "EPOCH" in ok(cli_env, "broker", "list").splitlines()[0]


def test_rebalance_bumps_the_generation(cluster, cli_env):
    cluster.admin.create_tasks([parse_spec({"id": "t1", "pipeline": {"kind": "noop"}})])
    cluster.wait_running({"t1"})
    until(lambda: cluster.admin.status().groups[0].state == "Stable", what="Stable")
    before = cluster.admin.status().groups[0].generation
    p = zkctl(cli_env, "--json", "rebalance", "--group", "default", "--wait", "--timeout", "20")
    assert p.returncode == 0 and p.stderr == "", p.stderr  # --json: no progress, stdout pure JSON
    req = json.loads(p.stdout)
    assert req["done"] is True and req["path"].rsplit("/", 1)[1].startswith("req-")
    after = cluster.admin.status().groups[0]
    assert after.state == "Stable" and after.generation > before
    assert "Rebalance of all groups done" in ok(cli_env, "rebalance", "--wait", "--timeout", "20")
    cluster.wait_running({"t1"})


def test_reassign_moves_a_task_without_double_ownership(cluster, cli_env, zk, layout):
    cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = cluster.wait_running({f"t{i}" for i in range(4)})
    source = placed["t0"]
    target = "b1" if source == "b0" else "b0"
    assert f"Task t0 now runs on {target}" in ok(
        cli_env, "task", "reassign", "t0", "--to", target, "--wait", "--timeout", "20"
    )
    until(lambda: cluster.running().get("t0") == target, what="t0 running on the target")
    assert codecs.decode(codecs.OwnerInfo, zk.get(layout.task_owner("t0"))[0]).broker == target
    # the runs of t0: the source released its owner znode before the target acquired it
    runs = [i for w in cluster.workers.values() for i in list(w.intervals) + w.open_intervals() if i.task_id == "t0"]
    src = [i for i in runs if i.broker == source]
    dst = [i for i in runs if i.broker == target]
    assert src and dst
    for a in src:
        for b in dst:
            assert a.released is not None and a.end is not None
            assert a.released <= b.acquired or (b.released is not None and b.released <= a.acquired), (a, b)
    until(lambda: zk.get_children(layout.admin_reassign) == [], what="the request removed")


def test_broker_shutdown_moves_its_tasks_away(cluster, cli_env):
    cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(4)])
    placed = cluster.wait_running({f"t{i}" for i in range(4)})
    assert "b1" in placed.values()
    held = sum(1 for b in placed.values() if b == "b1")
    p = zkctl(cli_env, "broker", "shutdown", "b1", "--wait", "--timeout", "30")
    assert p.returncode == 0 and "Broker b1 holds no tasks any more" in p.stdout, (p.stdout, p.stderr)
    # its progress, on stderr as plain lines (no terminal here): what it waits for, and how far it is
    lines = p.stderr.strip().splitlines()
    assert lines and all(
        re.match(
            r"^\[\s*\d+\.\ds\] waiting for b1 to hand over its tasks: \d+/\d+ moved "
            r"\(timeout 30s\)$",
            line,
        )
        for line in lines
    ), lines
    assert lines[-1].split(": ")[1].startswith(f"{held}/{held} moved") and "\r" not in p.stderr
    assert set(cluster.running().values()) == {"b0"}
    until(cluster.workers["b1"].exited.is_set, what="b1's controlled shutdown to complete")
    cluster.workers["b1"].stop()  # what `zkctl broker run` does once `exited` is set
    until(lambda: cluster.running() == {f"t{i}": "b0" for i in range(4)}, what="every task on b0")


def test_zk_get_decodes_payloads(cluster, cli_env, layout):
    cluster.admin.create_tasks([parse_spec({"id": "t1", "weight": 3, "pipeline": {"kind": "noop"}})])
    cluster.wait_running({"t1"})
    got = ok_json(cli_env, "zk", "get", layout.task("t1"))
    assert got["data"]["id"] == "t1" and got["data"]["weight"] == 3 and got["error"] is None
    assert ok_json(cli_env, "zk", "get", layout.controller)["data"]["controller_id"] == "ctl"
    owner = ok_json(cli_env, "zk", "get", layout.task_owner("t1"))
    assert owner["data"]["broker"] in ("b0", "b1") and owner["stat"]["ephemeral_owner"]
    assert ok_json(cli_env, "zk", "get", layout.broker("b0"))["data"]["broker_id"] == "b0"
    assert ok(cli_env, "zk", "get", "--raw", layout.controller_epoch).strip() == str(cluster.controller.epoch)
    assert "tasks" in ok(cli_env, "zk", "tree", layout.root)


def test_watch_prints_events_as_they_happen(cluster, cli_env):
    lines: queue.Queue[str] = queue.Queue()
    p = subprocess.Popen(
        [ZKCTL, "--json", "watch", "--duration", "60"],
        env=cli_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        threading.Thread(target=lambda: [lines.put(line) for line in p.stdout], daemon=True).start()

        def next_event(timeout: float = 20.0) -> dict:
            return json.loads(lines.get(timeout=timeout))

        first = next_event()
        assert first["kind"] == "watching" and first["detail"]["controller"] == "ctl"
        assert set(first["detail"]["brokers"]) == {"b0", "b1"}
        cluster.admin.create_tasks([parse_spec({"id": "w1", "pipeline": {"kind": "noop"}})])
        seen: list[dict] = []
        until(
            lambda: (
                (seen.append(next_event()) or True)
                and any(e["kind"] == "task_owner" and e["subject"] == "w1" and e["detail"]["owner"] for e in seen)
            ),
            30,
            "w1 owned",
        )
        # causal order for w1 (other events, e.g. a generation finishing when the watch began, may come between)
        about_w1 = [e["kind"] for e in seen if e["subject"] == "w1"]
        assert about_w1[0] == "task_created" and about_w1[-1] == "task_owner", about_w1
        assert any(e["kind"] == "group" for e in seen[seen.index(next(e for e in seen if e["subject"] == "w1")) :]), [
            (e["kind"], e["subject"], e["detail"].get("generation"), e["detail"].get("state")) for e in seen
        ]
        gens = [e["detail"]["generation"] for e in seen if e["kind"] == "group"]
        assert gens == sorted(gens)
        cluster.admin.pause("w1")
        seen.clear()
        until(
            lambda: (
                (seen.append(next_event()) or True)
                and any(
                    e["kind"] == "task_owner" and e["subject"] == "w1" and e["detail"]["owner"] is None for e in seen
                )
            ),
            30,
            "w1 released",
        )
        about_w1 = [e for e in seen if e["subject"] == "w1"]
        assert about_w1[0]["kind"] == "task_state" and about_w1[0]["detail"]["state"] == "PAUSED", about_w1
    finally:
        stop_process(p)
    # human form, bounded by a count
    cluster.admin.resume("w1")
    out = ok(cli_env, "watch", "--duration", "1")
    assert out.splitlines()[0].split()[1:3] == ["watching", "watching"]


def test_timeline_from_zookeeper_and_from_a_file(cluster, cli_env, tmp_path):
    cluster.admin.create_tasks([parse_spec({"id": f"t{i}", "pipeline": {"kind": "noop"}}) for i in range(3)])
    placed = cluster.wait_running({"t0", "t1", "t2"})
    ok(cli_env, "task", "reassign", "t0", "--to", "b1" if placed["t0"] == "b0" else "b0", "--wait", "--timeout", "20")
    until(lambda: any(i.task_id == "t0" for i in cluster.admin.intervals()), what="intervals flushed to ZooKeeper")
    out = tmp_path / "zk.png"
    summary = ok_json(cli_env, "timeline", "--out", str(out), "--from-zk", "--title", "from zk")
    assert out.read_bytes()[:8] == PNG and summary["overlaps"] == 0 and summary["tasks"] >= 1
    intervals = tmp_path / "sim.json"
    intervals.write_text(
        json.dumps(
            [
                {"task_id": "a", "broker": "x", "start": 0.0, "end": 2.0},
                {"task_id": "a", "broker": "y", "start": 2.5, "end": 4.0},
                {"task_id": "b", "broker": "y", "start": 0.0, "end": 4.0},
            ]
        )
    )
    human = ok(cli_env, "timeline", "--out", str(tmp_path / "sim.png"), "--intervals", str(intervals))
    assert "2 tasks, 2 brokers, 3 runs over 4.0s (idle gaps 0.5s, double ownership 0)" in human
    assert (tmp_path / "sim.png").read_bytes()[:8] == PNG


def test_maintenance_and_settings_commands(cli_env, zk, layout):
    assert "Maintenance mode is off" in invoke(["maintenance", "status"], cli_env).stdout
    res = invoke(["maintenance", "on", "--reason", "disk swap"], cli_env)
    assert res.exit_code == 0 and "Maintenance mode is ON" in res.stdout and "disk swap" in res.stdout, res.output
    res = invoke(["--json", "maintenance", "status"], cli_env)
    assert json.loads(res.stdout)["on"] is True
    assert "MAINTENANCE MODE" in invoke(["status"], cli_env).stdout
    assert "Maintenance mode is off" in invoke(["maintenance", "off"], cli_env).stdout
    res = invoke(["settings", "set", "max_moves=4", "max-moves-per-broker=2"], cli_env)
    assert res.exit_code == 0 and "max_moves" in res.stdout, res.output
    res = invoke(["--json", "settings", "set", "max_moves=2", "--group", "etl"], cli_env)
    assert json.loads(res.stdout)["group_throttle"]["etl"]["max_moves"] == 2
    before = zk.get(layout.settings)[0]
    assert_user_error(invoke(["settings", "set", "max_moves=0"], cli_env), "max_moves: 0 is not a whole number >= 1")
    assert_user_error(invoke(["settings", "set", "nonsense=1"], cli_env), "unknown setting 'nonsense'")
    assert_user_error(invoke(["settings", "set", "max_moves"], cli_env), "expected NAME=VALUE")
    assert zk.get(layout.settings)[0] == before
    res = invoke(["--json", "maintenance", "auto", "--max-offline-brokers", "2", "--window", "30"], cli_env)
    assert json.loads(res.stdout)["max_offline_brokers"] == 2 and json.loads(res.stdout)["offline_window_s"] == 30
    assert_user_error(invoke(["maintenance", "auto"], cli_env), "--max-offline-brokers")
    res = invoke(["--json", "maintenance", "auto", "--off"], cli_env)
    assert json.loads(res.stdout)["max_offline_brokers"] is None
    res = invoke(["--json", "settings", "reset"], cli_env)
    assert json.loads(res.stdout)["throttle"] == {"max_moves": None, "max_moves_per_broker": None}


def test_stop_offsets_and_reset_offsets_commands(cluster, cli_env, tmp_path, zk, layout):
    """`task stop --wait`, `task offsets`, `task reset-offsets` and `task delete --purge-checkpoint` over a
    checkpoint in Spark's format under the state dir (where the brokers keep theirs by default)."""
    from tests.offsets_support import fake_checkpoint, spark_spec

    cluster.admin.create_tasks([spark_spec("o1", tmp_path)])
    cluster.wait_running({"o1"})
    ck = Path(cli_env["ZKC_STATE_DIR"]) / "checkpoints" / "o1"
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
    assert dry.startswith("Dry run: task o1 reset to batch 1: the next start reads after batch 1") and (
        "sink: would remove batches 2-2 (1 data file(s))" in dry
    ), dry
    assert (ck / "offsets" / "2").exists()
    got = json.loads(run("--json", "task", "reset-offsets", "o1", "--to-earliest").stdout)
    assert (got["position"], got["dry_run"], got["sink_files_removed"]) == (-1, False, 3) and not ck.exists()
    human = run("task", "describe", "o1").stdout
    assert re.search(
        r"History: +[-0-9]+ [:0-9]+ \(\d+s ago\) stop \(was RUNNING\); .* reset-offsets \(to earliest: ", human
    ), human
    assert f"Checkpoint: {ck} (none there, as seen from here)" in human, human

    res = run("task", "delete", "o1", "--purge-checkpoint")
    assert res.exit_code == 2 and "--purge-checkpoint needs --wait" in res.stderr
    assert "Task o1 resumed" in run("task", "resume", "o1").stdout
    cluster.wait_running({"o1"})
    ck.mkdir(parents=True)
    (ck / "metadata").write_text("{}")
    res = run("task", "delete", "o1", "--wait", "--timeout", "20", "--purge-checkpoint")
    assert res.exit_code == 0 and f"note: checkpoint {ck} removed (2 bytes in 1 files)" in res.stdout, res.output
    assert not ck.exists() and zk.exists(layout.task_history("o1")) is None
