"""Fixtures of the integration tier: ``cluster``, a controller and two no-op workers in the test process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.zk.client import ZkSettings
from tests.cli_support import until


@dataclass
class Cluster:
    controller: Controller
    workers: dict[str, Worker]
    admin: AdminClient
    checkpoint_root: Path  # the workers' (shared storage: the same for both)

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
def noop_cluster(zk: KazooClient, zk_settings: ZkSettings, layout: ZkLayout, tmp_path: Path) -> Iterator[Cluster]:
    """A controller and two no-op workers (b0, b1) in this process, on the test's root, sharing one checkpoint
    root (each with its own pipeline logs)."""
    c = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    workers: dict[str, Worker] = {}
    try:
        assert c.wait_active(15)
        for b in ("b0", "b1"):
            workers[b] = Worker(
                WorkerConfig(
                    b,
                    zk_settings,
                    status_interval_s=0.1,
                    intervals_flush_s=0.2,
                    on_halt="kill",
                    checkpoint_root=str(tmp_path / "brokers-ck"),
                    task_logs_dir=str(tmp_path / "task-logs" / b),
                )
            ).start()
        yield Cluster(c, workers, AdminClient(zk, layout), tmp_path / "brokers-ck")
    finally:
        for w in workers.values():
            w.stop()
        c.stop()
