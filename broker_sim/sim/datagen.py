"""A data generator for pipeline demos and tests: numbered JSON records written into a directory over time.

Each file is written under a hidden temporary name and then renamed into place, because Spark's file source
lists a directory and may read a file the moment it appears: a file still being written would be read half
(``.``-prefixed names are ignored by Spark). Ids are consecutive from ``start_id`` so a test knows exactly
which ids a sink must hold (``expected_ids``), and file names derive from the ids, so a rerun rewrites the
same files instead of adding new ones.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA_DDL = "id LONG, key STRING, value LONG, ts LONG"
"""The Spark DDL schema of a generated record."""


@dataclass(frozen=True)
class DatagenConfig:
    out_dir: str
    records: int
    rate: float | None = None  # records per second; None = as fast as the disk allows
    batch: int = 100  # records per file
    start_id: int = 0
    duration_s: float | None = None  # stop early once this much time has passed
    prefix: str = "part"

    def __post_init__(self) -> None:
        if self.records < 0:
            raise ValueError("records must be >= 0")
        if self.batch < 1:
            raise ValueError("batch must be >= 1")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0 (or None for no limit)")
        if self.duration_s is not None and self.duration_s < 0:
            raise ValueError("duration_s must be >= 0")

    def expected_ids(self) -> range:
        """The ids a complete run writes."""
        return range(self.start_id, self.start_id + self.records)


@dataclass(frozen=True)
class DatagenResult:
    files: int
    records: int
    start_id: int
    elapsed_s: float
    complete: bool  # every configured record was written (not cut short by duration or stop)

    def ids(self) -> range:
        """The ids actually written."""
        return range(self.start_id, self.start_id + self.records)


def record(n: int) -> dict[str, int | str]:
    """Record number ``n``; its fields are a pure function of ``n`` except the write time ``ts`` (ms)."""
    return {"id": n, "key": f"k{n % 10}", "value": n * 7 % 1000, "ts": int(time.time() * 1000)}


def write_file_atomically(directory: Path, name: str, lines: list[str]) -> Path:
    """Write ``lines`` to ``directory/name`` via a hidden temporary file and a rename (atomic on POSIX)."""
    final = directory / name
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def generate(config: DatagenConfig, stop: threading.Event | None = None) -> DatagenResult:
    """Write the records now, in this thread; return what was written. ``stop`` cuts it short."""
    stop = stop or threading.Event()
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    written = files = 0
    while written < config.records and not stop.is_set():
        if config.duration_s is not None and time.monotonic() - t0 >= config.duration_s:
            break
        if config.rate is not None:  # file k is due once its first record is due at the configured rate
            delay = t0 + written / config.rate - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
        n = min(config.batch, config.records - written)
        first = config.start_id + written
        lines = [json.dumps(record(i), separators=(",", ":")) for i in range(first, first + n)]
        write_file_atomically(out, f"{config.prefix}-{first:012d}.json", lines)
        written += n
        files += 1
    return DatagenResult(
        files=files,
        records=written,
        start_id=config.start_id,
        elapsed_s=round(time.monotonic() - t0, 3),
        complete=written == config.records,
    )


class Datagen:
    """``generate`` in a named background thread: ``start``, then ``join`` (or ``stop``) for the result."""

    def __init__(self, config: DatagenConfig) -> None:
        self.config = config
        self._stop = threading.Event()
        self._result: DatagenResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"datagen-{Path(config.out_dir).name}", daemon=True)

    def _run(self) -> None:
        try:
            self._result = generate(self.config, self._stop)
        except BaseException as exc:  # reported by join()
            self._error = exc

    def start(self) -> Datagen:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    def join(self, timeout: float) -> DatagenResult:
        """Wait up to ``timeout`` seconds for the generator to finish; raise TimeoutError if it has not."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"datagen into {self.config.out_dir} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def stop(self, timeout: float = 10.0) -> DatagenResult:
        self._stop.set()
        return self.join(timeout)


__all__ = ["SCHEMA_DDL", "DatagenConfig", "DatagenResult", "Datagen", "generate", "record", "write_file_atomically"]
