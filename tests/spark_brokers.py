"""Spark broker *processes* for the end-to-end tests: a fresh root with a controller in the test process
(``controlled_root``), a broker started as ``python -m cli.main broker run --runner spark`` in a process group
of its own (``start_spark_broker``), and every broker stopped by its id (``stop_brokers``: SIGTERM, a shared
grace, then SIGKILL of its whole group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from broker_sim.runners.procs import stop_process
from broker_sim.runners.spark import DEFAULT_STOP_BUDGET_S
from controller.admin import ensure_layout
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.subtrees import delete_tree
from tests.spark_support import REPO, TEST_JVM_OPTS

SESSION_S = 2 * DEFAULT_STOP_BUDGET_S  # what the spark runner asks for (broker_sim.worker.fence_margin)
WORKER_SPARK = [
    "--spark-master",
    "local[1]",
    "--spark-conf",
    "spark.driver.memory=512m",
    "--spark-conf",
    "spark.sql.shuffle.partitions=1",
    "--spark-conf",
    f"spark.driver.extraJavaOptions={TEST_JVM_OPTS}",
]


@dataclass(frozen=True)
class Root:
    """A fresh root on the test ZooKeeper: its settings, a client, and the environment its brokers run with."""

    root: str
    settings: ZkSettings
    env: dict[str, str]
    zk: KazooClient

    @property
    def layout(self) -> ZkLayout:
        return ZkLayout(self.root)


@contextmanager
def controlled_root(zk_hosts: str, workdir: Path, prefix: str, **group: Any) -> Iterator[Root]:
    """A root ``/<prefix>-<random>`` laid out, with a controller in this process (rebalance timeout 20 s, and
    ``group``'s other ``GroupConfig`` settings); afterwards the controller stopped, the root deleted and the
    client closed (stop the brokers first)."""
    from controller.daemon import Controller, ControllerConfig
    from controller.protocol.group.vocabulary import GroupConfig

    root = f"/{prefix}-{uuid.uuid4().hex[:12]}"
    settings = ZkSettings(hosts=zk_hosts, root=root, session_timeout_s=SESSION_S)
    env = {
        **os.environ,
        "ZKC_ZK": zk_hosts,
        "ZKC_ROOT": root,
        "ZKC_STATE_DIR": str(workdir / "state"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO),
    }
    zk = make_client(settings)
    ensure_layout(zk, ZkLayout(root))
    ctl = Controller(ControllerConfig("ctl", settings, GroupConfig(**{"rebalance_timeout_s": 20, **group}))).start()
    try:
        yield Root(root, settings, env, zk)
    finally:
        ctl.stop()
        try:
            delete_tree(zk, root)
        except Exception:
            pass
        zk.stop()
        zk.close()


def start_spark_broker(
    bid: str, env: dict[str, str], workdir: Path, log_path: Path, *args: str
) -> subprocess.Popen[bytes]:
    """A broker process on the spark runner (``args`` added), its checkpoints under ``workdir``, its output
    appended to ``log_path``, in a process group of its own (its Spark JVM with it)."""
    cmd = [sys.executable, "-m", "cli.main", "broker", "run", "--id", bid, "--runner", "spark"]
    cmd += ["--session-timeout", str(SESSION_S), "--checkpoint-root", str(workdir / "checkpoints"), *args]
    with open(log_path, "ab") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def stop_brokers(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    """SIGTERM (controlled shutdown) to every live broker at once, then each is waited for by its id and
    SIGKILLed (its whole group) if it is still there after the grace."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            stop_process(p, grace_s=max(0.5, deadline - time.monotonic()), timeout_s=40)
        except TimeoutError:
            pass
