"""The fence and the hard deadline as numbers, without ZooKeeper or processes: the fence margin (the runner's stop
budget, capped at half the session), the hard deadline between the fence and the earliest expiry, each stop's
budget, the lease file, the stop batches and the liveness probe's period. The real brokers that halt:
tests/integration/worker/test_hard_fence.py."""

from __future__ import annotations

import logging

import pytest

from broker_sim.worker.deadline import Lease, safety_margin, stop_timeout, write_lease
from broker_sim.worker.fence import fence_margin
from broker_sim.worker.slots import StopBatch


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


def test_a_slow_stop_does_not_hold_the_others_of_its_batch():
    batch = StopBatch(3)
    assert batch.done("a", True) is None
    assert batch.expire() == (["a"], ["a"])  # the linger passed: what stopped goes now
    assert batch.done("b", True) == (["b"], ["b"])  # later stops go one by one
    assert batch.done("c", False) == (["c"], [])  # a stop that failed is not released
    assert batch.expire() is None


def test_a_batch_whose_stops_all_returned_goes_together():
    batch = StopBatch(2)
    assert batch.done("a", True) is None
    assert batch.done("b", True) == (["a", "b"], ["a", "b"])
    assert batch.expire() is None


def test_fence_margin_is_the_runners_stop_budget_capped_at_half_the_session(caplog):
    assert fence_margin(6.0, 1 / 6, 0.0) == pytest.approx(1.0)  # a sixth of the session by default
    assert fence_margin(6.0, 1 / 6, 2.0) == 2.0  # a slower stop: fence earlier
    assert fence_margin(8.0, 1 / 6, 4.0) == 4.0  # the spark runner's budget with the session it asks for
    with caplog.at_level(logging.WARNING, logger="broker_sim.worker"):
        assert fence_margin(6.0, 1 / 6, 4.0, "b1") == 3.0  # never fence after less than half the session
    assert "use a session timeout of at least 8.0s" in caplog.text


def test_the_liveness_probe_asks_every_half_margin_between_a_fifth_of_a_second_and_one():
    from broker_sim.worker.fence import probe_interval

    assert probe_interval(1.0) == pytest.approx(0.5)  # the simulator's 6 s session, a sixth of it as margin
    assert probe_interval(0.2) == 0.2 and probe_interval(5.0) == 1.0  # (bounds: never busier, never staler)
