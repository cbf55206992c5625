"""A broker reports its measured load into its registration: its process's CPU and memory and each running
task's load share; the admin view and ``broker describe`` show it, bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient

from broker_sim.worker import Worker, WorkerConfig
from cli.main import cli
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, registration_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings


@pytest.fixture
def broker(zk: KazooClient, zk_settings: ZkSettings) -> Iterator[Worker]:
    c = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    w: Worker | None = None
    try:
        assert c.wait_active(15)
        w = Worker(WorkerConfig("b0", zk_settings, status_interval_s=0.1, load_interval_s=0.2, on_halt="kill")).start()
        yield w
    finally:
        if w is not None:
            w.stop()
        c.stop()


def test_a_broker_reports_its_tasks_load_and_its_process(
    zk: KazooClient, layout: ZkLayout, broker: Worker, cli_env: dict[str, str]
) -> None:
    AdminClient(zk, layout).create_tasks(
        [
            TaskSpec(id="heavy", pipeline=NoopPipeline(kind="noop", cost=0.8)),
            TaskSpec(id="plain", pipeline=NoopPipeline(kind="noop")),
        ]
    )

    def reported() -> dict | None:
        info = codecs.decode(registration_records.BrokerInfo, zk.get(layout.broker("b0"))[0])
        return info.load if info.load and info.load.get("tasks") else None

    assert wait_for(lambda: reported() is not None, 20)
    load = reported()
    assert load is not None and load["tasks"] == {"heavy": 0.8}  # a task that reports no load share is not named
    assert load["rss_mb"] > 0 and load["cpu_percent"] >= 0

    (view,) = AdminClient(zk, layout).brokers()
    assert view.load is not None and view.load["load"] == pytest.approx(0.8)
    out = CliRunner().invoke(cli, ["broker", "describe", "b0"], env=cli_env)
    assert out.exit_code == 0, out.output
    assert "heavy 0.80" in out.output and "resident" in out.output
    out = CliRunner().invoke(cli, ["--json", "broker", "describe", "b0"], env=cli_env)
    assert json.loads(out.output)["load"]["tasks"] == {"heavy": 0.8}
    out = CliRunner().invoke(cli, ["task", "describe", "heavy"], env=cli_env)
    assert "Load:" in out.output and "0.80 of its trigger interval" in out.output


def test_an_absurd_report_is_shown_bounded(zk: KazooClient, layout: ZkLayout, broker: Worker) -> None:
    assert wait_for(lambda: zk.exists(layout.broker("b0")) is not None, 10)
    broker.load.interval_s = 0  # the broker reports no more: what we write below stays
    info = codecs.decode(registration_records.BrokerInfo, zk.get(layout.broker("b0"))[0])
    raw = json.loads(codecs.encode(info))
    raw["load"] = {"cpu_percent": 1e99, "tasks": {"x": 1e6, "y": "lots"}}
    zk.set(layout.broker("b0"), json.dumps(raw).encode())
    (view,) = AdminClient(zk, layout).brokers()
    assert view.error is None  # a bad load report never costs the registration
    assert view.load is not None and view.load["tasks"] == {"x": 10.0} and view.load["problems"]
