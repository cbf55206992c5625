"""What the offsets tests share: a spark task spec over a test's directories, and a checkpoint with its file
sink's log written in Spark's format (so that tests without Spark can read and reset one)."""

from __future__ import annotations

import json
from pathlib import Path

from controller.protocol.tasks.spec import TaskSpec, parse_spec


def spark_spec(task_id: str, tmp: Path, **extra) -> TaskSpec:
    return parse_spec(
        {
            "id": task_id,
            "pipeline": {
                "kind": "spark",
                "source": {"type": "files", "format": "json", "path": str(tmp / "in"), "schema": "id LONG"},
                "transform": {"sql": "SELECT id FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp / "out")},
            },
            **extra,
        }
    )


def fake_checkpoint(root: Path, tmp: Path, batches: int = 3, pending: int = 1) -> None:
    """A checkpoint and sink as Spark leaves them after ``batches`` batches of one file each, and ``pending``
    more input files not taken yet."""
    (tmp / "in").mkdir(exist_ok=True)
    meta = tmp / "out" / "_spark_metadata"
    for d in ("offsets", "commits", "sources/0"):
        (root / d).mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text('{"id":"6f6c7cdd-f20a-4e0c-9354-73ab75187bc8"}')
    for b in range(batches + pending):
        f = tmp / "in" / f"f{b}.json"
        f.write_text(json.dumps({"id": b}) + "\n")
        if b >= batches:
            continue
        ts = 1_700_000_000_000 + b
        (root / "offsets" / str(b)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{ts},"conf":{{}}}}\n{{"logOffset":{b}}}'
        )
        (root / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        entry = {"path": f.absolute().as_uri(), "timestamp": 1, "batchId": b}
        (root / "sources" / "0" / str(b)).write_text("v1\n" + json.dumps(entry))
        part = tmp / "out" / f"part-{b}.parquet"
        part.write_bytes(b"PAR1")
        added = {"path": part.absolute().as_uri(), "size": 4, "isDir": False, "modificationTime": 1}
        (meta / str(b)).write_text(
            "v1\n" + json.dumps({**added, "blockReplication": 1, "blockSize": 1, "action": "add"})
        )
        (meta / f".{b}.crc").write_bytes(b"stale")
