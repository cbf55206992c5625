"""A broker process whose output pipe is full (its parent stopped reading): a log line then blocks the thread
that writes it, and every thread of the fence logs before it acts (the probe's "no answer, fencing", the
fence's "stopping N tasks", the watchdog's "HALTING"). Cut off from ZooKeeper in that state, such a broker
stopped nothing and never halted, so its tasks ran on past its session while another broker took them: the
theory behind the overlap that a test's group formation once showed, its brokers logging to a pipe nobody
read (docs/reliability.md). Broker logging now goes through a bounded queue and a writer thread of its own,
so a blocked output stalls the writer only."""

from __future__ import annotations

import os
import threading
import time

from broker_sim.chaos.processes import read_journal
from broker_sim.sim.netproxy import NetProxy
from controller.admin import AdminClient
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from tests.broker_processes import BrokerProcess, owners
from tests.cli_support import until


def fill_pipe(broker: BrokerProcess) -> int:
    """Fill a piped broker's pipe to the brim through the process's own write end (/proc/PID/fd/2): its next
    write blocks. Returns the bytes written."""
    fd = os.open(f"/proc/{broker.proc.pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
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
        piped = BrokerProcess.piped_chaos_broker(cli_env, proxy.address, zk_root, "piped", journal)
        until(lambda: len(owners(zk, layout, tasks)) == 4, 30, "the piped broker to own every task")
        assert fill_pipe(piped) > 0
        proxy.partition()
        cut = time.time()
        other = BrokerProcess.piped_chaos_broker(cli_env, zk_hosts, zk_root, "other", tmp_path / "other.journal")
        threading.Thread(target=other.proc.stdout.read, name="drain-other", daemon=True).start()  # read: never full
        until(
            lambda: (
                {o[0] for o in owners(zk, layout, tasks).values()} == {"other"} and len(owners(zk, layout, tasks)) == 4
            ),
            60,
            "every task owned by the other broker",
        )
        taken = min(o[2] for o in owners(zk, layout, tasks).values())
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
