"""The file source's backlog: the source files not yet in the checkpoint's source log, bounded, and none for what
is not a local directory."""

from __future__ import annotations

import json

from broker_sim.runners.backlog import FileBacklog


# ---- the file source's backlog -----------------------------------------------------------------------------
def test_backlog_counts_source_files_not_in_the_source_log(tmp_path) -> None:
    src, chk = tmp_path / "in", tmp_path / "chk"
    src.mkdir()
    for i in range(5):
        (src / f"part-{i}.json").write_text("{}\n")
    (src / ".part-9.json.crc").write_text("")  # hidden and in-progress names are not data to Spark
    (src / "_temporary").mkdir()
    backlog = FileBacklog(str(src), str(chk), interval_s=0)
    assert backlog.files() == 5  # no checkpoint yet: nothing read
    log = chk / "sources" / "0"
    log.mkdir(parents=True)
    entry = lambda i: json.dumps({"path": f"file://{src}/part-{i}.json", "timestamp": 1, "batchId": 0})  # noqa: E731
    (log / "0").write_text("v1\n" + entry(0) + "\n" + entry(1) + "\n")
    assert backlog.files() == 3
    (log / "1").write_text("v1\n" + entry(2) + "\n")
    (log / "2.compact").write_text("v1\n" + "\n".join(entry(i) for i in range(4)) + "\n")
    assert backlog.files() == 1
    assert FileBacklog(str(src), str(chk), interval_s=0).files() == 1  # a fresh reader: the compaction alone
    assert FileBacklog(str(tmp_path / "gone"), str(chk), interval_s=0).files() is None
    assert FileBacklog(str(src), str(chk), interval_s=0, max_files=3).files() is None  # past the bound: no figure
    assert FileBacklog.of("s3a://bucket/in", str(chk)) is None  # not a local directory: no backlog figure
