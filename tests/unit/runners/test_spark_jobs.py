"""The fold that turns a streaming query's batches into a smoothed load share (``Progress``): the batch time over
the trigger, or over the time between back-to-back batches."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from broker_sim.runners.spark_jobs import Progress
from controller.protocol.tasks.load import ewma


def _batch(batch_id: int, duration_ms: int) -> SimpleNamespace:
    """The fields of a StreamingQueryProgress that the fold reads."""
    return SimpleNamespace(
        batchId=batch_id,
        batchDuration=duration_ms,
        inputRowsPerSecond=10.0,
        processedRowsPerSecond=10.0,
        numInputRows=10,
        timestamp="2026-01-01T00:00:00.000Z",
    )


def test_the_load_share_is_the_smoothed_batch_time_over_the_trigger() -> None:
    p = Progress().add(_batch(0, 2500), trigger_s=5.0, now=0.0)
    assert p.load_share == 0.5 and p.batch_ms == 2500
    p = p.add(_batch(1, 5000), trigger_s=5.0, now=5.0)
    assert p.load_share == pytest.approx(ewma(0.5, 1.0))
    assert p.metrics()["load_share"] == p.load_share


def test_back_to_back_batches_share_the_time_between_them() -> None:
    p = Progress().add(_batch(0, 100), now=10.0)
    assert p.load_share == 1.0  # no trigger and no previous batch: a query that never idles
    p = Progress(load_share=None, last_batch_mono=10.0).add(_batch(1, 500), now=11.0)
    assert p.load_share == 0.5


def test_a_batch_split_is_kept_bounded_and_numbers_only() -> None:
    raw = {"addBatch": 120, "walCommit": 30.0, "bad": "x", "flag": True, **{f"p{i:02d}": i for i in range(30)}}
    p = Progress().add(SimpleNamespace(**vars(_batch(0, 200)), durationMs=raw), trigger_s=5.0, now=0.0)
    phases = dict(p.phases_ms)
    assert phases["addBatch"] == 120 and phases["walCommit"] == 30
    assert "bad" not in phases and "flag" not in phases and len(phases) == 16
    assert "phases_ms" not in p.metrics()  # for profiling only: not in the status a broker writes
    assert Progress().add(_batch(0, 200), trigger_s=5.0, now=0.0).phases_ms == ()
