"""Spark in HA under the pipelines, for real: two Spark masters in ZooKeeper recovery mode on a ZooKeeper of
the test's own (their state under the cluster's root), one Spark worker with one core, and a broker process
running two streaming file pipelines against ``spark://m1,m2``. While a generator feeds them, (a) the active
master is killed -9: the standby becomes ALIVE and the pipelines go on committing batches; (b) the worker is
killed -9 (its executor with it): the pipelines stay on their broker, whose status says they wait for the
engine, and once the worker is started again (as a supervisor would) they recover. Every sink
holds every record exactly once, no pipeline ever ran on two brokers at once, and each pipeline's longest gap
without a committed batch is printed (and bounded).

The ZooKeeper server caps sessions at 10 s: Spark's masters ask for 60 s, and a master killed outright hands
over only when its session expires (docs/spark-ha.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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

RECORDS = 900
PIPELINES = ("ha-0", "ha-1")
SESSION_CAP_MS = 10_000
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


def _waits_for_engine(root: Root, task: str) -> bool:
    """The task's status: RUNNING on its broker b1, saying it waits for the engine (no executor)."""
    data, _ = root.zk.get(root.layout.status(task))
    st = codecs.decode(task_records.TaskStatus, data, root.layout.status(task))
    return st.state == "RUNNING" and st.broker == "b1" and (st.metrics or {}).get("engine") == ENGINE_WAITING


def _longest_gap(commits: list[tuple[int, float]], since: float, until: float) -> float:
    """The longest stretch in [since, until] with no batch committed."""
    times = [since] + [t for _, t in commits if since < t < until] + [until]
    return max(b - a for a, b in zip(times, times[1:]))


def test_pipelines_ride_out_a_master_failover_and_a_worker_loss_exactly_once(tmp_path: Path) -> None:
    require_spark()
    zk = ZooKeeperServer(data_dir=tmp_path / "zk", port=free_port(), tick_ms=200, max_session_timeout_ms=SESSION_CAP_MS)
    zk.start()
    brokers = []
    gens: list[Datagen] = []
    figures: dict[str, float] = {}
    try:
        with controlled_root(zk.address, tmp_path, "sparkha") as root:
            spec = SparkHASpec(zk.address, root.root, tmp_path / "spark", worker_memory="768m", java_opts=TEST_JVM_OPTS)
            with SparkHA(spec) as ha:
                assert sorted(str(ha.status(m)) for m in ha.masters) == ["ALIVE", "STANDBY"]
                assert root.zk.exists(f"{root.root}/spark"), "the masters keep their state under the cluster's root"
                brokers.append(
                    start_spark_broker(
                        "b1",
                        root.env,
                        tmp_path,
                        tmp_path / "b1.log",
                        "--spark-master",
                        ha.url,
                        *("--spark-conf", "spark.cores.max=1", "--spark-conf", "spark.executor.memory=512m"),
                        *("--spark-conf", "spark.driver.memory=512m", "--spark-conf", "spark.driver.host=127.0.0.1"),
                        *("--spark-conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTS}"),
                        *("--spark-conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTS}"),
                    )
                )
                pipes = {t: (tmp_path / "in" / t, tmp_path / "out" / t) for t in PIPELINES}
                for src, _ in pipes.values():
                    src.mkdir(parents=True)
                AdminClient(root.zk, root.layout).create_tasks([pipeline_spec(t, *p) for t, p in pipes.items()])
                # ~120 s of input: it keeps coming through both faults
                gens = [
                    Datagen(DatagenConfig(out_dir=str(src), records=RECORDS, rate=7.5, batch=15))
                    for src, _ in pipes.values()
                ]
                for g in gens:
                    g.start()
                sinks = [out for _, out in pipes.values()]

                def committed_after(t0: float) -> bool:
                    return all(any(t > t0 for _, t in _commits(s)) for s in sinks)

                start = time.time()
                wait_for(lambda: committed_after(start), 300, "a committed batch of each pipeline on the cluster")
                phase0 = time.time()

                # (a) the active master killed outright: the standby takes over, the pipelines go on
                active = ha.active()
                assert active is not None
                ha.kill(active)
                t_kill = time.time()
                standby = wait_for(ha.active, 120, "the standby master to become ALIVE")
                t_alive = time.time()
                figures["failover_s"] = t_alive - t_kill
                assert standby is not active
                wait_for(lambda: committed_after(t_alive), 180, "batches committed after the failover")
                figures["commits_after_failover_s"] = time.time() - t_kill

                # (b) the worker killed outright (its executor with it), then started again as a supervisor would
                (worker,) = ha.workers
                ha.kill(worker)
                t_loss = time.time()
                # the pipelines stay on their broker, which says they wait for the engine
                wait_for(lambda: all(_waits_for_engine(root, t) for t in PIPELINES), 120, "statuses waiting for Spark")
                figures["status_waiting_s"] = time.time() - t_loss
                ha.start_worker(worker)
                wait_for(lambda: ha.alive_workers() >= 1, 120, "the worker to register again")
                wait_for(lambda: committed_after(time.time() - 0.5), 240, "batches committed after the worker's loss")
                figures["commits_after_worker_loss_s"] = time.time() - t_loss
                wait_for(lambda: not any(_waits_for_engine(root, t) for t in PIPELINES), 60, "statuses running again")

                for g in gens:
                    g.join(300)
                wait_for(lambda: all(len(set(sink_ids(s))) >= RECORDS for s in sinks), 300, "every record in the sinks")
                phase1 = time.time()
                intervals = AdminClient(root.zk, root.layout).intervals()
                gaps = {t: _longest_gap(_commits(out), phase0, phase1) for t, (_, out) in pipes.items()}
            stop_brokers(brokers)
            brokers = []
    finally:
        for g in gens:
            g.stop()
        stop_brokers(brokers)
        zk.stop()
    print(
        f"master failover {figures['failover_s']:.1f}s, commits again {figures['commits_after_failover_s']:.1f}s "
        f"after the kill; after the worker's loss: statuses waiting for the engine {figures['status_waiting_s']:.1f}s, "
        f"commits again {figures['commits_after_worker_loss_s']:.1f}s; longest gap "
        + ", ".join(f"{t} {g:.1f}s" for t, g in gaps.items())
    )
    for t, (_, out) in pipes.items():
        ids = sink_ids(out)
        assert len(ids) == len(set(ids)), f"{t}: {len(ids) - len(set(ids))} records written twice"
        assert set(ids) == set(range(RECORDS)), f"{t}: {RECORDS - len(set(ids))} records missing"
    assert double_ownership(intervals) == []
    assert all(g <= GAP_BOUND_S for g in gaps.values()), gaps
