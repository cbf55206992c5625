"""Outages: ZooKeeper itself down for longer than the session timeout, and one worker's network going
silent while it keeps talking.

The ZooKeeper outage uses a private server (stopping the session-wide one would break other tests): the
workers must stop their tasks before their sessions could be taken over, a controller must be active
again afterwards, every task must run again, and the checker must find no double ownership.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from broker_sim.checker import close_open, double_ownership
from broker_sim.netproxy import NetProxy
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import ensure_layout, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.group import GroupConfig
from controller.layout import ZkLayout
from controller.taskspec import TaskSpec
from controller.zkclient import ZkSettings, make_client
from controller.zkserver import ZooKeeperServer, free_port

SESSION = 4.0


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        if not w._closing:
            w.stop()


def _worker(workers: list[Worker], settings: ZkSettings, bid: str) -> Worker:
    w = Worker(WorkerConfig(broker_id=bid, settings=settings, status_interval_s=0.2)).start()
    workers.append(w)
    return w


def test_a_chatty_worker_cut_off_fences_before_its_session_can_expire(zk, layout, zk_hosts, zk_root, workers):
    """kazoo declares SUSPENDED only when a heartbeat ping goes unanswered, and every request it sends
    counts as a ping: a worker that keeps issuing requests into a silent network would never see
    SUSPENDED, so the fence timer alone would never fire while its session expires and another worker
    takes its tasks. The worker's own liveness probe (time since the last answered request) must fence
    it inside the session timeout anyway."""
    host, port = zk_hosts.split(":")
    proxy = NetProxy(host, int(port), name="proxy-chatty")
    ctl = Controller(ControllerConfig("c0", ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=SESSION),
                                      GroupConfig(rebalance_timeout_s=3.0))).start()
    stop_chatter = threading.Event()
    try:
        assert ctl.wait_active(10)
        tx = zk.transaction()
        for i in range(6):
            tx.create(layout.task(f"t{i}"), TaskSpec(id=f"t{i}").encode())
        tx.commit()
        cut = _worker(workers, ZkSettings(hosts=proxy.address, root=zk_root, session_timeout_s=SESSION), "cut")
        other = _worker(workers, ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=SESSION), "other")
        assert wait_for(lambda: len(cut.running_tasks()) == 3 and len(other.running_tasks()) == 3, 20)
        mine = cut.running_tasks()

        def chatter() -> None:  # traffic on the session that never waits for an answer (async requests)
            while not stop_chatter.wait(0.3):
                try:
                    cut.client.exists_async(layout.broker("cut"))
                except Exception:
                    return

        threading.Thread(target=chatter, name="test-chatter", daemon=True).start()
        t_cut = time.time()
        proxy.partition()
        assert wait_for(lambda: cut.running_tasks() == set(), SESSION), "the cut-off worker did not fence in time"
        fenced_at = time.time()
        assert wait_for(lambda: mine <= other.running_tasks(), 30)
        starts = [i.start for i in other.open_intervals() if i.task_id in mine]
        assert fenced_at < min(starts), "the cut-off worker stopped before anyone else started"
        assert fenced_at - t_cut < SESSION * 5 / 6 + 0.5
        stop_chatter.set()
        proxy.reset()
        proxy.heal()
        intervals = close_open(list(cut.intervals) + list(other.intervals) + other.open_intervals(), time.time())
        assert double_ownership(intervals) == []
    finally:
        stop_chatter.set()
        ctl.stop()
        proxy.close()
