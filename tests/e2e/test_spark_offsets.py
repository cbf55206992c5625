"""STOPPED, offsets and resets on real Spark: a controller and a worker on the spark runner in this process (the
worker's runner shares the test session's SparkSession), a real ZooKeeper, real files. Each reset is followed by
a resume and the sink is read back through its ``_spark_metadata`` log, as Spark's readers read it:

* ``--to-batch 0``: the sink holds batch 0's rows alone; after the resume, every row once;
* ``--to-earliest``: the sink is emptied with the checkpoint, and the replay writes every row once more, so
  after it the sink holds every row exactly once (the replay's copy; the first run's files are gone);
* ``--to-latest``: files that arrived while it was stopped are skipped; the next ones are read;
* the same reset from a ``zkctl`` in another directory, with another state dir, that may not read the
  checkpoint at all: the broker carries it out, and the replay lands exactly once.

Without the sink's log moving with the checkpoint, Spark's file sink would skip the replayed batch ids as
already written (``tests/unit/protocol/tasks/test_checkpoints.py`` checks each plan's operations)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from broker_sim.sim.datagen import DatagenConfig, generate
from controller.protocol.tasks.spec import parse_spec
from controller.protocol.tasks.storage import ResetTarget
from tests.spark_support import SparkWorkerCluster, files_task, sink_ids, wait_for

pytestmark = pytest.mark.slow


def counts(spark: Any, out: Path) -> Counter[int]:
    """Each id's copies in the sink, through its log (none before its first batch is committed)."""
    log = out / "_spark_metadata"
    if not log.is_dir() or not any(p.name[0].isdigit() for p in log.iterdir()):
        return Counter()
    return Counter(sink_ids(spark, out))


def test_stop_offsets_and_resets_keep_the_sink_exactly_once(
    spark_worker: SparkWorkerCluster, spark: Any, tmp_path: Path
) -> None:
    admin = spark_worker.admin
    src, out = tmp_path / "in", tmp_path / "out"
    generate(DatagenConfig(str(src), records=300, batch=50))  # six files
    everything = Counter(range(300))
    admin.create_tasks([parse_spec(files_task("off", src, out, "SELECT id, key FROM input", max_files=2))])
    wait_for(lambda: counts(spark, out) == everything, 180, "the first run to write every id once")
    wait_for(lambda: admin.offsets("off").rows_since_start == 300, 30, "the owner to report its 300 rows")

    assert admin.stop("off", wait=60).confirmed
    v = admin.offsets("off")
    assert (v.last_committed, v.earliest, v.sink_last_batch) == (2, 0, 2), v  # two files per batch
    (s,) = v.sources
    assert (s.offset, s.files_in_batch, s.files_taken, s.files_pending) == ({"logOffset": 2}, 2, 6, 0)
    assert v.rows_since_start == 300 and v.committed_at is not None

    admin.reset_offsets("off", ResetTarget(batch=0))
    kept = counts(spark, out)
    assert len(kept) == 100 and set(kept.values()) == {1}, kept  # batch 0's two files, once
    admin.resume("off")
    wait_for(lambda: counts(spark, out) == everything, 180, "the replay from batch 1 to complete the sink")

    assert admin.stop("off", wait=60).confirmed
    r = admin.reset_offsets("off", ResetTarget(earliest=True))
    assert r.position == -1 and r.sink_files_removed >= 3
    assert counts(spark, out) == Counter()  # the sink's log went with the checkpoint: nothing visible
    admin.resume("off")
    wait_for(lambda: counts(spark, out) == everything, 180, "the replay from the earliest to write every id once")
    assert admin.offsets("off").last_committed == 2  # the replay's batches 0-2, not skipped as already written

    assert admin.stop("off", wait=60).confirmed
    generate(DatagenConfig(str(src), records=100, batch=50, start_id=300))  # arrives while stopped
    r = admin.reset_offsets("off", ResetTarget(latest=True))
    assert r.position == 3
    admin.resume("off")
    generate(DatagenConfig(str(src), records=100, batch=50, start_id=400))
    want = everything + Counter(range(400, 500))
    wait_for(lambda: counts(spark, out) == want, 180, "the files after the reset to latest, and not the skipped ones")
    assert [e.action for e in admin.history("off").events] == [
        "stop",
        "reset-offsets",
        "resume",
        "stop",
        "reset-offsets",
        "resume",
        "stop",
        "reset-offsets",
        "resume",
    ]


def test_a_reset_from_a_cli_that_cannot_read_the_checkpoint_replays_exactly_once(
    spark_worker: SparkWorkerCluster,
    spark: Any,
    tmp_path: Path,
    cli_env: dict[str, str],
) -> None:
    """The CLI runs elsewhere (its own working and state dirs) and may not open anything under the broker's
    checkpoint root, nor under the sink: the reset is carried out by the broker that ran the task."""
    admin = spark_worker.admin
    src, out = tmp_path / "in", tmp_path / "out"
    generate(DatagenConfig(str(src), records=200, batch=50))
    everything = Counter(range(200))
    admin.create_tasks([parse_spec(files_task("far", src, out, "SELECT id, key FROM input", max_files=2))])
    wait_for(lambda: counts(spark, out) == everything, 180, "the first run to write every id once")
    assert admin.stop("far", wait=60).confirmed

    elsewhere = tmp_path / "operator"
    elsewhere.mkdir()
    env = {**cli_env, "ZKC_STATE_DIR": str(elsewhere / "state"), "PYTHONPATH": os.pathsep.join(sys.path)}
    blind = Path(__file__).resolve().parents[1] / "blind_cli.py"

    def zkctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(blind), str(tmp_path), *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    seen = zkctl("task", "offsets", "far")
    assert seen.returncode == 0 and "last committed batch 1" in seen.stdout and "on broker sb0" in seen.stdout, seen
    done = zkctl("task", "reset-offsets", "far", "--to-earliest", "--timeout", "60")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "reset to earliest on broker sb0: the next start reads from the beginning" in done.stdout, done.stdout
    assert counts(spark, out) == Counter()
    admin.resume("far")
    wait_for(lambda: counts(spark, out) == everything, 180, "the replay to write every id exactly once")
    assert [e.action for e in admin.history("far").events] == ["stop", "reset-offsets", "resume"]
