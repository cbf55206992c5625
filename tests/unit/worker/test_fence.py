"""The fence's margin (the runner's stop budget, capped at half the session) and the liveness probe's period,
as numbers."""

from __future__ import annotations

import logging

import pytest

from broker_sim.worker.fence import fence_margin


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
