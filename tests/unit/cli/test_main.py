"""``zkctl`` parsing without ZooKeeper (click's CliRunner, in-process): every usage error exits 2 naming what is
wrong, the help lists every command, and names are checked in full (a reserved root, a broker id with a newline)
before anything connects."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from broker_sim.worker import WorkerConfig
from cli.main import cli
from controller.protocol.cluster.layout import InvalidName, ZkLayout
from controller.zk.client import ZkSettings
from tests.cli_support import invoke


def assert_usage_error(result, needle: str | None = None) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    if needle:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["frobnicate"], "No such command"),
        (["task", "create"], "Missing option '-f'"),
        (["task", "describe"], "Missing argument 'TASK_ID'"),
        (["task", "reassign", "t1"], "Missing option '--to'"),
        (["task", "delete", "t1", "--timeout", "-1"], "--timeout"),
        (["--zk-root", "/a b", "status"], "--zk-root"),
        (["broker", "run"], "Missing option '--id'"),
        (["broker", "run", "--id", "b/1"], "invalid broker id"),
        (["broker", "run", "--id", "b1", "--protocol", "lazy"], "--protocol"),
        (["broker", "run", "--id", "b1", "--assignor", "nope"], "--assignor"),
        (["broker", "run", "--id", "b1", "--runner", "noop", "--spark-conf", "novalue"], "KEY=VALUE"),
        (["broker", "run", "--id", "b1", "--runner", "noop", "--spark-master", "local[2]"], "--runner spark only"),
        (["broker", "run", "--id", "b1", "--runner", "spark", "--start-latency", "1"], "--runner noop only"),
        (["broker", "run", "--id", "b1", "--runner", "spark", "--prepare-share", "0.5"], "--runner noop only"),
        (["broker", "run", "--id", "b1", "--runner", "noop", "--prepare-share", "1.5"], "--prepare-share"),
        (["broker", "roll", "--warmup", "-1"], "--warmup"),
        (["controller", "run", "--rebalance-timeout", "0"], "--rebalance-timeout"),
        (["controller", "run", "--metrics-port", "70000"], "--metrics-port"),
        (["watch", "--duration", "-1"], "--duration"),
        (["watch", "--count", "0"], "--count"),
        (["timeline", "--from-zk"], "Missing option '--out'"),
        (["timeline", "--out", "x.png"], "exactly one of --from-zk and --intervals"),
        (["timeline", "--out", "x.png", "--from-zk", "--intervals", "i.json"], "exactly one of"),
        (["rebalance", "extra"], "unexpected extra argument"),
        (["task", "restart"], "give a TASK_ID, or --failed"),
        (["task", "restart", "t1", "--failed"], "not both"),
        (["task", "restart", "t1", "--group", "g"], "--group goes with --failed"),
    ],
)
def test_usage_errors_exit_2(args, needle):
    assert_usage_error(invoke(args), needle)


def test_help_lists_every_command():
    result = invoke(["--help"])
    assert result.exit_code == 0
    for name in ("task", "status", "broker", "group", "rebalance", "watch", "controller", "timeline", "zk", "demo"):
        assert f"  {name} " in result.output
    for sub, names in (
        (
            "task",
            (
                "create",
                "list",
                "describe",
                "delete",
                "pause",
                "resume",
                "restart",
                "reassign",
                "schema",
                "apply",
                "history",
                "rollback",
                "wait",
            ),
        ),
        ("broker", ("list", "shutdown", "run")),
        ("group", ("describe",)),
        ("controller", ("run",)),
    ):
        out = invoke([sub, "--help"]).output
        assert all(f"  {n} " in out for n in names), out


def test_names_match_in_full_and_reserved_roots_are_refused():
    with pytest.raises(InvalidName):
        WorkerConfig("bb3\n", ZkSettings(hosts="127.0.0.1:1"), on_halt="kill")
    for root in ("/zookeeper", "/zookeeper/quota", "zookeeper"):
        with pytest.raises(InvalidName, match="ZooKeeper's own system subtree"):
            ZkLayout(root)
    res = CliRunner().invoke(cli, ["--zk", "127.0.0.1:1", "broker", "run", "--id", "bb3\n", "--runner", "noop"])
    assert res.exit_code in (1, 2) and "invalid broker id" in res.output and "started" not in res.output, res.output
    res = CliRunner().invoke(cli, ["--zk", "127.0.0.1:1", "--zk-root", "/zookeeper", "task", "list"])
    assert res.exit_code in (1, 2) and "system subtree" in res.output, res.output
