"""Spark in HA under the pipelines, for real: two Spark masters in ZooKeeper recovery mode on a ZooKeeper of
the test's own (their state under the cluster's root), one Spark worker with one core, and a broker process
running two streaming file pipelines against ``spark://m1,m2``. While a generator feeds them, (a) the active
master is killed -9: the standby becomes ALIVE and the pipelines go on committing batches; (b) the worker is
killed -9 (its executor with it): the pipelines stay on their broker, whose status says they wait for the
engine, and once the worker is started again (as a supervisor would) they recover; (c) on two brokers and two
workers, the active master, the worker running the surviving broker's executor and the other broker are killed
-9 at once: the dead broker's pipeline moves, both get the last worker's core, and go on. Every sink holds every
record exactly once, no pipeline ever ran on two brokers at once, and each pipeline's longest gap without a
committed batch is printed (and bounded). The cases share one ZooKeeper, controller and Spark cluster
(``ha_cluster``); each starts its own brokers and pipelines.

The ZooKeeper server caps sessions at 10 s: Spark's masters ask for 60 s, and a master killed outright hands
over only when its session expires (docs/spark-ha.md). The masters' worker timeout is 20 s: a new leader
waits that long for the workers and applications it recovered before it drops the dead ones and gives their
cores to the live applications (Spark's 60 s would hold the pipelines of (c) that long). Input is fed at the
start and again at each fault, so batches follow each recovery however long the loaded machine takes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from kazoo.exceptions import NoNodeError

from broker_sim.chaos.sinks import pipeline_spec, sink_ids
from broker_sim.deploy.spark_ha import SparkHA, SparkHASpec
from broker_sim.runners.spark_jobs import ENGINE_WAITING
from broker_sim.sim.checker import double_ownership
from broker_sim.sim.datagen import Datagen, DatagenConfig
from controller.admin import AdminClient
from controller.protocol.records import codecs, task_records
from controller.zk.server import ZooKeeperServer, free_port
from tests.spark_brokers import Root, controlled_root, start_spark_broker, stop_brokers
from tests.spark_support import TEST_JVM_OPTS, require_spark, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: records per pipeline fed at the start (until the first batches), then at each fault (~40 s at 7.5 a second):
#: input keeps coming after each fault, whenever the fault happens on a loaded machine
FIRST, AT_FAULT = 150, 300
PIPELINES = ("ha-0", "ha-1")
PIPELINES_C = ("hc-0", "hc-1")
SESSION_CAP_MS = 10_000
#: a new leader drops the dead worker and the dead broker's application after this (Spark's default: 60 s)
WORKER_TIMEOUT_S = 20
#: a pipeline's longest time without a committed batch while input waits: a master's failover (its session
#: cap, then the standby's recovery) or a worker's restart (a JVM and an executor), with room for a loaded host
GAP_BOUND_S = 120.0


def _commits(sink: Path) -> list[tuple[int, float]]:
    """(batch, when committed) of each batch in a file sink's commit log (each batch writes one log file)."""
    log_dir = sink / "_spark_metadata"
    out = []
    for f in log_dir.iterdir() if log_dir.is_dir() else []:
        name = f.name.removesuffix(".compact")
        if name.isdigit():
            out.append((int(name), f.stat().st_mtime))
    return sorted(out)


def _status(root: Root, task: str) -> task_records.TaskStatus | None:
    try:
        data, _ = root.zk.get(root.layout.status(task))
    except NoNodeError:
        return None
    return codecs.decode(task_records.TaskStatus, data, root.layout.status(task))


def _waits_for_engine(root: Root, task: str, broker: str = "b1") -> bool:
    """The task's status: RUNNING on its broker, saying it waits for the engine (no executor)."""
    st = _status(root, task)
    return (
        st is not None
        and st.state == "RUNNING"
        and st.broker == broker
        and (st.metrics or {}).get("engine") == ENGINE_WAITING
    )


def _running_on(root: Root, task: str) -> str | None:
    st = _status(root, task)
    return st.broker if st is not None and st.state == "RUNNING" else None


def _longest_gap(commits: list[tuple[int, float]], since: float, until: float) -> float:
    """The longest stretch in [since, until] with no batch committed."""
    times = [since] + [t for _, t in commits if since < t < until] + [until]
    return max(b - a for a, b in zip(times, times[1:]))


def _spark_args(url: str, app: str) -> tuple[str, ...]:
    """A broker's Spark settings: the HA master URL, one core and small JVMs, its application named ``app``."""
    conf = [
        "spark.cores.max=1",
        "spark.executor.memory=512m",
        "spark.driver.memory=512m",
        "spark.driver.host=127.0.0.1",
        f"spark.app.name={app}",
        f"spark.executor.extraJavaOptions={TEST_JVM_OPTS}",
        f"spark.driver.extraJavaOptions={TEST_JVM_OPTS}",
    ]
    return ("--spark-master", url, *(a for c in conf for a in ("--spark-conf", c)))


@dataclass(frozen=True)
class HACluster:
    """The cases' shared cluster: a ZooKeeper capping sessions, a root with its controller, Spark in HA."""

    zk: ZooKeeperServer
    root: Root
    ha: SparkHA
    dir: Path


@pytest.fixture(scope="module")
def ha_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HACluster]:
    require_spark()
    tmp = tmp_path_factory.mktemp("sparkha")
    zk = ZooKeeperServer(data_dir=tmp / "zk", port=free_port(), tick_ms=200, max_session_timeout_ms=SESSION_CAP_MS)
    zk.start()
    try:
        with controlled_root(zk.address, tmp, "sparkha") as root:
            spec = SparkHASpec(
                zk.address,
                root.root,
                tmp / "spark",
                worker_memory="768m",
                java_opts=TEST_JVM_OPTS,
                worker_timeout_s=WORKER_TIMEOUT_S,
            )
            with SparkHA(spec) as ha:
                yield HACluster(zk, root, ha, tmp)
    finally:
        zk.stop()


class Feed:
    """Input for every pipeline, in segments of consecutive ids at 7.5 records a second (each a generator
    thread); ``total`` ids written so far, 0 to total - 1."""

    def __init__(self, pipes: dict[str, tuple[Path, Path]]) -> None:
        self.pipes, self.total, self.gens = pipes, 0, list[Datagen]()
        for src, _ in pipes.values():
            src.mkdir(parents=True)

    def more(self, records: int) -> None:
        for src, _ in self.pipes.values():
            cfg = DatagenConfig(out_dir=str(src), records=records, rate=7.5, batch=15, start_id=self.total)
            self.gens.append(Datagen(cfg).start())
        self.total += records

    def join(self) -> None:
        for g in self.gens:
            g.join(300)

    def stop(self) -> None:
        for g in self.gens:
            g.stop()

    def all_in_sinks(self) -> bool:
        return all(len(set(sink_ids(out))) >= self.total for _, out in self.pipes.values())

    def check_sinks(self) -> None:
        for t, (_, out) in self.pipes.items():
            ids = sink_ids(out)
            assert len(ids) == len(set(ids)), f"{t}: {len(ids) - len(set(ids))} records written twice"
            assert set(ids) == set(range(self.total)), f"{t}: {self.total - len(set(ids))} records missing"


def test_pipelines_ride_out_a_master_failover_and_a_worker_loss_exactly_once(ha_cluster: HACluster) -> None:
    root, ha, tmp = ha_cluster.root, ha_cluster.ha, ha_cluster.dir / "ab"
    tmp.mkdir()
    brokers = []
    pipes = {t: (tmp / "in" / t, tmp / "out" / t) for t in PIPELINES}
    feed = Feed(pipes)
    figures: dict[str, float] = {}
    try:
        assert sorted(str(ha.status(m)) for m in ha.masters) == ["ALIVE", "STANDBY"]
        assert root.zk.exists(f"{root.root}/spark"), "the masters keep their state under the cluster's root"
        assert len(ha.workers) == 1, "one worker: its loss leaves the pipelines waiting for the engine"
        brokers.append(start_spark_broker("b1", root.env, tmp, tmp / "b1.log", *_spark_args(ha.url, "zkc-b1")))
        admin = AdminClient(root.zk, root.layout)
        admin.create_tasks([pipeline_spec(t, *p) for t, p in pipes.items()])
        feed.more(FIRST)
        sinks = [out for _, out in pipes.values()]

        def committed_after(t0: float) -> bool:
            return all(any(t > t0 for _, t in _commits(s)) for s in sinks)

        start = time.time()
        wait_for(lambda: committed_after(start), 300, "a committed batch of each pipeline on the cluster")
        phase0 = time.time()

        # (a) the active master killed outright: the standby takes over, the pipelines go on
        active = ha.active()
        assert active is not None
        t_kill = time.time()
        ha.kill(active)
        feed.more(AT_FAULT)
        standby = wait_for(ha.active, 120, "the standby master to become ALIVE")
        t_alive = time.time()
        figures["failover_s"] = t_alive - t_kill
        assert standby is not active
        wait_for(lambda: committed_after(t_alive), 180, "batches committed after the failover")
        figures["commits_after_failover_s"] = time.time() - t_kill

        # (b) the worker killed outright (its executor with it), then started again as a supervisor would
        (worker,) = ha.workers
        t_loss = time.time()
        ha.kill(worker)
        feed.more(AT_FAULT)
        # the pipelines stay on their broker, which says they wait for the engine
        wait_for(lambda: all(_waits_for_engine(root, t) for t in PIPELINES), 120, "statuses waiting for Spark")
        t_waiting = time.time()  # no executor: a batch committed after this ran on the restarted worker
        figures["status_waiting_s"] = t_waiting - t_loss
        ha.start_worker(worker)
        wait_for(lambda: ha.alive_workers() >= 1, 120, "the worker to register again")
        wait_for(lambda: committed_after(t_waiting), 240, "batches committed after the worker's loss")
        figures["commits_after_worker_loss_s"] = time.time() - t_loss
        wait_for(lambda: not any(_waits_for_engine(root, t) for t in PIPELINES), 60, "statuses running again")

        feed.join()
        wait_for(feed.all_in_sinks, 300, "every record in the sinks")
        phase1 = time.time()
        intervals = admin.intervals()
        gaps = {t: _longest_gap(_commits(out), phase0, phase1) for t, (_, out) in pipes.items()}
        for t in PIPELINES:  # the next case's brokers are not to run these again
            admin.delete_task(t, wait=60)
    finally:
        feed.stop()
        stop_brokers(brokers)
    print(
        f"master failover {figures['failover_s']:.1f}s, commits again {figures['commits_after_failover_s']:.1f}s "
        f"after the kill; after the worker's loss: statuses waiting for the engine {figures['status_waiting_s']:.1f}s, "
        f"commits again {figures['commits_after_worker_loss_s']:.1f}s; longest gap "
        + ", ".join(f"{t} {g:.1f}s" for t, g in gaps.items())
    )
    feed.check_sinks()
    assert double_ownership(intervals) == []
    assert all(g <= GAP_BOUND_S for g in gaps.values()), gaps


def _first_times(conds: dict[str, Callable[[], object]], since: float, timeout: float) -> dict[str, float]:
    """Seconds from ``since`` until each condition first held, all polled together (one may come before
    another); fails naming those that never held within ``timeout``."""
    out: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(out) < len(conds):
        for name, cond in conds.items():
            if name not in out and cond():
                out[name] = time.time() - since
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {sorted(set(conds) - set(out))}")
        time.sleep(0.25)
    return out


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 of a broker's whole group (its Spark driver with it), no SIGTERM: no controlled shutdown."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def test_master_worker_and_broker_killed_at_once_exactly_once(ha_cluster: HACluster) -> None:
    root, ha, tmp = ha_cluster.root, ha_cluster.ha, ha_cluster.dir / "c"
    tmp.mkdir()
    # what an earlier case killed is back, as a supervisor would have it; a second worker with one core, so a
    # pipeline has somewhere to go when a worker is lost
    for m in ha.masters:
        if not m.alive():
            ha.start_master(m)
    wait_for(lambda: sorted(str(ha.status(m)) for m in ha.masters) == ["ALIVE", "STANDBY"], 180, "ALIVE + STANDBY")
    for w in ha.workers:
        if not w.alive():
            ha.start_worker(w)
    while len(ha.workers) < 2:
        ha.add_worker()
    wait_for(lambda: ha.alive_workers() >= 2, 180, "two workers registered")
    names = ("b2", "b3")
    brokers = {
        b: start_spark_broker(b, root.env, tmp, tmp / f"{b}.log", *_spark_args(ha.url, f"zkc-{b}")) for b in names
    }
    pipes = {t: (tmp / "in" / t, tmp / "out" / t) for t in PIPELINES_C}
    feed = Feed(pipes)
    figures: dict[str, float] = {}
    try:
        admin = AdminClient(root.zk, root.layout)
        admin.create_tasks([pipeline_spec(t, *p) for t, p in pipes.items()])
        feed.more(FIRST)
        sinks = {t: out for t, (_, out) in pipes.items()}

        def committed_after(t0: float) -> bool:
            return all(any(t > t0 for _, t in _commits(s)) for s in sinks.values())

        start = time.time()
        wait_for(lambda: committed_after(start), 300, "a committed batch of each pipeline on the cluster")
        wait_for(lambda: {_running_on(root, t) for t in PIPELINES_C} == set(names), 120, "a pipeline on each broker")
        phase0 = time.time()
        victim = str(_running_on(root, PIPELINES_C[0]))
        survivor = next(b for b in names if b != victim)
        apps = {name: app for app, name in ha.apps().items()}
        assert f"zkc-{victim}" in apps and f"zkc-{survivor}" in apps, apps
        # the worker running the surviving broker's executor: both pipelines must then get the other one's core
        worker = wait_for(
            lambda: next((w for w in ha.workers if apps[f"zkc-{survivor}"] in ha.executor_apps(w)), None),
            120,
            f"the worker running {survivor}'s executor",
        )
        active = ha.active()
        assert active is not None

        # (c) at once: the active master, that worker, the other broker (its driver with it), all kill -9
        t_kill = time.time()
        ha.kill(active)
        ha.kill(worker)
        _kill9(brokers[victim])
        t_dead = time.time()  # the victim and its Spark driver are gone: nothing of it runs after this
        feed.more(AT_FAULT)
        figures.update(
            _first_times(
                {
                    "failover_s": ha.active,  # the standby ALIVE
                    "moved_s": lambda: _running_on(root, PIPELINES_C[0]) == survivor,
                },
                t_kill,
                120,
            )
        )
        t_moved = time.time()  # a batch of either committed after this ran on the survivor, on the last worker
        wait_for(lambda: committed_after(t_moved), 300, "batches committed after the faults")
        figures["commits_again_s"] = time.time() - t_kill

        feed.join()
        wait_for(feed.all_in_sinks, 300, "every record in the sinks")
        phase1 = time.time()
        # a killed broker never closes its runs: they ended when it died (its driver, the only committer, with it)
        intervals = [
            replace(i, end=t_dead) if i.broker == victim and i.end is None and i.released is None else i
            for i in admin.intervals()
        ]
        gaps = {t: _longest_gap(_commits(out), phase0, phase1) for t, out in sinks.items()}
    finally:
        feed.stop()
        stop_brokers(brokers.values())
    print(
        f"master + worker + broker {victim} killed at once: standby ALIVE {figures['failover_s']:.1f}s, "
        f"{PIPELINES_C[0]} running on {survivor} {figures['moved_s']:.1f}s, both committing again "
        f"{figures['commits_again_s']:.1f}s after the kill; longest gap without a committed batch "
        + ", ".join(f"{t} {g:.1f}s" for t, g in gaps.items())
    )
    feed.check_sinks()
    assert double_ownership(intervals) == []
    assert all(g <= GAP_BOUND_S for g in gaps.values()), gaps
