"""Every command's help, walked through the click tree: it renders, carries no markup, lists its
subcommands' summaries whole, shows defaults one way (click's ``[default: ...]``), and offers the output
options; and the pure parts of output and connection errors. No ZooKeeper needed."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from cli.common import first_sentence, names_of, render, with_output
from cli.connect import Probe, explain, split_hosts
from cli.main import cli
from controller.protocol.tasks.spec import SpecError, parse_specs_text

REPO = Path(__file__).resolve().parents[3]


def _commands() -> Iterator[tuple[list[str], click.Command]]:
    ctx = click.Context(cli)

    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None:
                    yield from walk(sub, [*path, name])

    yield from walk(cli, [])


COMMANDS = list(_commands())
IDS = [" ".join(p) or "zkctl" for p, _ in COMMANDS]


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="zkctl", terminal_width=80)
    assert result.exit_code == 0, (path, result.output, result.exception)
    return result.output


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_the_walk_finds_the_whole_tree():
    names = set(IDS)
    for expected in ("task list", "zk ls", "group list", "controller list", "init", "completion", "broker run"):
        assert expected in names, expected
    assert len(COMMANDS) > 60


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_renders_without_markup_and_with_whole_summaries(path, command):
    text = _help(path)
    assert "`" not in text, text  # reST literals (``x``) and backquoted commands
    assert not re.search(r":(class|func|data|meth):", text), text
    if isinstance(command, click.Group):
        flat = _flat(text)
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            if sub is None or sub.hidden or not sub.help:
                continue
            summary = first_sentence(sub.help)
            assert _flat(summary) in flat, (name, summary)


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_defaults_are_shown_one_way_and_every_command_takes_the_output_options(path, command):
    opts = {o for p in command.params for o in getattr(p, "opts", ())}
    assert {"-o", "--output", "--json"} <= opts, path
    for param in command.params:
        text = getattr(param, "help", None) or ""
        assert "default:" not in text.lower() and "(default " not in text.lower(), (path, param.name, text)
        assert not re.search(r"\[[^\]]+\]\s*$", text), (path, param.name, text)  # a hand-written [default]


def test_output_option_after_the_command_and_before_it_parse_the_same():
    runner = CliRunner()
    for args in (["-o", "json", "task", "schema"], ["task", "schema", "-o", "json"], ["task", "schema", "--json"]):
        result = runner.invoke(cli, args, prog_name="zkctl")
        assert result.exit_code == 0, (args, result.output)
        assert json.loads(result.output)["title"], args
    result = runner.invoke(cli, ["task", "schema", "-o", "yaml"], prog_name="zkctl")
    assert result.exit_code == 0 and "$defs" in yaml.safe_load(result.output)
    result = runner.invoke(cli, ["task", "schema", "-o", "xml"], prog_name="zkctl")
    assert result.exit_code == 2 and "'xml' is not one of" in result.output


def test_restart_policy_in_the_help_is_the_one_the_code_uses():
    source = (REPO / "broker_sim" / "deploy" / "containers.py").read_text()
    policies = set(re.findall(r'restart_policy=\{"Name": "(\w+)"\}', source)) - {"no"}
    assert len(policies) == 1, policies
    assert f"restart policy {policies.pop()}" in _flat(_help(["cluster", "up"]))


def test_enumerated_options_are_checked():
    runner = CliRunner()
    bad_state = runner.invoke(cli, ["task", "list", "--state", "BOGUS"], prog_name="zkctl")
    assert bad_state.exit_code == 2 and "Invalid value for '--state'" in bad_state.output
    bad_role = runner.invoke(cli, ["health", "--role", "brokr"], prog_name="zkctl")
    assert bad_role.exit_code == 2 and "Invalid value for '--role'" in bad_role.output


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_script(shell):
    result = CliRunner().invoke(cli, ["completion", shell], prog_name="zkctl")
    assert result.exit_code == 0 and "_ZKCTL_COMPLETE" in result.output


# ---- pure parts ---------------------------------------------------------------------------------
def test_name_output_takes_the_ids():
    assert names_of([{"task_id": "a"}, {"task_id": "b"}]) == ["a", "b"]
    assert names_of({"tasks": ["t1", "t2"], "notes": []}) == ["t1", "t2"]
    assert names_of({"controller_id": "c1", "host": "h"}) == ["c1"]
    assert render([{"name": "x\x1b[2J"}], "name") == "x\\x1b[2J"  # escaped, never sent to the terminal
    assert json.loads(render({"b": 1, "a": [1]}, "json")) == {"a": [1], "b": 1}
    assert yaml.safe_load(render({"a": [1]}, "yaml")) == {"a": [1]}


def test_first_sentence_is_whole():
    assert first_sentence("Do a thing, e.g. this one.\n\nMore.") == "Do a thing, e.g. this one."
    assert first_sentence("No full stop\nat all") == "No full stop at all"


def test_connection_errors_say_which_failure_with_the_hint():
    assert split_hosts("a:1,b,[::1]:3/chroot") == [("a", 1), ("b", 2181), ("::1", 3)]
    assert split_hosts("a:x") == [("a", None)]
    refused = explain("h:1", [Probe("h:1", "refused")], 3)
    assert "connection refused" in refused and "zkctl zk start" in refused and "ZKC_ZK" in refused
    assert "unknown host" in explain("h:1", [Probe("h:1", "unknown host")], 3)
    assert "no answer within 3s" in explain("h:1", [Probe("h:1", "no answer")], 3)
    assert "no answer within 3s" in explain("h:1", [Probe("h:1", "open")], 3)
    mixed = explain("a:1,b:2", [Probe("a:1", "refused"), Probe("b:2", "unknown host")], 3)
    assert "a:1 refused" in mixed and "b:2 unknown host" in mixed


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("- id: a\n  pipeline: {kind: noop\n", "line 3, column 1"),
        ("id: a\n  bad: [1\n", "line 2, column 6"),
        ("id: a\n\tpipeline: x\n", "line 2, column 1"),
    ],
)
def test_yaml_errors_name_line_and_column(text, where):
    with pytest.raises(SpecError, match=re.escape(where)):
        parse_specs_text(text, "<stdin>")


def test_json_errors_name_line_and_column():
    with pytest.raises(SpecError, match=r"line 2, column 1"):
        parse_specs_text('{"id": "a",\n}', "f.json", as_json=True)


def test_with_output_is_idempotent():
    cmd = click.Command("x", help="First one. Second.")
    with_output(with_output(cmd))
    assert [o for p in cmd.params for o in getattr(p, "opts", ())].count("-o") == 1
    assert cmd.short_help == "First one."
