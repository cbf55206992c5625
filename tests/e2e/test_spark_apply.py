"""``task apply`` on real Spark: a controller and a worker on the spark runner in this process (sharing the test
session's SparkSession), a real ZooKeeper, real files. A changed SQL (a new column) applied to a running streaming
pipeline restarts it on the same broker within seconds, from its checkpoint: the owner znode and the group's
generation do not change, the sink holds every record exactly once, and the new column is there from the restart
on. An incompatible change and a stale ``if_version`` are refused and change nothing; ``rollback`` brings the old
spec back."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker_sim.sim.datagen import DatagenConfig, generate
from controller.admin import Conflict
from controller.admin.task_apply import StaleVersion
from controller.protocol.records import codecs, group_messages, task_records
from controller.protocol.tasks.spec import parse_spec
from tests.spark_support import SparkWorkerCluster, files_task, wait_for

pytestmark = pytest.mark.slow

OLD_SQL = "SELECT id, key FROM input"
NEW_SQL = "SELECT id, key, id * 2 AS twice FROM input"
#: an in-place restart on a warm Spark session: stop the query, start it again from the checkpoint
RESTART_BOUND_S = 30.0


def rows(spark: Any, out: Path) -> list[Any]:
    """The sink's rows read through its ``_spark_metadata`` log, the files of both schemas merged."""
    log = out / "_spark_metadata"
    if not log.is_dir() or not any(p.name[0].isdigit() for p in log.iterdir()):
        return []
    df = spark.read.option("mergeSchema", "true").parquet(str(out))
    cols = ["id", "twice"] if "twice" in df.columns else ["id"]
    return df.select(*cols).collect()


def ids(spark: Any, out: Path) -> Counter[int]:
    return Counter(r.id for r in rows(spark, out))


def placement(zk, layout, task_id: str) -> tuple[int, int, str]:
    """The owner znode's creation zxid, the group's generation, and the owner."""
    data, stat = zk.get(layout.task_owner(task_id))
    state = codecs.decode(group_messages.GroupStateInfo, zk.get(layout.group_state("default"))[0])
    return stat.czxid, state.generation, codecs.decode(task_records.OwnerInfo, data).broker


def test_apply_a_new_column_in_place_exactly_once(
    spark_worker: SparkWorkerCluster, zk, layout, spark: Any, tmp_path: Path
) -> None:
    admin, worker = spark_worker.admin, spark_worker.worker
    src, out = tmp_path / "in", tmp_path / "out"
    generate(DatagenConfig(str(src), records=300, batch=50))
    spec_v1 = parse_spec(files_task("ap", src, out, OLD_SQL, max_files=2))
    admin.apply([spec_v1])
    wait_for(lambda: ids(spark, out) == Counter(range(300)), 180, "the first run to write every id once")
    assert admin.wait(["ap"], "running", 60).reached
    before = placement(zk, layout, "ap")
    zk_version = zk.get(layout.task("ap"))[1].version

    # refused, changing nothing: a stale version, and a change Spark cannot resume (another sink path)
    spec_v2 = parse_spec(files_task("ap", src, out, NEW_SQL, max_files=2))
    with pytest.raises(StaleVersion):
        admin.apply([spec_v2], if_version=7)
    with pytest.raises(Conflict, match="another sink path"):
        admin.apply([parse_spec(files_task("ap", src, tmp_path / "elsewhere", NEW_SQL, max_files=2))])
    assert zk.get(layout.task("ap"))[1].version == zk_version

    applied_at, t0 = time.time(), time.monotonic()
    item = admin.apply([spec_v2], if_version=1).items[0]
    assert (item.action, item.to_revision) == ("update", 2)
    assert admin.wait(["ap"], "running", 60).reached
    print(f"apply to RUNNING on spec version 2 (the owner's status): {time.monotonic() - t0:.2f}s")
    assert admin.describe_task("ap").status["revision"] == 2
    restarted = wait_for(
        lambda: [i for i in worker.open_intervals() if i.task_id == "ap" and i.start >= applied_at],
        60,
        "the run on the new spec",
    )
    restart_s = restarted[0].start - applied_at
    print(f"in-place restart: the new run began {restart_s:.2f}s after the apply")
    assert restart_s < RESTART_BOUND_S
    generate(DatagenConfig(str(src), records=200, batch=50, start_id=300))
    wait_for(lambda: ids(spark, out) == Counter(range(500)), 180, "every id once across the restart")
    got = rows(spark, out)
    assert all(r.twice == r.id * 2 for r in got if r.id >= 300)  # the new column from the restart on
    assert all(r.twice is None for r in got if r.id < 300)  # the batches before it were written by v1
    assert placement(zk, layout, "ap") == before  # no move, no rebalance
    assert before[2] == "sb0"

    back = admin.rollback("ap", 1)
    assert back.to_revision == 3
    assert admin.describe_task("ap").spec["pipeline"]["transform"]["sql"] == OLD_SQL
    assert admin.wait(["ap"], "running", 60).reached
    wait_for(
        lambda: [i for i in worker.open_intervals() if i.task_id == "ap" and i.start > restarted[0].start],
        60,
        "the run on the rolled-back spec",
    )
    generate(DatagenConfig(str(src), records=100, batch=50, start_id=500))
    wait_for(lambda: ids(spark, out) == Counter(range(600)), 180, "every id once after the rollback")
    assert all(r.twice is None for r in rows(spark, out) if r.id >= 500)
    assert placement(zk, layout, "ap") == before
    assert [(e.action, e.from_revision, e.to_revision) for e in admin.history("ap").events] == [
        ("apply", 1, 2),
        ("rollback to 1", 2, 3),
    ]
