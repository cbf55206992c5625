"""A broker's checkpoint operations on real files (no ZooKeeper): links planted in a checkpoint or a sink are not
followed, a FIFO is refused without blocking, one request's reads are bounded in total (not per file), and a
size walk over a tree of empty directories stops at its bound and says it is partial."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from broker_sim.worker.checkpoint_ops import CheckpointStore
from broker_sim.worker.safe_files import Budget, BudgetExceeded, SafeDir
from controller.protocol.tasks.checkpoints import CheckpointError
from controller.protocol.tasks.spec import SparkPipeline
from tests.offsets_support import fake_checkpoint, spark_spec


def _pipeline(tmp: Path) -> SparkPipeline:
    p = spark_spec("t", tmp).pipeline
    assert isinstance(p, SparkPipeline)
    return p


def _outside(tmp: Path) -> Path:
    """A directory outside the checkpoint holding what a reset to batch 1 would delete: 2, 3, 4 and their .crc."""
    d = tmp / "victim"
    d.mkdir()
    for n in ("0", "1", "2", "3", "4"):
        (d / n).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (d / f".{n}.crc").write_text("crc")
    return d


@pytest.mark.parametrize("planted", ["offsets", "commits", "sources/0", "sink:_spark_metadata"])
def test_a_reset_does_not_follow_a_link_out_of_the_checkpoint(tmp_path: Path, planted: str) -> None:
    root = tmp_path / "ck"
    fake_checkpoint(root / "t", tmp_path, batches=5)
    victim = _outside(tmp_path)
    target = tmp_path / "out" / "_spark_metadata" if planted.startswith("sink:") else root / "t" / planted
    os.rename(target, tmp_path / "moved")
    target.symlink_to(victim)
    before = sorted(p.name for p in victim.iterdir())
    store = CheckpointStore(str(root), "b0")
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.reset("t", _pipeline(tmp_path), "batch", 1, False, Budget())
    assert sorted(p.name for p in victim.iterdir()) == before  # nothing outside was deleted or written


def test_a_link_to_a_file_inside_a_log_directory_is_not_read_nor_written_through(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    fake_checkpoint(root / "t", tmp_path, batches=3)
    secret = tmp_path / "secret"
    secret.write_text("v1\n{}")
    os.unlink(root / "t" / "commits" / "2")
    (root / "t" / "commits" / "2").symlink_to(secret)
    store = CheckpointStore(str(root), "b0")
    store.reset("t", _pipeline(tmp_path), "batch", 1, False, Budget())
    assert secret.read_text() == "v1\n{}"  # the link itself was removed, never its target
    assert not (root / "t" / "commits" / "2").is_symlink()


def test_a_fifo_in_the_checkpoint_is_refused_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    fake_checkpoint(root / "t", tmp_path, batches=3)
    os.unlink(root / "t" / "sources" / "0" / "0")
    os.mkfifo(root / "t" / "sources" / "0" / "0")
    store = CheckpointStore(str(root), "b0")
    got: list[BaseException] = []

    def read() -> None:
        try:
            store.offsets("t", _pipeline(tmp_path), "STOPPED", None, Budget())
        except BaseException as exc:
            got.append(exc)

    reader = threading.Thread(target=read, name="fifo-reader", daemon=True)
    reader.start()
    reader.join(60)  # a hang is the defect: bounded so that the test reports it instead of hanging too
    assert not reader.is_alive(), "the read of a FIFO blocked"
    assert len(got) == 1 and isinstance(got[0], CheckpointError) and "not a regular file" in str(got[0])


def test_reads_are_bounded_in_total_not_per_file(tmp_path: Path) -> None:
    """Six forged source logs, each under the per-file bound, together over the request's."""
    root = tmp_path / "ck"
    fake_checkpoint(root / "t", tmp_path, batches=6, pending=0)
    line = '{"path":"file:///x","timestamp":1,"batchId":0}\n'
    for b in range(6):
        (root / "t" / "sources" / "0" / str(b)).write_text("v1\n" + line * 4000)  # ~190 KB each
    store = CheckpointStore(str(root), "b0")
    store.offsets("t", _pipeline(tmp_path), "STOPPED", None, Budget())  # within the default bound
    with pytest.raises(BudgetExceeded, match="hold [0-9,]+ bytes, over the request's 600,000 bytes in total"):
        store.offsets("t", _pipeline(tmp_path), "STOPPED", None, Budget(max_bytes=600_000))


def test_a_size_walk_over_many_empty_directories_is_bounded_and_partial(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    for i in range(300):
        (root / "t" / "state" / str(i)).mkdir(parents=True)
    store = CheckpointStore(str(root), "b0")
    size = store.size("t", Budget(max_entries=100))
    assert size.exists and not size.complete and size.files == 0
    whole = store.size("t", Budget())
    assert whole.exists and whole.complete


def test_a_checkpoint_that_is_a_link_is_neither_measured_nor_purged(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "offsets").mkdir(parents=True)
    (root / "t").symlink_to(elsewhere)
    store = CheckpointStore(str(root), "b0")
    assert store.holds("t")
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.purge("t", Budget())
    assert (elsewhere / "offsets").is_dir()


def test_a_checkpoint_root_on_another_scheme_is_refused_here(tmp_path: Path) -> None:
    store = CheckpointStore("hdfs://nn/ck/zkc", "b0")
    assert not store.holds("t")
    with pytest.raises(CheckpointError, match="not a local directory"):
        store.size("t", Budget())


def test_safe_dir_refuses_names_that_are_not_one_component(tmp_path: Path) -> None:
    d = SafeDir.open(str(tmp_path), Budget())
    assert d is not None
    with d:
        for bad in ("..", "a/b", "", "."):
            with pytest.raises(CheckpointError, match="not one path component"):
                d.sub(bad)
