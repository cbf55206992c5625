"""Spark in HA as containers, for real: ``zkctl cluster up --spark-masters 2`` runs two Spark masters in
ZooKeeper recovery mode and a worker as containers of the image built from this tree, with the checkpoints on
a host directory every container mounts (standing for NFS). Where no Docker engine answers it is skipped with
the reason (``tests/e2e/test_docker.py`` says how CI starts one)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from broker_sim.chaos.sinks import pipeline_spec
from broker_sim.deploy.container_chaos import container_sink_ids, crash
from broker_sim.deploy.containers import ClusterInfo, spark_statuses
from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from tests.docker_support import zkctl_cluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(1500)  # up (two Spark masters, a worker), a first batch, a failover: JVMs on a loaded machine
def test_cluster_up_runs_spark_in_ha_with_the_checkpoints_on_shared_storage(image: str, tmp_path: Path) -> None:
    """``cluster up --spark-masters 2``: two Spark masters in ZooKeeper recovery mode and a worker as containers,
    a broker submitting to both, the checkpoints and sinks on a host directory every container mounts (standing
    for NFS). The active master's process is killed -9: the standby takes the lead and the pipeline, fed
    before and after, holds every record exactly once."""
    name = f"h{uuid.uuid4().hex[:6]}"
    data = tmp_path / "data"
    (data / "in" / "sp").mkdir(parents=True)
    for d in (data, data / "in", data / "in" / "sp"):
        d.chmod(0o777)  # written by the image's non-root user
    with zkctl_cluster(
        name,
        "/sparkd",
        *("--zk-nodes", "1", "--controllers", "1", "--brokers", "1", "--runner", "spark", "--spark-masters", "2"),
        *("--spark-workers", "1", "--data-dir", str(data), "--image", image),
        timeout=1000,
    ) as run:
        info = run.up
        assert info["spark_master"].startswith("spark://127.0.0.1:") and info["spark_master"].count(",") == 1
        masters = info["spark_uis"]

        def statuses() -> dict[str, str]:
            return spark_statuses(ClusterInfo(name, info["zk"], info["root"], spark_uis=masters))

        assert sorted(statuses().values()) == ["ALIVE", "STANDBY"], statuses()
        zk = make_client(ZkSettings(hosts=info["zk"], root="/sparkd"))
        try:
            assert zk.get_children("/sparkd/spark/master_status"), "the masters' state under the cluster's root"
            AdminClient(zk, ZkLayout("/sparkd")).create_tasks(
                [pipeline_spec("sp", Path("/data/checkpoints/in/sp"), Path("/data/checkpoints/out/sp"))]
            )
            generate(DatagenConfig(out_dir=str(data / "in" / "sp"), records=150, batch=50))
            wait_until(lambda: len(_sink(data)) >= 150, 400, "the first records in the sink")
            active = next(n for n, st in statuses().items() if st == "ALIVE")
            crash(run.client.containers.get(active))
            t_kill = time.monotonic()
            generate(DatagenConfig(out_dir=str(data / "in" / "sp"), records=150, start_id=150, batch=50))
            wait_until(lambda: statuses().get(next(n for n in masters if n != active)) == "ALIVE", 180, "failover")
            failover = time.monotonic() - t_kill
            wait_until(lambda: len(set(_sink(data))) >= 300, 300, "every record in the sink")
            ids = _sink(data)
            assert sorted(ids) == list(range(300)), f"{len(ids)} ids, {len(set(ids))} distinct"
            print(f"Spark in containers: standby ALIVE {failover:.1f}s after kill -9 of the active master")
        finally:
            zk.stop()
            zk.close()


def _sink(data: Path) -> list[int]:
    try:
        return container_sink_ids(data, "sp")
    except (OSError, ValueError):
        return []  # a file read while Spark writes it: read again
