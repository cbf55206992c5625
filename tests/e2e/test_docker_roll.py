"""A planned roll of Spark broker containers to a new image (``zkctl cluster upgrade``), for real. Its own unit
of the suite's scheduler, beside the other container files (tests/xdist_support.py): it is the longest of them.
Where no Docker engine answers it is skipped with the reason (``tests/e2e/test_docker.py`` says how CI starts
one)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from functools import partial

import pytest

from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, task_records
from controller.zk.client import ZkSettings, make_client
from tests.docker_support import (
    container_cluster,
    create_shared_pipelines,
    docker_engine,
    every_record_once,
    sink_ids,
    zkctl_command,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_cluster_upgrade_rolls_spark_brokers_to_a_new_image_exactly_once(image, tmp_path):
    """`zkctl cluster upgrade --image`: the controller's planned roll over three Spark broker containers,
    each replaced by a container of the new image when its turn comes; every record in each sink exactly
    once, no task ever run by two brokers at once, no more moves than tasks (``--in-place``: the first broker
    restarts in place, its tasks held for it) and what balancing a group that was not balanced yet adds."""
    from broker_sim.deploy import containers
    from broker_sim.sim.checker import double_ownership
    from controller.admin.interval_ends import settled_intervals

    client = docker_engine()
    name = f"r{uuid.uuid4().hex[:6]}"
    new_image = f"zkcontroller:roll-{name}"
    client.images.get(image).tag(new_image)
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o777)
    spec = containers.ClusterSpec(
        name=name, zk_nodes=1, controllers=1, brokers=3, runner="spark", image=image, root="/roll", data_dir=str(data)
    )
    replaced_logs = tmp_path / "replaced"

    def down() -> None:
        try:
            containers.down(name, volumes=True)
        finally:
            with contextlib.suppress(Exception):
                client.images.remove(new_image)

    with container_cluster(f"zkc.cluster={name}", partial(containers.up, spec, echo=lambda line: None), down) as run:
        run.logs_dir = replaced_logs
        info = run.up
        zk = make_client(ZkSettings(hosts=info.zk, root="/roll", session_timeout_s=30))
        try:
            run.admin = admin = AdminClient(zk, ZkLayout("/roll"))
            tasks = ["roll-1", "roll-2"]
            records = 600
            create_shared_pipelines(admin, data, tasks)
            for t in tasks:
                generate(DatagenConfig(out_dir=str(data / "in" / t), records=records // 2, batch=50))
            wait_until(lambda: all(len(sink_ids(data, t)) > 0 for t in tasks), 600, "the pipelines writing their sinks")
            # the roll moves each task once from a balanced group; the brokers' sessions start at different times,
            # so the group may not be balanced yet: the final balance then moves that surplus once more
            counts: Counter[str] = Counter()
            for t in tasks:
                if zk.exists(ZkLayout("/roll").task_owner(t)):
                    owner = codecs.decode(task_records.OwnerInfo, zk.get(ZkLayout("/roll").task_owner(t))[0])
                    counts[owner.broker] += 1
            fair = -(-len(tasks) // len(info.brokers))
            surplus = sum(max(0, counts[b] - fair) for b in info.brokers)
            p = zkctl_command(
                "--json",
                "--zk",
                info.zk,
                "--zk-root",
                "/roll",
                "cluster",
                "upgrade",
                "--name",
                name,
                "--image",
                new_image,
                "--timeout",
                "240",
                "--logs-dir",
                str(replaced_logs),
                "--in-place",
                timeout=1500,
            )
            assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
            out = json.loads(p.stdout)
            assert out["brokers"] == sorted(info.brokers) and out["image"] == new_image, out
            for b in info.brokers:
                assert new_image in client.containers.get(b).image.tags
            for t in tasks:
                generate(
                    DatagenConfig(out_dir=str(data / "in" / t), records=records // 2, batch=50, start_id=records // 2)
                )
            every_record_once(data, tasks, records, "every record in every sink")
            # a broker writes the end of a run to its log after it let go of the task (at most every 2 s): until
            # every such end is there, the logs can show the next owner's start beside a run already over
            deadline = time.monotonic() + 60
            while True:
                intervals, pending = settled_intervals(zk, ZkLayout("/roll"), admin.intervals())
                if not pending or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert pending == [], f"runs let go whose end no broker's log shows after 60 s: {pending}"
            assert double_ownership(intervals) == []
            st = admin.roll_status()
            assert st is not None and st.phase == "done" and st.moves <= len(tasks) + surplus, (st, counts)
        finally:
            zk.stop()
            zk.close()
