"""Broker processes a test starts, as real processes: ``zkctl broker run`` with its output in a file, or a
journaling chaos broker (``python -m broker_sim.chaos broker``) whose stdout and stderr are one small pipe; each
one's exit noticed within 10 ms by a named thread, and stopped by its pid. Also: who owns which task, as
ZooKeeper says, and ``controller``, a fixture of an active controller in the test process (import it)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, task_records
from controller.zk.client import ZkSettings
from tests.cli_support import ZKCTL, until


class BrokerProcess:
    """A broker process we started; ``exited_at`` is the wall time its exit was noticed (None: still running)."""

    def __init__(self, proc: subprocess.Popen[bytes], bid: str) -> None:
        self.proc = proc
        self.exited_at: float | None = None
        self._thread = threading.Thread(target=self._watch, name=f"watch-{bid}", daemon=True)
        self._thread.start()

    @classmethod
    def zkctl(cls, env: dict[str, str], zk: str, bid: str, *args: str, log: Path) -> BrokerProcess:
        """``zkctl broker run`` on the no-op runner (``args`` added), its output in ``log``."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [ZKCTL, "--zk", zk, "broker", "run", "--id", bid, "--runner", "noop", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return cls(proc, bid)

    @classmethod
    def piped_chaos_broker(cls, env: dict[str, str], zk: str, root: str, bid: str, journal: Path) -> BrokerProcess:
        """A journaling chaos broker whose stdout and stderr are one pipe (4 KiB: quick to fill) that nobody
        reads unless the test does."""
        cmd = [sys.executable, "-m", "broker_sim.chaos", "broker", "--id", bid, "--zk", zk, "--root", root]
        cmd += ["--session-timeout", "6", "--journal", str(journal)]
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: quick to fill
        return cls(proc, bid)

    def _watch(self) -> None:
        deadline = time.monotonic() + 300
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.proc.poll() is not None:
            self.exited_at = time.time()

    def stop(self) -> None:
        """SIGKILL by its pid if it still runs; its pipe (if any) closed."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def owners(zk: KazooClient, layout: ZkLayout, tasks: Iterable[str]) -> dict[str, tuple[str, int, float]]:
    """task -> (broker, session, ctime in seconds) of its owner znode, for the tasks that have one."""
    out = {}
    for t in tasks:
        try:
            data, stat = zk.get(layout.task_owner(t))
        except Exception:
            continue
        out[t] = (codecs.decode(task_records.OwnerInfo, data).broker, stat.ephemeralOwner, stat.ctime / 1000.0)
    return out


def first_owner_after(zk: KazooClient, layout: ZkLayout, tasks: list[str], broker: str, timeout: float) -> float:
    """Wait until every task is owned by ``broker``; return the earliest creation time of those owner znodes."""
    until(
        lambda: (
            {o[0] for o in owners(zk, layout, tasks).values()} == {broker}
            and len(owners(zk, layout, tasks)) == len(tasks)
        ),
        timeout,
        f"all tasks owned by {broker}",
    )
    return min(o[2] for o in owners(zk, layout, tasks).values())


@pytest.fixture
def controller(zk: KazooClient, zk_settings: ZkSettings, layout: ZkLayout) -> Iterator[Controller]:
    """An active controller in the test process on the test's root (rebalance timeout 4 s), stopped after."""
    c = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=4.0))).start()
    try:
        assert c.wait_active(15)
        yield c
    finally:
        c.stop()
