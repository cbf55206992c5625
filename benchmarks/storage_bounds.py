"""The bounds of a broker's storage requests on hostile checkpoints (docs/checkpoints.md, "Untrusted bytes"):
the time and memory of one request over forged logs, a FIFO and a tree of empty directories, measured on the
broker's own code (``CheckpointStore``) without ZooKeeper, which only carries the request.

``python -m benchmarks.storage_bounds [--log-mb 30] [--logs 6] [--dirs 300000]``: six forged 30 MB source logs
read by ``offsets`` (refused at the request's total bound), a FIFO at ``sources/0/0`` (refused at once), and a
size walk over 300,000 empty directories (stops at its bound, partial). Results go to
``benchmarks/results/storage_bounds.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "storage_bounds.json"


def _timed(fn: Any) -> tuple[float, str]:
    t0 = time.monotonic()
    try:
        fn()
        outcome = "answered"
    except Exception as exc:  # the refusal is the outcome measured
        outcome = f"{type(exc).__name__}: {str(exc)[:160]}"
    return time.monotonic() - t0, outcome


def main(argv: list[str] | None = None) -> int:
    from broker_sim.worker.checkpoint_ops import CheckpointStore
    from broker_sim.worker.safe_files import Budget
    from controller.protocol.tasks.spec import SparkPipeline
    from tests.offsets_support import fake_checkpoint, spark_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-mb", type=int, default=30)
    ap.add_argument("--logs", type=int, default=6)
    ap.add_argument("--dirs", type=int, default=300_000)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="zkc-bounds-"))
    out: dict[str, Any] = {}
    try:
        root = work / "ck"
        fake_checkpoint(root / "t", work, batches=a.logs, pending=0)
        p = spark_spec("t", work).pipeline
        assert isinstance(p, SparkPipeline)
        line = b'{"path":"file:///forged/' + b"x" * 60 + b'","timestamp":1,"batchId":0}\n'
        for b in range(a.logs):
            with open(root / "t" / "sources" / "0" / str(b), "wb") as f:
                f.write(b"v1\n" + line * (a.log_mb * 1024 * 1024 // len(line)))
        store = CheckpointStore(str(root), "b0")
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        s, outcome = _timed(lambda: store.offsets("t", p, "STOPPED", None, Budget()))
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print("forged logs measured", flush=True)
        out["forged_logs"] = {
            "logs": a.logs,
            "mb_each": a.log_mb,
            "seconds": round(s, 2),
            "outcome": outcome,
            "peak_rss_mb_before": round(rss0),
            "peak_rss_mb_after": round(rss1),
        }
        for b in range(a.logs):  # back to Spark-sized logs: the FIFO alone is what is measured next
            (root / "t" / "sources" / "0" / str(b)).write_bytes(b"v1\n" + line)
        os.unlink(root / "t" / "sources" / "0" / "0")
        os.mkfifo(root / "t" / "sources" / "0" / "0")
        s, outcome = _timed(lambda: store.offsets("t", p, "STOPPED", None, Budget()))
        print("fifo measured", flush=True)
        out["fifo"] = {"seconds": round(s, 3), "outcome": outcome}
        tree = work / "ck" / "d" / "state"
        tree.mkdir(parents=True)
        for i in range(a.dirs):
            os.mkdir(tree / str(i))
        t0 = time.monotonic()
        size = store.size("d", Budget())
        out["empty_dirs"] = {
            "dirs": a.dirs,
            "seconds": round(time.monotonic() - t0, 2),
            "complete": size.complete,
            "files": size.files,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
