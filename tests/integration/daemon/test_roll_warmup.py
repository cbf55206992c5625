"""The planned roll's warm-up against a real ZooKeeper, controller and no-op workers in this process: a task
a roll moves is prepared by the broker receiving it before it arrives, and starts from what was prepared;
what was prepared and does not come (the roll paused) is discarded, and never ran. The rule alone:
tests/unit/worker/test_warmup.py."""

from __future__ import annotations

import time

from broker_sim.sim.checker import double_ownership
from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from controller.admin import AdminClient
from tests.integration.daemon.test_roll import _supervise
from tests.waiting import wait_until


def test_a_rolled_task_is_prepared_before_it_arrives_and_starts_from_it(zk_hosts: str) -> None:
    opts = SimOptions(
        brokers=3,
        tasks=12,
        scenario="roll",
        restart_gap_s=0.3,
        start_latency_s=0.4,
        prepare_share=0.75,
        zk_hosts=zk_hosts,
        converge_timeout_s=30,
        roll_wave=2,
        roll_warmup_s=1.0,
        protocol="reconcile",
        roll_in_place=True,
    )
    with Simulation(opts) as sim:
        s = sim.run()
        assert s.double_ownership == 0 and s.moved_tasks == 12 == sim.roll_moves
        began = sim.steps[0].started
        intervals = sorted(sim.all_intervals(), key=lambda i: i.start)
        moved: dict[str, str] = {}  # task -> the broker it moved to
        for t in sim.task_ids:
            runs = [i for i in intervals if i.task_id == t and (i.end is None or i.end >= began)]
            for a, b in zip(runs, runs[1:]):
                if a.broker != b.broker:
                    moved[t] = b.broker
        # every task moves once: the second and third broker's to a broker rolled already, the first broker's
        # (restarted in place with them) to the third when it is back empty; each announced and prepared
        assert len(moved) == 12, moved
        for t, to in moved.items():
            runner = sim.workers[to].runner  # (a receiver is not restarted after it received)
            assert t in runner.warm_starts, (t, to, list(runner.warm_starts))  # type: ignore[attr-defined]
        # the warm-up's bookkeeping forgets them as they run (at its next review: the status thread's pass)
        wait_until(
            lambda: not any(w.warmup.prepared() for w in sim.workers.values()), 5, "the warm-up to forget the arrivals"
        )
        assert sum(w.warmup.arrivals for w in sim.workers.values()) == 12
        assert not any(w.runner.prepared() for w in sim.workers.values())  # type: ignore[attr-defined]


def test_what_was_prepared_and_did_not_arrive_is_discarded(zk_hosts: str) -> None:
    """A roll whose first wave waits longer than its phase may take: it pauses with its moves announced and
    prepared; the announcement is withdrawn, the receiver discards them, and none of them ran there."""
    opts = SimOptions(
        brokers=2,
        tasks=6,
        zk_hosts=zk_hosts,
        converge_timeout_s=30,
        start_latency_s=0.2,
        prepare_share=0.5,
        protocol="reconcile",
    )
    with Simulation(opts) as sim:
        sim.create_tasks(opts.tasks)
        sim.start_controller("ctl-0")
        sim.start_workers([sim.broker_id(i) for i in range(2)])
        assert sim.wait_converged(balanced=True) is not None
        admin = AdminClient(sim.admin, sim.layout)
        rolled_at = time.time()
        admin.roll("default", batch=1, timeout_s=4.0, wave=1, warmup_s=60.0, in_place=True)
        # broker-000 restarts in place; broker-001's tasks are then announced to it, and wait for the warm-up
        assert _supervise(sim, admin, (), 30, step=1) == "drain"
        receiver = sim.workers["broker-000"]
        leaving = set(sim.workers["broker-001"].running_tasks())
        assert len(leaving) == 3
        wait_until(lambda: receiver.runner.prepared() == leaving, 10, "the leaving tasks prepared")  # type: ignore[attr-defined]
        assert receiver.running_tasks().isdisjoint(leaving)  # prepared, not running
        assert _supervise(sim, admin, ("paused", "done"), 30, restart=False) == "paused"
        wait_until(lambda: not receiver.runner.prepared(), 10, "the prepared tasks discarded")  # type: ignore[attr-defined]
        assert receiver.runner.prepared() == set() and receiver.warmup.prepared() == set()  # type: ignore[attr-defined]
        assert receiver.warmup.discards >= 3 and receiver.warmup.arrivals == 0
        assert set(sim.workers["broker-001"].running_tasks()) == leaving  # they stayed where they ran
        ran_there = [i for i in sim.all_intervals() if i.task_id in leaving and i.broker == "broker-000"]
        assert not [i for i in ran_there if i.start >= rolled_at], ran_there
        assert double_ownership(sim.all_intervals()) == []


def test_the_fence_drops_what_was_prepared(zk_hosts: str) -> None:
    """A broker fenced (ZooKeeper out of reach) while it holds prepared tasks: the fence stops what runs and
    drops what was prepared too; nothing is prepared while it is up."""
    opts = SimOptions(
        brokers=2, tasks=4, zk_hosts=zk_hosts, converge_timeout_s=30, start_latency_s=0.2, protocol="reconcile"
    )
    with Simulation(opts) as sim:
        sim.create_tasks(opts.tasks)
        sim.start_controller("ctl-0")
        sim.start_workers([sim.broker_id(i) for i in range(2)])
        assert sim.wait_converged(balanced=True) is not None
        admin = AdminClient(sim.admin, sim.layout)
        admin.roll("default", batch=1, timeout_s=60.0, warmup_s=60.0, in_place=True)
        assert _supervise(sim, admin, (), 30, step=1) == "drain"
        receiver = sim.workers["broker-000"]
        leaving = set(sim.workers["broker-001"].running_tasks())
        wait_until(lambda: receiver.runner.prepared() == leaving, 10, "the leaving tasks prepared")  # type: ignore[attr-defined]
        receiver.fence.fence()  # what the SUSPENDED timer and the pause detector call
        assert receiver.runner.prepared() == set() and receiver.warmup.prepared() == set()  # type: ignore[attr-defined]
        assert receiver.runner.running() == set()
        receiver.warmup.review()  # (the status thread's pass while fenced: nothing prepared again)
        time.sleep(0.3)  # a window for a wrong prepare to show: nothing to wait for when all goes right
        assert receiver.runner.prepared() == set()  # type: ignore[attr-defined]
