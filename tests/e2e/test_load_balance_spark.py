"""Placement by measured load on real Spark brokers: two heavy pipelines (a one-file-per-trigger backlog on a
short trigger) and a light one start on broker A; broker B joins. Count balance would keep the two heavy ones
together on A (their ids sort first); the load-balanced assignor, from A's measured load shares, moves one heavy
pipeline to B, once, and each heavy sink ends with every input row exactly once.

A real ZooKeeper, a controller in this process and two broker *processes*, each stopped by its id."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker_sim.chaos.sinks import committed_files
from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.registration_records import BrokerInfo
from controller.protocol.records.task_records import OwnerInfo
from controller.protocol.tasks.spec import parse_spec
from tests.spark_brokers import WORKER_SPARK, controlled_root, start_spark_broker, stop_brokers
from tests.spark_support import files_task, require_spark, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

HEAVY = ("a-heavy-1", "a-heavy-2")
LIGHT = "b-light"
FILES, PER_FILE = 16, 10
BROKER_ARGS = (*WORKER_SPARK, "--assignor", "load-balanced", "--load-interval", "1", "--metrics-interval", "1")


@dataclass
class Cluster:
    zk: KazooClient
    layout: ZkLayout
    env: dict[str, str]
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, bid: str) -> None:
        self.procs[bid] = start_spark_broker(bid, self.env, self.workdir, self.workdir / f"{bid}.log", *BROKER_ARGS)

    def owner(self, task: str) -> str | None:
        try:
            return codecs.decode(OwnerInfo, self.zk.get(self.layout.task_owner(task))[0]).broker
        except NoNodeError:
            return None

    def reported(self, bid: str) -> dict[str, float]:
        try:
            info = codecs.decode(BrokerInfo, self.zk.get(self.layout.broker(bid))[0])
        except NoNodeError:
            return {}
        return dict((info.load or {}).get("tasks", {}))


@pytest.fixture
def cluster(zk_hosts: str, tmp_path: Path) -> Iterator[Cluster]:
    require_spark()
    with controlled_root(
        zk_hosts, tmp_path, "load", default_assignor="load-balanced", load_window_s=3.0, load_check_s=1.0
    ) as r:
        c = Cluster(r.zk, r.layout, r.env, tmp_path)
        try:
            yield c
        finally:
            stop_brokers(c.procs.values())


def _ids(sink: Path) -> Counter[int]:
    return Counter(i for f in committed_files(sink) for i in pq.read_table(f, columns=["id"]).column("id").to_pylist())


def test_two_heavy_pipelines_on_one_broker_end_on_two(cluster: Cluster) -> None:
    c = cluster
    specs = []
    for n, t in enumerate(HEAVY):
        src = c.workdir / "in" / t
        generate(DatagenConfig(out_dir=str(src), records=FILES * PER_FILE, batch=PER_FILE, start_id=n * 100_000))
        specs.append(
            files_task(
                t,
                src,
                c.workdir / "out" / t,
                "SELECT id, key FROM input",
                max_files=1,
                trigger={"processing_time": "300 milliseconds"},
            )
        )
    generate(DatagenConfig(out_dir=str(c.workdir / "in" / LIGHT), records=20, batch=10))
    specs.append(
        files_task(
            LIGHT,
            c.workdir / "in" / LIGHT,
            c.workdir / "out" / LIGHT,
            "SELECT id FROM input",
            trigger={"processing_time": "60 seconds"},
        )
    )
    c.start("A")
    AdminClient(c.zk, c.layout).create_tasks([parse_spec(s) for s in specs])
    wait_for(lambda: all(c.owner(t) == "A" for t in (*HEAVY, LIGHT)), 180, "A to run every pipeline")
    wait_for(lambda: set(HEAVY) <= set(c.reported("A")), 120, "A's load report of both heavy pipelines")
    shares = c.reported("A")
    assert all(shares[h] > shares.get(LIGHT, 0.0) for h in HEAVY), shares

    owners: dict[str, list[str]] = {t: ["A"] for t in HEAVY}

    def spread() -> bool:
        for t in HEAVY:
            o = c.owner(t)
            if o is not None and o != owners[t][-1]:
                owners[t].append(o)
        return {owners[t][-1] for t in HEAVY} == {"A", "B"} and all(c.owner(t) for t in HEAVY)

    c.start("B")
    wait_for(spread, 180, "the heavy pipelines on two brokers")
    for t in HEAVY:  # both sinks complete: every row, each once (the moved one resumed from its checkpoint)
        wait_for(lambda t=t: sum(_ids(c.workdir / "out" / t).values()) >= FILES * PER_FILE, 120, f"{t} to drain")
        spread()
        ids = _ids(c.workdir / "out" / t)
        assert max(ids.values()) == 1, f"{t}: rows written twice"
        assert len(ids) == FILES * PER_FILE
    assert sorted(len(o) - 1 for o in owners.values()) == [0, 1], owners  # one heavy moved, once
