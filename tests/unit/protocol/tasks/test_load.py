"""Load figures: a broker's load report and a pipeline's load share, bounded as the untrusted claims they are,
and the triggers they are measured against. (The fold of a query's batches: tests/unit/runners/test_spark_jobs.py.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.admin.reads import load_view
from controller.protocol.tasks.load import MAX_LOAD_SHARE, MAX_TASKS_REPORTED, broker_figures, trigger_seconds


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
