"""Streaming file pipelines of a chaos run: their specs, and what a sink holds, read the way Spark
reads it (only files its commit log names)."""

from __future__ import annotations

import json
from pathlib import Path

from controller.protocol.tasks.spec import TaskSpec


def committed_files(sink: Path) -> list[Path]:
    """The data files a Spark file sink has committed, from its ``_spark_metadata`` log (the latest
    ``N.compact`` file holds every entry up to batch N; later batches follow in files named by batch id).
    Files a killed writer left behind without a commit are not in the log, so they do not count."""
    log_dir = sink / "_spark_metadata"
    if not log_dir.is_dir():
        return []
    batches: dict[int, Path] = {}
    compacts: dict[int, Path] = {}
    for f in log_dir.iterdir():
        name = f.name
        if name.startswith("."):
            continue
        if name.endswith(".compact") and name[:-8].isdigit():
            compacts[int(name[:-8])] = f
        elif name.isdigit():
            batches[int(name)] = f
    start = max(compacts, default=-1)
    files = ([compacts[start]] if start >= 0 else []) + [batches[b] for b in sorted(batches) if b > start]
    live: dict[str, None] = {}
    for f in files:
        for line in f.read_text().splitlines()[1:]:  # the first line is the log's version ("v1")
            if not line.strip():
                continue
            entry = json.loads(line)
            path = entry["path"]
            if entry.get("action", "add") == "delete":
                live.pop(path, None)
            else:
                live[path] = None
    out = []
    for uri in live:
        local = uri[len("file:") :] if uri.startswith("file:") else uri
        while local.startswith("//"):
            local = local[1:]
        out.append(Path(local))
    return out


def sink_ids(sink: Path) -> list[int]:
    """Every ``id`` in the committed parquet files of a sink (duplicates kept: that is the point)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type information

    ids: list[int] = []
    for f in committed_files(sink):
        ids += pq.read_table(str(f), columns=["id"]).column("id").to_pylist()
    return ids


def pipeline_spec(task: str, src: Path, out: Path) -> TaskSpec:
    from broker_sim.sim.datagen import SCHEMA_DDL
    from controller.protocol.tasks.spec import parse_spec

    return parse_spec(
        {
            "id": task,
            "pipeline": {
                "kind": "spark",
                "mode": "streaming",
                "trigger": {"processing_time": "1 second"},
                "source": {
                    "type": "files",
                    "format": "json",
                    "path": str(src),
                    "schema": SCHEMA_DDL,
                    "max_files_per_trigger": 10,
                },
                "transform": {"sql": "SELECT id, key, value FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(out)},
            },
        }
    )
