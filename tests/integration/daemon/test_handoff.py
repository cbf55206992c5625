"""A planned move handed to its receiver in the round that revokes it, against a real ZooKeeper, controller and
no-op workers in this process: the receiver starts the task before the generation that assigns it (as soon as
the owner znode is released), and the task never runs on two brokers. The rule itself:
tests/unit/protocol/group/test_handoff.py; under faults: the planned-move schedules of
tests/unit/sim/test_protosim.py."""

from __future__ import annotations

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import DataWatch

from broker_sim.sim.checker import double_ownership
from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from controller.admin import AdminClient
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import Assignment
from controller.protocol.records.task_records import OwnerInfo
from tests.waiting import wait_until


def _owner(sim: Simulation, t: str) -> str | None:
    """The broker holding the task's owner znode (None between a release and the next acquisition)."""
    try:
        data, _ = sim.admin.get(sim.layout.task_owner(t))
    except NoNodeError:
        return None
    return codecs.decode(OwnerInfo, data).broker


def test_a_reassigned_task_is_handed_off_by_the_revoking_round_and_never_runs_twice(zk_hosts: str) -> None:
    opts = SimOptions(brokers=3, tasks=9, zk_hosts=zk_hosts, converge_timeout_s=30)
    with Simulation(opts) as sim:
        sim.create_tasks(opts.tasks)
        sim.start_controller("ctl-0")
        sim.start_workers([sim.broker_id(i) for i in range(3)])
        assert sim.wait_converged(balanced=True) is not None
        receiver = sim.broker_id(2)
        # one task of each other broker moves to the receiver, both at once
        moving = {}
        for t in sorted(sim.task_ids):
            owner = _owner(sim, t)
            if owner != receiver and owner not in moving.values():
                moving[t] = owner
        assert len(moving) == 2, moving
        # every version of the receiver's assignment as ZooKeeper serves it, with the time it was written
        seen: list[tuple[Assignment, float]] = []

        def record(data: bytes | None, stat: ZnodeStat | None) -> None:
            if data and stat is not None:
                seen.append((codecs.decode(Assignment, data), stat.mtime / 1000.0))

        DataWatch(sim.admin, sim.layout.group_assignment("default", receiver), record)
        admin = AdminClient(sim.admin, sim.layout)
        for t in moving:
            admin.reassign(t, receiver)
        wait_until(lambda: all(_owner(sim, t) == receiver for t in moving), 30, "the moved tasks owned by the receiver")
        assert sim.wait_converged() is not None
        intervals = sim.all_intervals()
        assert double_ownership(intervals, now=None) == []
        for t, before in moving.items():
            # handed to the receiver by the round that revoked it from its owner
            assert any(t in a.handoff for a, _ in seen), (t, [(a.generation, a.assigned, a.handoff) for a, _ in seen])
            runs = [i for i in intervals if i.task_id == t and i.broker == receiver]
            assert len(runs) == 1 and runs[0].acquired is not None, runs
            gone = [i for i in intervals if i.task_id == t and i.broker == before]
            assert gone and all(i.released is not None and i.released <= runs[0].acquired for i in gone)
        # Whether the receiver took a task before the next round wrote it (as a rule it does: the round is several
        # round trips more than the release's watch and a create) is speed, not safety: the benchmark measures it.
