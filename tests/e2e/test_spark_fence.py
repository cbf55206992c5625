"""A streaming Spark task a fence stopped runs again once the fence is lifted, against a real ZooKeeper and
the real Spark runner. The status thread's poll reads a run's state outside the task table's lock: a poll
that read a streaming query the fence was stopping saw it inactive without an error, i.e. COMPLETED, and
wrote that into the slot after the stop; a COMPLETED task is never started again, so the pipeline stayed
down (its owner znode held) until the broker died. And a fence lifted while its stop is still under way:
the lift's reconcile saw the task still running, so the fence reconciles again once its stops have ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker_sim.runners import RunState
from broker_sim.runners.spark import SparkRunner
from broker_sim.sim.datagen import DatagenConfig, generate
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.tasks.spec import parse_spec
from tests.spark_support import TEST_CONF, TEST_MASTER, files_task, wait_for

pytestmark = pytest.mark.slow

CYCLES = 6  # fences raised and lifted in a row (the poll must read the query while a stop is under way)
BACK_WITHIN_S = 20.0  # a lifted fence's task runs again within this (a start is ~1 s; the poll's backoff 0)


@pytest.fixture
def broker(zk, zk_settings, layout, tmp_path, spark_runner: SparkRunner) -> Iterator[tuple[Worker, AdminClient]]:
    """A controller and one spark worker polling its runner often (the poll races the fence's stop)."""
    ck = tmp_path / "ck"
    runner = SparkRunner(spark_master=TEST_MASTER, spark_conf=dict(TEST_CONF), checkpoint_root=str(ck))
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=10.0))).start()
    worker = None
    try:
        assert ctl.wait_active(15)
        worker = Worker(
            WorkerConfig("sf0", zk_settings, status_interval_s=0.02, on_halt="kill", runner="spark"), runner=runner
        ).start()
        yield worker, AdminClient(zk, layout)
    finally:
        if worker is not None:
            worker.stop()
        else:
            runner.close()
        ctl.stop()


def _pipeline(worker: Worker, admin: AdminClient, tmp_path: Path) -> Any:
    """Create one streaming task and wait for it to run; return a check that it runs."""
    src, out = tmp_path / "in", tmp_path / "out"
    generate(DatagenConfig(str(src), records=100, batch=50))
    spec = files_task("pipe", src, out, "SELECT id, key FROM input", trigger={"processing_time": "200 milliseconds"})
    admin.create_tasks([parse_spec(spec)])
    runner = worker.runner

    def runs() -> bool:
        return "pipe" in worker.running_tasks() and runner.status("pipe").state is RunState.RUNNING

    wait_for(runs, 120, "the pipeline to run")
    return runs


def _back_after_lift(worker: Worker, runs: Any, cycle: int) -> None:
    t0 = time.monotonic()
    while not runs() and time.monotonic() - t0 < BACK_WITHIN_S:
        time.sleep(0.05)
    slot: Any = worker.table.slots.get("pipe")
    assert runs(), (
        f"cycle {cycle}: the pipeline is not running {BACK_WITHIN_S:.0f}s after the lift "
        f"(slot state {slot.state if slot else None}, held {slot.held if slot else None})"
    )


def test_a_streaming_task_the_fence_stopped_runs_again_after_the_lift(
    broker: tuple[Worker, AdminClient], tmp_path: Path
) -> None:
    worker, admin = broker
    runs = _pipeline(worker, admin, tmp_path)
    for cycle in range(CYCLES):
        time.sleep(0.5)  # (a few polls of the running query)
        worker.fence.fence()  # returns once the fence's stops have ended
        assert "pipe" not in worker.running_tasks()
        worker.fence.lift(time.monotonic(), "the session is alive")
        _back_after_lift(worker, runs, cycle)


def test_a_fence_lifted_while_its_stop_is_under_way_starts_the_task_again(
    broker: tuple[Worker, AdminClient], tmp_path: Path
) -> None:
    worker, admin = broker
    runs = _pipeline(worker, admin, tmp_path)
    overlapped = 0
    for cycle in range(CYCLES):
        time.sleep(0.5)
        fencing = threading.Thread(target=worker.fence.fence, name="test-fence", daemon=True)
        fencing.start()
        # lift as soon as the fence is up with the query's stop still under way (the task still running)
        t0 = time.monotonic()
        while not (worker.fence.up and "pipe" in worker.running_tasks()) and time.monotonic() - t0 < 5:
            time.sleep(0.001)
        lifted = worker.fence.lift(time.monotonic(), "the session is alive")
        during = "pipe" in worker.running_tasks()
        fencing.join(30)
        assert not fencing.is_alive() and lifted
        if not during:
            continue  # (the stop ended before the lift: the first test's case)
        overlapped += 1
        _back_after_lift(worker, runs, cycle)
    assert overlapped, "no lift came while the fence's stop was under way"
