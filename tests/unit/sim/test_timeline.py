"""The timeline library alone: the summary of run intervals (gaps, double ownership), the PNG plot, and the
intervals file's validation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker_sim.sim.timeline import TimelineError, intervals_from_json, plot_timeline
from controller.protocol.records.task_records import RunInterval


def test_timeline_summary_and_plot(tmp_path: Path):
    intervals = [
        RunInterval("t1", "b0", 100.0, 105.0),
        RunInterval("t1", "b1", 106.0, 110.0),  # a 1 s gap
        RunInterval("t2", "b0", 100.0, 108.0),
        RunInterval("t2", "b1", 107.0, 110.0),  # double ownership
        RunInterval("t10", "b2", 101.0, None),
    ]
    summary = plot_timeline(intervals, tmp_path / "t.png", "test", now=110.0)
    assert (summary.tasks, summary.brokers, summary.intervals, summary.overlaps) == (3, 3, 5, 1)
    assert summary.gap_s == pytest.approx(1.0) and summary.span_s == pytest.approx(10.0)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    parsed = intervals_from_json({"intervals": [{"task_id": "t", "broker": "b", "start": 1, "end": 2}]})
    assert parsed == [RunInterval("t", "b", 1.0, 2.0)]
    with pytest.raises(TimelineError, match=r"\[0\].*start"):
        intervals_from_json([{"task_id": "t", "broker": "b", "start": "soon"}], "f.json")
    with pytest.raises(TimelineError, match="no run intervals"):
        plot_timeline([], tmp_path / "e.png")


def test_without_matplotlib_the_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib is the ``[plot]`` extra: without it, plotting says what to install and writes nothing."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now fails as if absent
    out = tmp_path / "t.png"
    with pytest.raises(TimelineError, match=r"zkcontroller\[plot\]"):
        plot_timeline([RunInterval("t", "b", 1.0, 2.0)], out)
    assert not out.exists()
