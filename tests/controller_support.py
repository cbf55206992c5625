"""What the controller tests share: a ``cluster`` fixture that stops everything a test starts (controllers,
workers, clients, servers by pid) also when the test fails, and helpers that plant or read znodes the way a
broker or an operator would."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from broker_sim.chaos.write_stall import WriteStall
from broker_sim.worker import Worker, WorkerConfig
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs
from controller.protocol.records.group_messages import GroupStateInfo, JoinRequest
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings
from controller.zk.server import ZooKeeperServer, four_letter_word, free_port
from tests.waiting import wait_until

log = logging.getLogger(__name__)


def watches_by_session(hosts: str) -> dict[int, set[str]]:
    """The server's own list of watched paths per session (``wchc``)."""
    host, port = hosts.split(":")
    out: dict[int, set[str]] = {}
    session = None
    for line in four_letter_word(host, int(port), "wchc", timeout=5.0).splitlines():
        if line.startswith("0x"):
            session = int(line, 16)
            out[session] = set()
        elif line.strip() and session is not None:
            out[session].add(line.strip())
    return out


def create_tasks(
    client: KazooClient, layout: ZkLayout, ids: list[str], group: str = "default", batch: int = 500
) -> None:
    """Create task znodes in multis of ``batch``, sent pipelined."""
    pending = []
    for i in range(0, len(ids), batch):
        tx = client.transaction()
        for t in ids[i : i + batch]:
            tx.create(layout.task(t), TaskSpec(id=t, group=group, pipeline=NoopPipeline(kind="noop")).encode())
        pending.append(tx.commit_async())
    for p in pending:
        results = p.get(timeout=60)
        assert not any(isinstance(r, Exception) for r in results), results[:3]


def request_deletions(client: KazooClient, layout: ZkLayout, ids: list[str], batch: int = 500) -> None:
    pending = []
    for i in range(0, len(ids), batch):
        tx = client.transaction()
        for t in ids[i : i + batch]:
            tx.create(
                layout.admin_delete_task(t),
                codecs.encode(admin_records.DeleteTaskRequest(task_id=t, requested=time.time())),
            )
        pending.append(tx.commit_async())
    for p in pending:
        results = p.get(timeout=60)
        assert not any(isinstance(r, Exception) for r in results), results[:3]


def request_rebalance(client: KazooClient, layout: ZkLayout, group: str | None, reason: str) -> str:
    return client.create(
        layout.admin_rebalance_request_prefix,
        codecs.encode(admin_records.RebalanceRequest(group=group, reason=reason)),
        sequence=True,
    )


def join_request(member: str, join_generation: int = 1, generation: int = 0) -> bytes:
    return codecs.encode(
        JoinRequest(
            member_id=member,
            join_generation=join_generation,
            generation=generation,
            protocols=("cooperative", "eager"),
            assignors=("sticky",),
        )
    )


def group_state(client: KazooClient, layout: ZkLayout, group: str = "default") -> GroupStateInfo | None:
    try:
        data, _ = client.get(layout.group_state(group))
    except Exception:
        return None
    return codecs.decode(GroupStateInfo, data)


def settle(ctl: Controller, timeout: float = 10) -> None:
    """Wait until every event queued so far has been processed (a probe goes through the queue)."""
    done: list[int] = []
    ctl.put(Probe(-1, done))
    wait_until(lambda: done, timeout, "the event queue to drain")


def view(ctl: Controller) -> tuple[dict[str, int], dict[str, TaskSpec]]:
    """The context's view of brokers (id -> czxid epoch) and tasks."""
    ctx = ctl.ctx
    assert ctx is not None
    return {b: r.epoch for b, r in dict(ctx.brokers).items()}, dict(ctx.tasks)


@dataclass(frozen=True)
class Probe:
    """A test event: records that (and in which order) the controller processed it."""

    seq: int
    log: list

    def process(self, c: Controller) -> None:
        self.log.append(self.seq)


@dataclass(frozen=True)
class Block:
    """A test event that holds the event thread until released (bounded), so events pile up behind it."""

    entered: threading.Event
    release: threading.Event

    def process(self, c: Controller) -> None:
        self.entered.set()
        assert self.release.wait(30), "Block never released"


class ActiveMonitor(threading.Thread):
    """Observes every live candidate's ``active`` flag continuously; records any moment two were active."""

    def __init__(self) -> None:
        super().__init__(name="test-active-monitor", daemon=True)
        self.live: list[Controller] = []
        self.lock = threading.Lock()
        self.observations = 0
        self.violations: list[list[str]] = []
        self._stop_ev = threading.Event()

    def watch(self, *ctls: Controller) -> None:
        with self.lock:
            self.live += ctls

    def forget(self, ctl: Controller) -> None:
        """A killed candidate is no longer live: its flag may lag until its own event thread catches up."""
        with self.lock:
            self.live = [c for c in self.live if c is not ctl]

    def active(self) -> list[Controller]:
        with self.lock:
            return [c for c in self.live if c.active]

    def run(self) -> None:
        while not self._stop_ev.wait(0.001):
            act = self.active()
            self.observations += 1
            if len(act) > 1:
                self.violations.append([c.id for c in act])

    def stop(self) -> None:
        self._stop_ev.set()
        self.join(5)


class Cluster:
    """Everything a test starts, so that teardown stops all of it (also on failure)."""

    def __init__(self, settings: ZkSettings, tmp_path: Path) -> None:
        self.settings = settings
        self.tmp_path = tmp_path
        self.controllers: list[Controller] = []
        self.workers: list[Worker] = []
        self.clients: list[KazooClient] = []
        self.servers: list[ZooKeeperServer] = []
        self.releases: list[threading.Event] = []
        self.write_stalls: dict[str, WriteStall] = {}

    def controller(
        self,
        cid: str,
        cls: type[Controller] = Controller,
        settings: ZkSettings | None = None,
        start: bool = True,
        **kw: Any,
    ) -> Controller:
        self.write_stalls[cid] = WriteStall()
        ctl = cls(ControllerConfig(cid, settings or self.settings, **kw), before_write=self.write_stalls[cid])
        self.controllers.append(ctl)
        return ctl.start() if start else ctl

    def worker(self, wid: str, settings: ZkSettings | None = None, **kw: Any) -> Worker:
        w = Worker(WorkerConfig(wid, settings or self.settings, **kw, on_halt="kill"))
        self.workers.append(w)
        return w.start()

    def client(self, settings: ZkSettings | None = None, **kw: Any) -> KazooClient:
        s = settings or self.settings
        c = KazooClient(hosts=s.hosts, timeout=s.session_timeout_s, **kw)
        self.clients.append(c)
        c.start(timeout=15)
        return c

    def server(self) -> ZooKeeperServer:
        srv = ZooKeeperServer(data_dir=self.tmp_path / f"zk{len(self.servers)}", port=free_port(), tick_ms=200)
        self.servers.append(srv)
        srv.start(timeout=90)
        return srv

    def close(self) -> None:
        for r in self.releases:
            r.set()
        for stall in self.write_stalls.values():
            stall.release()
        for w in self.workers:
            try:
                w.kill()
            except Exception:
                log.exception("stopping worker %s", w.id)
        for ctl in self.controllers:
            try:
                ctl.stop()  # also one never started, or whose session a test closed
            except Exception:
                log.exception("stopping controller %s", ctl.id)
        for c in self.clients:
            try:
                c.stop()
                c.close()
            except Exception:
                pass
        for srv in self.servers:
            srv.stop()  # by pid
        leftover = [
            t.name
            for t in threading.enumerate()
            if any(t.name.startswith(f"controller-{c.id}-") for c in self.controllers)
            and t.is_alive()
            and not t.name.endswith("-retry")
        ]
        assert not leftover, f"threads left running: {leftover}"


@pytest.fixture
def cluster(zk_settings: ZkSettings, zk: KazooClient, tmp_path: Path):
    c = Cluster(zk_settings, tmp_path)
    try:
        yield c
    finally:
        c.close()


def expire_session(hosts: str, client: KazooClient) -> int:
    """Expire ``client``'s session from outside: attach a second client to it and close that one."""
    session_id = client.client_id[0]
    thief = KazooClient(hosts=hosts, client_id=client.client_id, timeout=client._session_timeout / 1000)
    thief.start(timeout=15)
    thief.stop()
    thief.close()
    return session_id


def the_active(ctls: list[Controller]) -> Controller | None:
    act = [c for c in ctls if c.active and c.ctx is not None]
    return act[0] if len(act) == 1 else None
