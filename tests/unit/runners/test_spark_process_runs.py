"""Isolated drivers' run directories left behind by a broker killed with ``kill -9`` (its drivers die with
it, its directories stay) are removed by the next broker's runner: only those whose broker is gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from broker_sim.runners.spark_driver import LAUNCH_FILE
from broker_sim.runners.spark_process import sweep_stale_runs


def _run(drivers: Path, name: str, launch: object) -> Path:
    d = drivers / name
    d.mkdir(parents=True)
    (d / LAUNCH_FILE).write_text(json.dumps(launch) if not isinstance(launch, str) else launch)
    (d / "driver.log").write_text("...")
    return d


def test_only_the_runs_of_brokers_gone_are_swept(tmp_path: Path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a broker that has exited: its pid names no process now
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = _run(tmp_path, "t1-gone", {"task_id": "t1", "broker_pid": gone.pid})
        kept = _run(tmp_path, "t2-live", {"task_id": "t2", "broker_pid": live.pid})
        older = _run(tmp_path, "t3-old", {"task_id": "t3"})  # a run of a release that named no broker
        garbage = _run(tmp_path, "t4-bad", "{not json")
        bogus = _run(tmp_path, "t5-bogus", {"task_id": "t5", "broker_pid": "1; rm -rf /"})
        assert sweep_stale_runs(tmp_path) == [stale]
        assert not stale.exists() and kept.exists() and older.exists() and garbage.exists() and bogus.exists()
        assert sweep_stale_runs(tmp_path / "absent") == []
    finally:
        live.kill()
        live.wait()
