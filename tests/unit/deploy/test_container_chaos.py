"""The container chaos schedule, without an engine: seeded, and able to leave out the kinds an engine cannot
inject (``docker pause`` without the cgroup freezer) while drawing every other kind."""

from __future__ import annotations

import pytest

from broker_sim.deploy.container_chaos import CONTAINER_FAULTS, container_schedule
from broker_sim.deploy.containers import ClusterSpec

SPEC = ClusterSpec(name="s", zk_nodes=3, controllers=2, brokers=3)
PAUSES = frozenset(k for k in CONTAINER_FAULTS if k.startswith("pause"))


def test_same_seed_same_schedule_and_nothing_left_out_by_default() -> None:
    full = container_schedule(5, 600, SPEC)
    assert full == container_schedule(5, 600, SPEC, leave_out=frozenset())
    assert {f.kind for f in full} == set(CONTAINER_FAULTS)


def test_left_out_kinds_are_never_drawn_and_the_others_still_are() -> None:
    schedule = container_schedule(5, 600, SPEC, leave_out=PAUSES)
    assert schedule == container_schedule(5, 600, SPEC, leave_out=PAUSES)
    assert {f.kind for f in schedule} == set(CONTAINER_FAULTS) - PAUSES


@pytest.mark.parametrize("leave_out", [frozenset({"pause-everything"}), frozenset(CONTAINER_FAULTS)])
def test_an_unknown_kind_or_every_kind_is_refused(leave_out: frozenset[str]) -> None:
    with pytest.raises(ValueError, match="cannot leave out"):
        container_schedule(5, 60, SPEC, leave_out=leave_out)
