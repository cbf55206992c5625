"""The stop batches of the task table: a slow stop does not hold the others; stops that all returned go together."""

from __future__ import annotations

from broker_sim.worker.slots import StopBatch


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
