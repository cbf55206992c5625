"""``zkctl``'s user errors, in-process (click's CliRunner) and as the installed program: a fast start that
imports nothing heavy, help that matches, malformed specs refused with nothing written, unknown things,
an unreachable ZooKeeper and malformed znodes each one line, never a traceback.

Every process a test starts is stopped by its pid in a ``finally``; the helpers are ``tests.cli_support``, the
``cluster`` fixture (a controller and two no-op workers in this process) ``tests/integration/conftest.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from controller.admin import AdminClient
from controller.protocol.tasks.spec import parse_spec
from controller.zk.layout_io import list_tasks
from controller.zk.server import free_port
from tests.cli_support import ZKCTL, assert_user_error, invoke, write_specs

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
    from cli.common import with_output
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
        with_output(command)  # as the group gives it when it loads it: the summary whole
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
