"""Warm Spark brokers and what a pipeline is doing, end to end: a real ZooKeeper, a controller (in this
process) and broker *processes* on the spark runner (``python -m cli.main broker run --runner spark``).

One broker JVM serves every check (a Spark test costs 20-60 s; this module starts one):

1. A warm broker registers with its session ``starting`` and writes no join request until the session is up;
   then its registration (and ``status``) says ``ready`` with the start's duration, and it joins.
2. A streaming files pipeline created on that broker runs (its first batch committed) within seconds, with no
   JVM on its path; its status carries the files not yet read (one file per trigger: the backlog falls to 0)
   and the last batches' input rates, which ``task list`` shows as a rate and a sparkline.
3. A lazy broker (``--lazy-session``) joins at once, its registration saying ``lazy``; a broker pointed at a
   standalone master nobody listens on exits 1 at start, saying what to do.

Every process is stopped by its id (its process group), also on failure.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.registration_records import BrokerInfo, SessionState
from controller.protocol.records.task_records import TaskStatus
from controller.protocol.tasks.spec import parse_spec
from tests.spark_brokers import WORKER_SPARK, controlled_root, start_spark_broker, stop_brokers
from tests.spark_support import REPO, files_task, free_port, require_spark, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Brokers:
    zk: KazooClient
    layout: ZkLayout
    env: dict[str, str]
    workdir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, bid: str, *args: str) -> subprocess.Popen[bytes]:
        proc = start_spark_broker(bid, self.env, self.workdir, self.workdir / f"{bid}.log", *args)
        self.procs[bid] = proc
        return proc

    def log(self, bid: str) -> str:
        return (self.workdir / f"{bid}.log").read_text(errors="replace")

    def registration(self, bid: str) -> BrokerInfo | None:
        try:
            return codecs.decode(BrokerInfo, self.zk.get(self.layout.broker(bid))[0])
        except NoNodeError:
            return None

    def member(self, bid: str) -> bool:
        return self.zk.exists(self.layout.group_member("default", bid)) is not None

    def status(self, task: str) -> TaskStatus | None:
        try:
            return codecs.decode(TaskStatus, self.zk.get(self.layout.status(task))[0])
        except NoNodeError:
            return None

    def stop_all(self) -> None:
        stop_brokers(self.procs.values())


@pytest.fixture(scope="module")
def brokers(zk_hosts: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    require_spark()
    workdir = tmp_path_factory.mktemp("warm")
    with controlled_root(zk_hosts, workdir, "warm") as r:
        b = Brokers(r.zk, r.layout, r.env, workdir)
        try:
            yield b
        finally:
            b.stop_all()


def test_a_warm_broker_joins_once_its_session_is_up_and_runs_a_pipeline_at_once(brokers: Brokers) -> None:
    b = brokers
    b.start("W", *WORKER_SPARK)
    info = wait_for(lambda: b.registration("W"), 60, "W's registration")
    assert info.session is not None and info.session.state is SessionState.STARTING, info
    # while its session starts: registered, not a member (no join request), and status says so
    starting_seen = 0
    while (
        (reg := b.registration("W")) is not None
        and reg.session is not None
        and reg.session.state is SessionState.STARTING
    ):
        assert not b.member("W"), "W joined its group before its session was ready"
        starting_seen += 1
        time.sleep(0.25)
    assert starting_seen > 0
    reg = wait_for(
        lambda: (r := b.registration("W")) and r.session and r.session.state is SessionState.READY and r,
        180,
        "W's session ready",
    )
    assert reg.session is not None and reg.session.startup_s is not None and reg.session.startup_s > 0
    wait_for(lambda: b.member("W"), 30, "W's join request")
    view = next(v for v in AdminClient(b.zk, b.layout).status().brokers if v.broker_id == "W")
    assert view.session is not None and view.session["state"] == "ready", view

    # a pipeline with a backlog: 6 files, one read per trigger
    src, out = b.workdir / "in", b.workdir / "out"
    generate(DatagenConfig(out_dir=str(src), records=600, batch=100))
    spec = files_task("p1", src, out, "SELECT id, key FROM input", max_files=1, trigger={"processing_time": "1 second"})
    created = time.monotonic()
    AdminClient(b.zk, b.layout).create_tasks([parse_spec(spec)])
    first = wait_for(
        lambda: (s := b.status("p1")) and s.state == "RUNNING" and s.metrics.get("batches") and s,
        90,
        "p1's first batch",
    )
    took = time.monotonic() - created
    print(f"\ncreate -> RUNNING (first batch committed) on a warm broker: {took:.1f}s")
    assert first.broker == "W"
    backlogs = [first.metrics.get("backlog_files")]

    def drained() -> bool:
        st = b.status("p1")
        if st is not None:
            backlogs.append(st.metrics.get("backlog_files"))
        return st is not None and st.metrics.get("rows") == 600 and st.metrics.get("backlog_files") == 0

    wait_for(drained, 120, "p1 to read every file")
    assert any(isinstance(n, int) and n > 0 for n in backlogs), backlogs  # it had files left to read, and said so
    st = b.status("p1")
    assert st is not None and len(st.metrics["rate_history"]) >= 2, st.metrics
    listing = subprocess.run(
        [sys.executable, "-m", "cli.main", "task", "list"],
        cwd=REPO,
        env=b.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    row = next(line for line in listing.stdout.splitlines() if line.startswith("p1 "))
    assert "/s" in row and "0 files" in row, listing.stdout


def test_a_lazy_broker_joins_at_once_and_an_unreachable_master_fails_the_start(brokers: Brokers) -> None:
    b = brokers
    b.start("L", "--lazy-session", *WORKER_SPARK)
    wait_for(lambda: b.member("L"), 60, "L's join request")
    reg = b.registration("L")
    assert reg is not None and reg.session is not None and reg.session.state is SessionState.LAZY, reg
    port = free_port()  # nobody listens there
    proc = b.start("M", "--spark-master", f"spark://127.0.0.1:{port}")
    assert proc.wait(60) == 1, b.log("M")
    assert f"cannot reach the Spark master spark://127.0.0.1:{port}" in b.log("M"), b.log("M")
    assert not b.member("M")
