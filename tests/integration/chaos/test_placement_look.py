"""The placement sampler's look (invariant 9) on a real ZooKeeper, its client behind a proxy whose connections
are dropped in the middle of a look, as the ensemble's leader's death drops every client: the look that the
drop cut through is recorded blind, not as one instant (its reads were of before the drop, what runs of after
it), and the next look comes after the base interval. The verdict over such looks: tests/unit/chaos/
test_placement_looks.py."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from broker_sim.chaos.checks import Checks, ConnectionWatch
from broker_sim.chaos.processes import JournalTail
from broker_sim.chaos.schedule import GROUP, ChaosOptions
from broker_sim.chaos.summary import Placement
from broker_sim.sim.netproxy import NetProxy
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import Assignment, GroupStateInfo
from controller.protocol.records.registration_records import ControllerInfo
from controller.zk.client import ZkSettings, make_client
from tests.cli_support import until

BROKER = "broker-000"


class OneBrokerRun:
    """What the checks read of a run (``CheckedRun``), for one broker whose journal is a file: its life began
    before its member znode, the active controller can act. ``before_running`` runs inside the look, after
    its ZooKeeper reads and before it reads what runs."""

    def __init__(self, layout: ZkLayout, admin: KazooClient, journal: Path) -> None:
        self.copts = ChaosOptions(seed=0)
        self.admin = admin
        self.layout = layout
        self.halts: Counter[str] = Counter()
        self.last_restart: float | None = None
        self.tail = JournalTail(journal)
        self.before_running: Callable[[], None] | None = None

    def settings(self, hosts: str | None = None) -> ZkSettings:
        raise AssertionError("the test gives the checks its client")

    def running_now(self) -> Counter[str]:
        if self.before_running is not None:
            self.before_running()
        return Counter(self.tail.running())

    def broker_life(self, bid: str) -> float | None:
        return 0.0 if bid == BROKER else None

    def known_broker(self, bid: str) -> bool:
        return bid == BROKER

    def controller_up(self, cid: str) -> bool:
        return True


def journal(path: Path, event: str) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"e": event, "t": "t1", "ts": time.time(), "pid": 1}) + "\n")


@pytest.fixture
def sampler_client(zk_settings: ZkSettings) -> Iterator[tuple[KazooClient, NetProxy]]:
    """The sampler's client, through a proxy the test can drop (closed, then the proxy)."""
    proxy = NetProxy.for_hosts(zk_settings.hosts, "sampler-proxy")
    client = make_client(ZkSettings(hosts=proxy.address, root=zk_settings.root, session_timeout_s=4.0))
    try:
        yield client, proxy
    finally:
        client.stop()
        client.close()
        proxy.close()


def test_a_look_cut_by_a_connection_loss_is_blind_and_the_next_comes_after_the_interval(
    zk: KazooClient, layout: ZkLayout, zk_settings: ZkSettings, sampler_client, tmp_path: Path
) -> None:
    client, proxy = sampler_client
    # broker-000's session: its broker znode and t1's owner znode; the group Stable with t1 placed on it
    broker = make_client(zk_settings)
    try:
        broker.create(layout.broker(BROKER), b"{}", ephemeral=True, makepath=True)
        broker.create(layout.task_owner("t1"), b"{}", ephemeral=True, makepath=True)
        zk.create(layout.controller, codecs.encode(ControllerInfo("ctl-0", 1, "localhost", time.time())))
        zk.create(
            layout.group_state(GROUP),
            codecs.encode(GroupStateInfo("Stable", 3, 3, 1, "cooperative", members=(BROKER,))),
            makepath=True,
        )
        zk.create(
            layout.group_assignment(GROUP, BROKER),
            codecs.encode(Assignment(generation=3, controller_epoch=1, assigned=("t1",))),
            makepath=True,
        )
        zk.create(layout.group_member(GROUP, BROKER), b"{}", makepath=True)
        path = tmp_path / "broker-000.journal"
        journal(path, "start")
        run = OneBrokerRun(layout, zk, path)
        checks = Checks(run)
        watch = ConnectionWatch(client)
        interval = run.copts.placement_interval_s

        seen, pause = checks.look(client, watch)
        assert seen.state == "Stable" and seen.controller_up and seen.unowned == (), seen
        assert pause >= interval

        # the broker stops t1 (fenced: its connection went with the leader's death) and, in the middle of the
        # sampler's look, the sampler's connection drops too and comes back on the same session
        journal(path, "stop")

        def drop_and_reconnect() -> None:
            run.before_running = None
            proxy.reset()
            until(lambda: watch.changes >= 2 and client.state == KazooState.CONNECTED, 20, "the sampler back")

        run.before_running = drop_and_reconnect
        began = time.time()
        cut, pause = checks.look(client, watch)
        # what it read spans the drop: not one instant (as one, it said t1 ownerless while Stable, from began)
        assert cut == Placement(cut.t, None, controller_up=False) and began <= cut.t < began + 1.0, cut
        assert pause == interval

        # the next look, whole: t1 placed on broker-000 and not running, while the group says Stable
        after, _ = checks.look(client, watch)
        assert after.state == "Stable" and after.unowned == (("t1", BROKER),), after
    finally:
        broker.stop()
        broker.close()
