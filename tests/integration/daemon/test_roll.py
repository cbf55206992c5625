"""The planned roll against a real ZooKeeper, controller and no-op workers in this process (the test is the
brokers' supervisor: a broker that exits is started again under the same id). The plan itself, exhaustively:
tests/unit/protocol/cluster/test_roll_plan.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from broker_sim.sim.checker import double_ownership
from broker_sim.sim.simulation_types import SimOptions
from broker_sim.sim.simulator import Simulation
from controller.admin import AdminClient
from controller.admin.common import AdminError
from tests.cli_support import invoke
from tests.waiting import wait_until


@contextmanager
def _converged_cluster(zk_hosts: str, brokers: int, tasks: int, controllers: int = 1) -> Iterator[Simulation]:
    """A simulated cluster in this process: ``tasks`` no-op tasks, ``controllers`` controllers (ctl-0 first, the
    others standing by) and ``brokers`` workers, converged and balanced."""
    opts = SimOptions(brokers=brokers, tasks=tasks, zk_hosts=zk_hosts, converge_timeout_s=30)
    with Simulation(opts) as sim:
        sim.create_tasks(opts.tasks)
        for i in range(controllers):
            sim.start_controller(f"ctl-{i}")
        sim.start_workers([sim.broker_id(i) for i in range(brokers)])
        assert sim.wait_converged(balanced=True) is not None
        yield sim


def _supervise(
    sim: Simulation,
    admin: AdminClient,
    until: tuple[str, ...],
    timeout: float,
    restart: bool = True,
    step: int | None = None,
) -> str:
    """Restart every broker that exits until the roll reaches a phase of ``until`` (or step ``step``); the
    phase then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if restart:
            for bid, w in list(sim.workers.items()):
                if w.exited.is_set():
                    sim.retire(w, graceful=True)
                    sim.start_worker(bid)
        st = admin.roll_status()
        if st is not None and (st.phase in until or (step is not None and st.step >= step)):
            return st.phase
        time.sleep(0.05)
    st = admin.roll_status()
    return st.phase if st else "none"


@pytest.mark.parametrize("protocol", ["cooperative", "reconcile"])
def test_roll_moves_each_task_at_most_once_and_ends_balanced(zk_hosts: str, protocol: str) -> None:
    opts = SimOptions(
        brokers=3,
        tasks=12,
        scenario="roll",
        restart_gap_s=0.3,
        zk_hosts=zk_hosts,
        converge_timeout_s=30,
        roll_wave=3,
        protocol=protocol,
        roll_in_place=True,
    )
    with Simulation(opts) as sim:
        s = sim.run()
        assert s.double_ownership == 0
        # 12 tasks over 3 brokers: the first broker restarts in place (its 4 wait for it), the second's and the
        # third's 4 each move to brokers rolled already, and 4 of the first broker's move to the third when it
        # is back empty: 12 moves, no task moved twice
        assert s.moved_tasks == 12 == sim.roll_moves
        began = sim.steps[0].started  # (the tasks' first placement, as brokers joined, is before it)
        intervals = sorted(sim.all_intervals(), key=lambda i: i.start)
        for t in sim.task_ids:
            runs = [i for i in intervals if i.task_id == t and (i.end is None or i.end >= began)]
            assert sum(1 for a, b in zip(runs, runs[1:]) if a.broker != b.broker) <= 1, (t, runs)
        assert sim.balanced()
        ids = {sim.broker_id(i) for i in range(3)}
        assert set(sim.workers) == ids and all(w.id in ids for w in sim.retired)
        assert len(sim.retired) == 3  # every broker restarted exactly once


def test_a_roll_moving_the_first_batch_keeps_no_task_down_for_a_restart(zk_hosts: str) -> None:
    """The default (``--move-first``): the first broker's tasks move to the last before it goes down (T + 2T/N
    moves), so no task waits out a restart; each task's runs are apart only by a move, never by the restart
    gap."""
    gap = 1.5
    opts = SimOptions(brokers=3, tasks=12, scenario="roll", restart_gap_s=gap, zk_hosts=zk_hosts, converge_timeout_s=30)
    with Simulation(opts) as sim:
        s = sim.run()
        assert s.double_ownership == 0
        assert sim.roll_moves == 12 + 2 * 12 // 3
        began = sim.steps[0].started
        intervals = sorted(sim.all_intervals(), key=lambda i: i.start)
        for t in sim.task_ids:
            runs = [i for i in intervals if i.task_id == t and (i.end is None or i.end >= began)]
            gaps = [b.start - a.end for a, b in zip(runs, runs[1:]) if a.end is not None]
            assert all(g < gap for g in gaps), (t, gaps)  # down for a move, not for a broker's restart
        assert sim.balanced()


def test_roll_pauses_when_a_broker_does_not_return_and_resumes(zk_hosts: str) -> None:
    with _converged_cluster(zk_hosts, brokers=2, tasks=6) as sim:
        admin = AdminClient(sim.admin, sim.layout)
        admin.roll("default", batch=1, timeout_s=2.0)
        with pytest.raises(AdminError, match="--resume"):
            admin.roll("default")
        # nobody restarts broker-000: the roll pauses itself and says why
        assert _supervise(sim, admin, ("paused", "done"), 30, restart=False) == "paused"
        st = admin.roll_status()
        assert st is not None and "broker-000 did not return within 2s" in st.reason and st.resume_phase == "restart"
        assert not sim.workers["broker-001"].exited.is_set()  # the next broker was not touched
        cli = ["--zk", zk_hosts, "--zk-root", sim.layout.root, "broker", "roll"]
        out = invoke([*cli, "--status"])
        assert out.exit_code == 0 and "paused" in out.output and "broker-000 did not return" in out.output, out.output
        sim.retire(sim.workers["broker-000"], graceful=True)
        sim.start_worker("broker-000")
        out = invoke([*cli, "--resume"])
        assert out.exit_code == 0 and "Roll of group default: restart" in out.output, out.output
        assert _supervise(sim, admin, ("paused", "done"), 60) == "done", admin.roll_status()
        assert sim.wait_converged(balanced=True) is not None


def test_the_cli_rolls_moving_first_in_waves_of_8_unless_told_otherwise(zk_hosts: str) -> None:
    import json

    with _converged_cluster(zk_hosts, brokers=2, tasks=4) as sim:
        admin = AdminClient(sim.admin, sim.layout)
        cli = ["--json", "--zk", zk_hosts, "--zk-root", sim.layout.root, "broker", "roll", "--timeout", "60"]
        out = invoke(cli)
        assert out.exit_code == 0, out.output
        st = json.loads(out.output)
        assert st["in_place"] is False and st["wave"] == 8, st
        assert _supervise(sim, admin, ("paused", "done"), 60) == "done", admin.roll_status()
        done = admin.roll_status()
        assert done is not None and done.moves == 4 + 2 * 4 // 2  # T + 2T/N
        out = invoke([*cli, "--in-place", "--wave", "1"])
        assert out.exit_code == 0, out.output
        st = json.loads(out.output)
        assert st["in_place"] is True and st["wave"] == 1, st
        assert _supervise(sim, admin, ("paused", "done"), 60) == "done", admin.roll_status()
        done = admin.roll_status()
        assert done is not None and done.moves == 4  # T: the first broker's tasks waited for it


def test_roll_goes_on_under_a_new_controller(zk_hosts: str) -> None:
    with _converged_cluster(zk_hosts, brokers=3, tasks=9, controllers=2) as sim:
        admin = AdminClient(sim.admin, sim.layout)
        admin.roll("default", batch=1, timeout_s=30.0)
        # the first broker rolled, the second on its way out
        assert _supervise(sim, admin, (), 30, step=1) in ("drain", "restart")
        first = sim.kill_controller()
        assert first is not None
        assert _supervise(sim, admin, ("paused", "done"), 90) == "done", admin.roll_status()
        assert sim.wait_converged(balanced=True) is not None
        assert double_ownership(sim.all_intervals()) == []


def test_roll_through_the_api(zk_hosts: str) -> None:
    import json
    import threading
    import urllib.error
    import urllib.request

    import uvicorn

    from controller.api.app import create_app
    from controller.api.context import ApiConfig
    from controller.zk.server import free_port

    with _converged_cluster(zk_hosts, brokers=2, tasks=4) as sim:
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(create_app(ApiConfig(sim.admin, sim.layout)), port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: getattr(server, "started", False), 15, "the API server to listen")
            base = f"http://127.0.0.1:{port}/api/v1/brokers/roll"

            def call(method: str, body: dict | None = None) -> tuple[int, object]:
                data = json.dumps(body).encode() if body is not None else None
                req = urllib.request.Request(
                    base, data=data, method=method, headers={"Content-Type": "application/json"}
                )
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read())

            assert call("GET") == (200, None)
            assert call("POST", {"batch": 0})[0] == 422
            code, st = call("POST", {"group": "default", "timeout_s": 60})
            assert code == 200 and isinstance(st, dict) and st["order"] == [["broker-000"], ["broker-001"]]
            code, err = call("POST", {"resume": True})
            assert code >= 400 and "not paused" in json.dumps(err), err
            admin = AdminClient(sim.admin, sim.layout)
            assert _supervise(sim, admin, ("paused", "done"), 60) == "done"
            code, st = call("GET")
            # moving first, the default: broker-000's 2 to broker-001, broker-001's 4 to broker-000, 2 back
            assert code == 200 and isinstance(st, dict) and st["phase"] == "done" and not st["in_place"]
            assert st["moves"] == 8, st
            assert call("POST", {"move_first": "sometimes"})[0] == 422
            code, st = call("POST", {"timeout_s": 60, "move_first": False})
            assert code == 200 and isinstance(st, dict) and st["in_place"] is True
            assert _supervise(sim, admin, ("paused", "done"), 60) == "done"
            code, st = call("GET")
            # in place: broker-000's 2 wait for it; broker-001's 2 to broker-000, 2 back to broker-001
            assert code == 200 and isinstance(st, dict) and st["phase"] == "done" and st["moves"] == 4, st
        finally:
            server.should_exit = True
            thread.join(10)


def test_roll_takes_the_registered_brokers_of_the_group_not_member_znodes(zk_hosts: str) -> None:
    """A member znode with no registration behind it (a ghost) is no broker to roll: a roll that waited for it
    to come back would pause; the brokers rolled are the live registrations that name the group."""
    with _converged_cluster(zk_hosts, brokers=2, tasks=2) as sim:
        sim.admin.create(sim.layout.group_members("default") + "/ghost", b"{}", ephemeral=True)
        admin = AdminClient(sim.admin, sim.layout)
        st = admin.roll("default", batch=1, timeout_s=30.0)
        assert st.order == (("broker-000",), ("broker-001",))
        assert _supervise(sim, admin, ("paused", "done"), 60) == "done", admin.roll_status()
        with pytest.raises(AdminError, match="no live brokers"):
            admin.roll("nobody", batch=1)
