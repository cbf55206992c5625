"""The hard deadline as numbers, without ZooKeeper or processes: between the fence and the earliest expiry, each
stop's budget, the lease file. The real brokers that halt: tests/integration/worker/test_hard_fence.py."""

from __future__ import annotations

import pytest

from broker_sim.worker.deadline import Lease, safety_margin, stop_timeout, write_lease
from broker_sim.worker.fence import fence_margin


@pytest.mark.parametrize("session, budget", [(4.0, 0.0), (6.0, 40.0), (8.0, 4.0), (30.0, 1.0), (2.0, 0.0)])
def test_the_hard_deadline_falls_after_the_fence_and_before_the_earliest_expiry(session, budget):
    margin = fence_margin(session, 1 / 6, budget)
    safety = safety_margin(session, margin)
    assert 0 < safety < margin <= session / 2  # fence first, then the hard deadline, then the earliest expiry
    assert safety >= 0.2  # time to SIGKILL and exit


def test_each_stop_has_a_budget_of_its_own():
    assert stop_timeout(0.0, None) == 5.0
    assert stop_timeout(4.0, None) == 12.0
    assert stop_timeout(4.0, 1.5) == 1.5


def test_a_lease_round_trips_and_is_replaced_atomically(tmp_path):
    lease = Lease(broker="b1", owner_pid=123, expires=42.5, pids=(7, 8), pgids=(9,))
    assert Lease.decode(lease.encode()) == lease
    path = tmp_path / "b1.json"
    write_lease(path, lease)
    write_lease(path, Lease(broker="b1", owner_pid=123, expires=None))
    assert Lease.decode(path.read_text()).expires is None
    assert [p.name for p in tmp_path.iterdir()] == ["b1.json"]  # no temporary file left behind
