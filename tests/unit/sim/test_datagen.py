"""The data generator behind the pipeline tests and the demo (no Spark needed: fast)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker_sim.sim.datagen import Datagen, DatagenConfig, generate, write_file_atomically
from cli.datagen import datagen


def _ids(directory: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for f in directory.glob("*.json") for line in f.read_text().splitlines())


def test_writes_every_id_once_in_visible_files_only(tmp_path: Path) -> None:
    config = DatagenConfig(out_dir=str(tmp_path), records=250, batch=100, start_id=1000)
    result = generate(config)
    assert result.complete and result.files == 3 and result.records == 250
    assert _ids(tmp_path) == list(config.expected_ids()) == list(result.ids())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "no temporary file left behind"
    generate(config)  # a rerun rewrites the same files, it does not add records
    assert _ids(tmp_path) == list(config.expected_ids())


def test_atomic_write_never_shows_a_partial_file(tmp_path: Path) -> None:
    seen_partial: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for f in tmp_path.glob("*.json"):
                text = f.read_text()
                if not text.endswith("\n") or len(text.splitlines()) != 500:
                    seen_partial.append(f.name)

    t = threading.Thread(target=reader, name="test-datagen-reader")
    t.start()
    try:
        for i in range(20):
            write_file_atomically(tmp_path, f"f{i}.json", [json.dumps({"id": n}) for n in range(500)])
    finally:
        stop.set()
        t.join(10)
    assert seen_partial == []


def test_rate_and_duration_bound_the_run(tmp_path: Path) -> None:
    t0 = time.monotonic()
    result = generate(DatagenConfig(out_dir=str(tmp_path), records=10_000, rate=200, batch=20, duration_s=0.5))
    elapsed = time.monotonic() - t0
    assert not result.complete and 0 < result.records < 10_000
    assert result.records <= 200 * 0.5 + 20 * 2  # never ahead of the rate by more than a file
    assert (
        elapsed < 10.0
    )  # the duration ends the run (10,000 records at 200/s would take 50 s); generous for loaded machines


def test_background_generator_stops_on_request(tmp_path: Path) -> None:
    gen = Datagen(DatagenConfig(out_dir=str(tmp_path), records=1_000_000, rate=100, batch=10)).start()
    time.sleep(0.3)
    result = gen.stop(timeout=5)
    assert gen.done and not result.complete
    assert _ids(tmp_path) == list(result.ids())
    with pytest.raises(ValueError):
        DatagenConfig(out_dir=str(tmp_path), records=1, batch=0)


def test_cli_command(tmp_path: Path) -> None:
    out = tmp_path / "in"
    res = CliRunner().invoke(datagen, ["--out", str(out), "--records", "30", "--batch", "7", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["records"] == 30 and summary["files"] == 5 and summary["last_id"] == 29
    assert _ids(out) == list(range(30))
