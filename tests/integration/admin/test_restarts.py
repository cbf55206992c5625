"""Restarting every FAILED task in one write (``AdminClient.restart_tasks``, ``zkctl task restart --failed``)
and the per-task restart policy as the worker follows it and ``task describe`` reports it.

A real ZooKeeper, controller and no-op workers in this process: tasks that really fail, restarted together by
one multi (which tasks are chosen, and the reported progress: tests/unit/admin/test_views_restarts.py)."""

from __future__ import annotations

import time

import pytest

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.admin.views import SkippedRestart
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import NoopPipeline, RestartPolicy, TaskSpec


# ---- against ZooKeeper -------------------------------------------------------------------------------
def failing(task_id: str, group: str = "default") -> TaskSpec:
    """A task that fails 0.1 s after every start and is never restarted automatically: FAILED at once."""
    return TaskSpec(
        id=task_id,
        group=group,
        restart=RestartPolicy(max_attempts=0),
        pipeline=NoopPipeline(kind="noop", fail_after_s=0.1, fail_message=f"{task_id} broke"),
    )


@pytest.fixture
def cluster(zk, zk_settings, layout):
    """A controller and one no-op worker in each of two groups."""
    ctl = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=5.0))).start()
    workers = []
    try:
        assert ctl.wait_active(15)
        for bid, group in (("b0", "default"), ("o0", "other")):
            workers.append(
                Worker(WorkerConfig(bid, zk_settings, group=group, status_interval_s=0.1, on_halt="kill")).start()
            )
        yield AdminClient(zk, layout), {w.id: w for w in workers}
    finally:
        for w in workers:
            w.stop()
        ctl.stop()


def runs(worker: Worker, task_id: str) -> int:
    return sum(1 for i in worker.intervals if i.task_id == task_id) + sum(
        1 for i in worker.open_intervals() if i.task_id == task_id
    )


def shown(admin: AdminClient) -> dict[str, str | None]:
    return {r.task_id: r.shown for r in admin.list_tasks()}


def test_every_failed_task_is_restarted_by_one_multi_and_nothing_else(cluster, zk, layout):
    admin, workers = cluster
    specs = [
        failing("f1"),
        failing("f2"),
        failing("f3"),
        failing("of1", "other"),
        TaskSpec(id="healthy", pipeline=NoopPipeline(kind="noop")),
        failing("fp"),
    ]
    admin.create_tasks(specs)
    want = {"f1": "FAILED", "f2": "FAILED", "f3": "FAILED", "of1": "FAILED", "healthy": "RUNNING", "fp": "FAILED"}
    assert wait_for(lambda: shown(admin) == want, 30), shown(admin)
    admin.pause("fp")
    before = {t: runs(workers["b0"], t) for t in ("f1", "f2", "f3", "healthy")}

    result = admin.restart_tasks(group="default")
    assert [c.task_id for c in result.restarted] == ["f1", "f2", "f3"] and result.multis == 1
    assert all(c.changed and c.restart_nonce == 1 for c in result.restarted)
    assert result.skipped == (SkippedRestart("fp", "PAUSED: resume it to run it again"),)
    stats = [zk.exists(layout.task(t)) for t in ("f1", "f2", "f3")]
    assert len({s.mzxid for s in stats}) == 1, "written by one transaction"
    nonces = {t: admin.describe_task(t).spec["restart_nonce"] for t in want}
    assert nonces == {"f1": 1, "f2": 1, "f3": 1, "of1": 0, "healthy": 0, "fp": 0}

    # each ran again on its owner (and failed again: the policy allows no automatic restart)
    assert wait_for(lambda: all(runs(workers["b0"], t) == before[t] + 1 for t in ("f1", "f2", "f3")), 20), {
        t: runs(workers["b0"], t) for t in before
    }
    assert runs(workers["b0"], "healthy") == before["healthy"]

    def failed_again(t: str) -> bool:
        """The re-run is over and its FAILED is the status written (``runs`` counts a run from its start; the
        FAILED shown until the re-run's RUNNING is written is the first run's)."""
        ended = [i.end for i in workers["b0"].intervals if i.task_id == t]
        status = codecs.decode(task_records.TaskStatus, zk.get(layout.status(t))[0])
        return len(ended) == before[t] + 1 and status.state == "FAILED" and status.updated >= max(ended)

    assert wait_for(lambda: all(failed_again(t) for t in ("f1", "f2", "f3")), 20)
    assert wait_for(lambda: shown(admin) == {**want, "fp": "FAILED"}, 20), shown(admin)

    everywhere = admin.restart_tasks()
    assert [c.task_id for c in everywhere.restarted] == ["f1", "f2", "f3", "of1"] and everywhere.multis == 1
    assert wait_for(lambda: runs(workers["o0"], "of1") == 2, 20)


def test_no_failed_task_restarts_nothing_and_writes_nothing(cluster, zk, layout):
    admin, _ = cluster
    admin.create_tasks([TaskSpec(id="healthy", pipeline=NoopPipeline(kind="noop"))])
    assert wait_for(lambda: shown(admin) == {"healthy": "RUNNING"}, 20)
    version = zk.exists(layout.task("healthy")).version
    result = admin.restart_tasks()
    assert (result.restarted, result.skipped, result.multis) == ((), (), 0)
    assert zk.exists(layout.task("healthy")).version == version


def test_the_worker_follows_the_tasks_policy_and_describe_reports_it(cluster):
    admin, workers = cluster
    policy = RestartPolicy(max_attempts=2, backoff_initial_s=0.4, backoff_max_s=0.5)
    admin.create_tasks(
        [
            TaskSpec(
                id="flaky",
                restart=policy,
                pipeline=NoopPipeline(kind="noop", fail_after_s=0.05, fail_message="flaky broke"),
            )
        ]
    )
    assert wait_for(lambda: shown(admin) == {"flaky": "FAILED"}, 30), shown(admin)
    starts = sorted(i.start for i in workers["b0"].intervals if i.task_id == "flaky")
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 3, starts  # the first run and two restarts
    assert gaps[0] >= 0.4 and gaps[1] >= 0.5, gaps  # 0.4 s, then doubled but capped at 0.5 s
    d = admin.describe_task("flaky")
    assert d.last_error == "flaky broke" and d.status["failures"] == 3
    assert d.restart is not None and (d.restart.max_attempts, d.restart.attempts, d.restart.gave_up) == (2, 2, True)
    time.sleep(1.0)  # it stays FAILED: no more runs
    assert len([i for i in workers["b0"].intervals if i.task_id == "flaky"]) == 3
