"""Load figures: a broker's load report and a pipeline's load share, bounded as the untrusted claims they are,
and the fold that turns a streaming query's batches into a smoothed load share."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker_sim.runners.spark_jobs import Progress
from controller.admin.reads import load_view
from controller.protocol.tasks.load import MAX_LOAD_SHARE, MAX_TASKS_REPORTED, broker_figures, ewma, trigger_seconds
from controller.protocol.tasks.pipeline_metrics import figures, load_text


def test_a_sound_report_is_read_as_it_is() -> None:
    f = broker_figures({"cpu_percent": 85.5, "rss_mb": 900, "memory_percent": 3.2, "tasks": {"a": 0.5, "b": 1.25}})
    assert (f.cpu_percent, f.rss_mb, f.memory_percent) == (85.5, 900.0, 3.2)
    assert dict(f.tasks) == {"a": 0.5, "b": 1.25}
    assert f.load == pytest.approx(1.75)
    assert f.problems == ()


def test_an_absurd_report_is_clamped_and_named() -> None:
    f = broker_figures({"cpu_percent": -5, "rss_mb": "lots", "tasks": {"a": 1e300, "b": float("nan"), "": 1.0}})
    assert f.cpu_percent == 0.0
    assert f.rss_mb is None
    assert dict(f.tasks) == {"a": MAX_LOAD_SHARE}  # nan left out, the empty id left out, 1e300 clamped
    joined = "; ".join(f.problems)
    assert "clamped" in joined and "not finite" in joined and "bad task ids" in joined and "not a number" in joined


@pytest.mark.parametrize("raw", ["x", 3, [1, 2], {"tasks": [1]}, {"tasks": "a"}])
def test_a_report_of_the_wrong_shape_gives_no_figures(raw: object) -> None:
    f = broker_figures(raw)
    assert dict(f.tasks) == {} and f.load == 0.0 and f.problems


def test_a_report_naming_too_many_tasks_is_cut() -> None:
    f = broker_figures({"tasks": {f"t{i:05d}": 1.0 for i in range(MAX_TASKS_REPORTED + 10)}})
    assert len(f.tasks) == MAX_TASKS_REPORTED
    assert any("kept" in p for p in f.problems)


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.floats(allow_nan=True), st.integers(), st.none(), st.text())))
def test_any_task_figures_are_bounded(tasks: dict[str, object]) -> None:
    f = broker_figures({"tasks": tasks, "cpu_percent": next(iter(tasks.values()), None)})
    assert all(0.0 <= v <= MAX_LOAD_SHARE and math.isfinite(v) for v in f.tasks.values())
    assert 0.0 <= f.load <= MAX_LOAD_SHARE * MAX_TASKS_REPORTED


def test_the_admin_view_shows_the_repairs() -> None:
    v = load_view({"cpu_percent": 20, "tasks": {"a": 99}})
    assert v is not None and v["tasks"] == {"a": MAX_LOAD_SHARE} and v["problems"]
    assert load_view(None) is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5 seconds", 5.0), ("1 second", 1.0), ("500 ms", 0.5), ("2s", 2.0), ("1 minute", 60.0), ("250", 0.25)],
)
def test_trigger_intervals_parse(text: str, seconds: float) -> None:
    assert trigger_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "soon", "0 seconds", "5 fortnights", "-1 s"])
def test_a_trigger_that_does_not_parse_is_none(text: str | None) -> None:
    assert trigger_seconds(text) is None


def test_a_task_status_load_share_is_bounded() -> None:
    assert figures({"load_share": 0.4, "driver_rss_mb": 700, "batch_ms": 2000}).load_share == 0.4
    assert figures({"load_share": 1e9}).load_share is None  # absurd: no figure, not a huge one
    assert figures({"load_share": "high"}).load_share is None
    assert figures({"driver_rss_mb": -1}).driver_rss_mb is None
    assert load_text(figures({"load_share": 1.3})) == "1.30 behind"
    assert load_text(figures({"load_share": 0.25})) == "0.25"
    assert load_text(figures({})) == ""


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
