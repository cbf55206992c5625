"""A broker process whose output pipe is full (its parent stopped reading): a log line then blocks the thread
that writes it, and every thread of the fence logs before it acts (the probe's "no answer, fencing", the
fence's "stopping N tasks", the watchdog's "HALTING"). Cut off from ZooKeeper in that state, such a broker
stopped nothing and never halted, so its tasks ran on past its session while another broker took them: the
theory behind the overlap that a test's group formation once showed, its brokers logging to a pipe nobody
read (docs/reliability.md). Broker logging now goes through a bounded queue and a writer thread of its own,
so a blocked output stalls the writer only."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker_sim.chaos.processes import read_journal
from broker_sim.sim.netproxy import NetProxy
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol import codecs
from controller.protocol.group import GroupConfig
from controller.protocol.taskspec import NoopPipeline, TaskSpec
from tests.cli_support import until


@pytest.fixture
def controller(zk, zk_settings, layout):
    c = Controller(ControllerConfig("ctl", zk_settings, GroupConfig(rebalance_timeout_s=4.0))).start()
    try:
        assert c.wait_active(15)
        yield c
    finally:
        c.stop()


class _PipedBroker:
    """A journaling broker process (``python -m broker_sim.chaos broker``) whose stdout and stderr are one
    pipe that nobody reads; its exit is noticed within 10 ms by a named thread."""

    def __init__(self, env: dict[str, str], zk: str, root: str, bid: str, journal: Path) -> None:
        cmd = [sys.executable, "-m", "broker_sim.chaos", "broker", "--id", bid, "--zk", zk, "--root", root]
        cmd += ["--session-timeout", "6", "--journal", str(journal)]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        assert self.proc.stdout is not None
        fcntl.fcntl(self.proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: quick to fill
        self.exited_at: float | None = None
        self._thread = threading.Thread(target=self._watch, name=f"watch-{bid}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + 300
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.proc.poll() is not None:
            self.exited_at = time.time()

    def fill_pipe(self) -> int:
        """Fill the pipe to the brim through the process's own write end (/proc/PID/fd/2): its next write
        blocks. Returns the bytes written."""
        fd = os.open(f"/proc/{self.proc.pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
        written = 0
        try:
            for _ in range(10_000):  # bounded: a 4 KiB pipe (or 1 MiB at most) fills long before
                try:
                    written += os.write(fd, b"x" * 512)
                except BlockingIOError:
                    break
        finally:
            os.close(fd)
        return written

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _owner_ctimes(zk, layout, tasks):
    """task -> (broker, ctime in seconds) of its owner znode, for the tasks that have one."""
    out = {}
    for t in tasks:
        try:
            data, stat = zk.get(layout.task_owner(t))
        except Exception:
            continue
        out[t] = (codecs.decode(codecs.OwnerInfo, data).broker, stat.ctime / 1000.0)
    return out


def test_a_broker_blocked_on_a_full_output_pipe_stops_its_tasks_before_they_move(
    controller, zk, zk_hosts, zk_root, layout, cli_env, tmp_path
):
    tasks = [f"p{i}" for i in range(4)]
    AdminClient(zk, layout).create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
    host, port = zk_hosts.split(",")[0].rsplit(":", 1)
    proxy = NetProxy(host, int(port), name="proxy-piped")
    journal = tmp_path / "piped.journal"
    piped = other = None
    try:
        piped = _PipedBroker(cli_env, proxy.address, zk_root, "piped", journal)
        until(lambda: len(_owner_ctimes(zk, layout, tasks)) == 4, 30, "the piped broker to own every task")
        assert piped.fill_pipe() > 0
        proxy.partition()
        cut = time.time()
        other = _PipedBroker(cli_env, zk_hosts, zk_root, "other", tmp_path / "other.journal")
        threading.Thread(target=other.proc.stdout.read, name="drain-other", daemon=True).start()  # read: never full
        until(
            lambda: (
                {o[0] for o in _owner_ctimes(zk, layout, tasks).values()} == {"other"}
                and len(_owner_ctimes(zk, layout, tasks)) == 4
            ),
            60,
            "every task owned by the other broker",
        )
        taken = min(o[1] for o in _owner_ctimes(zk, layout, tasks).values())
        runs = read_journal(journal, "piped", piped.exited_at)
        assert {r.task_id for r in runs} == set(tasks), runs
        late = [
            (r.task_id, None if r.end is None else round(r.end - taken, 3))
            for r in runs
            if r.end is None or r.end >= taken
        ]
        # every run of the blocked broker ended (its stop journaled, or the process halted) before the first of
        # its tasks had a new owner, and before its session could expire
        assert not late, f"still running when the first task moved {taken - cut:.2f}s after the cut: {late}"
        assert max(r.end for r in runs if r.end is not None) - cut < 6.0
    finally:
        for b in (piped, other):
            if b is not None:
                b.stop()
        proxy.heal()
        proxy.close()
