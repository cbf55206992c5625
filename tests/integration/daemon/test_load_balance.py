"""The load-balanced assignor end to end on a real ZooKeeper: brokers report their tasks' load shares, the
controller places by them, and ``rebalance --dry-run`` explains the plan without asking for anything."""

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
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings

HEAVY = ("h1", "h2", "h3")


@pytest.fixture
def controller(zk_settings: ZkSettings) -> Iterator[Controller]:
    config = GroupConfig(
        rebalance_timeout_s=5.0, default_assignor="load-balanced", load_window_s=1.0, load_check_s=0.25
    )
    c = Controller(ControllerConfig("ctl", zk_settings, config)).start()
    try:
        assert c.wait_active(15)
        yield c
    finally:
        c.stop()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def _worker(started: list[Worker], settings: ZkSettings, bid: str) -> Worker:
    w = Worker(
        WorkerConfig(
            bid,
            settings,
            assignors=("load-balanced",),
            status_interval_s=0.1,
            load_interval_s=0.2,
            metrics_interval_s=0.2,
            on_halt="kill",
        )
    ).start()
    started.append(w)
    return w


def test_heavy_pipelines_end_on_different_brokers(
    zk: KazooClient, layout: ZkLayout, zk_settings: ZkSettings, controller: Controller, workers: list[Worker], cli_env
) -> None:
    admin = AdminClient(zk, layout)
    specs = [TaskSpec(id=h, pipeline=NoopPipeline(kind="noop", cost=0.9)) for h in HEAVY]
    specs += [TaskSpec(id=f"l{i}", pipeline=NoopPipeline(kind="noop", cost=0.05)) for i in range(6)]
    admin.create_tasks(specs)
    b0 = _worker(workers, zk_settings, "b0")
    assert wait_for(lambda: len(b0.running_tasks()) == 9, 20)

    def reported(b: str) -> set[str]:
        view = next((v for v in admin.brokers() if v.broker_id == b), None)
        return set((view.load or {}).get("tasks", {})) if view else set()

    assert wait_for(lambda: reported("b0") == {t.id for t in specs}, 20)  # b0 has measured all nine
    _worker(workers, zk_settings, "b1")
    _worker(workers, zk_settings, "b2")

    def where() -> dict[str, str]:
        return {t: w.config.broker_id for w in workers for t in w.running_tasks()}

    assert wait_for(lambda: len({where().get(h) for h in HEAVY} - {None}) == 3 and len(where()) == 9, 30)

    def even() -> bool:  # (the brokers' next reports, and a window's check, even out what the join left)
        p = admin.load_plans("default")[0].plan
        return p.moves == () and not p.over(p.before) and len(where()) == 9

    assert wait_for(even, 30)
    assert len({where().get(h) for h in HEAVY}) == 3
    out = CliRunner().invoke(cli, ["rebalance", "--dry-run", "--group", "default"], env=cli_env)
    assert out.exit_code == 0, out.output
    assert "no broker is over the tolerance" in out.output
    out = CliRunner().invoke(cli, ["--json", "rebalance", "--dry-run"], env=cli_env)
    assert json.loads(out.output)[0]["moves"] == []
