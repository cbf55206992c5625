"""Pictures of task ownership over time, from recorded run intervals (``RunInterval``).

One row per task, one colour per broker, gaps where nothing ran; overlapping runs of one task on two
brokers (which must never happen) are outlined in red. Used by ``zkctl timeline`` and the benchmarks.
Plotting uses matplotlib's Agg canvas directly (no global backend switch, no display needed).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import RunInterval

MAX_LABELLED_ROWS = 80


class TimelineError(ZkcError, ValueError):
    """Intervals that cannot be read or plotted (the message says which and why)."""


@dataclass(frozen=True)
class TimelineSummary:
    out: str
    tasks: int
    brokers: int
    intervals: int
    span_s: float
    gap_s: float  # summed over tasks: time between a task's first start and last end when nothing ran it
    overlaps: int  # pairs of runs of one task on two brokers that overlap in time


def intervals_from_json(doc: Any, source: str = "<json>") -> list[RunInterval]:
    """Intervals from parsed JSON: a list of RunInterval objects, or ``{"intervals": [...]}``
    (an IntervalLog, or what the simulator writes). ``version`` may be omitted."""
    if isinstance(doc, dict) and "intervals" in doc:
        doc = doc["intervals"]
    if not isinstance(doc, list):
        raise TimelineError(f"{source}: expected a JSON list of run intervals")
    out = []
    for i, item in enumerate(doc):
        if not isinstance(item, dict):
            raise TimelineError(f"{source}[{i}]: expected an object, got {type(item).__name__}")
        try:
            out.append(codecs.from_dict(RunInterval, {"version": codecs.SCHEMA_VERSION, **item}, f"{source}[{i}]"))
        except PayloadError as exc:
            raise TimelineError(str(exc)) from None
    return out


def load_intervals(path: str | Path) -> list[RunInterval]:
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise TimelineError(f"{path}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TimelineError(f"{path}: not JSON ({exc})") from None
    return intervals_from_json(doc, str(path))


def _natural(key: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def _spans(intervals: Iterable[RunInterval], now: float) -> list[tuple[str, str, float, float]]:
    return [(i.task_id, i.broker, i.start, i.end if i.end is not None else now) for i in intervals]


def _gaps_and_overlaps(
    spans: Sequence[tuple[str, str, float, float]],
) -> tuple[float, int, list[tuple[str, float, float]]]:
    by_task: dict[str, list[tuple[float, float, str]]] = {}
    for t, b, s, e in spans:
        by_task.setdefault(t, []).append((s, e, b))
    gap = 0.0
    overlaps: list[tuple[str, float, float]] = []
    for t, runs in by_task.items():
        runs.sort()
        covered_to = runs[0][1]
        for i, (s, e, b) in enumerate(runs):
            if i and s > covered_to:
                gap += s - covered_to
            covered_to = max(covered_to, e)
            for s2, e2, b2 in runs[i + 1 :]:
                if s2 >= e:
                    break
                if b2 != b:
                    overlaps.append((t, s2, min(e, e2)))
    return gap, len(overlaps), overlaps


def plot_timeline(
    intervals: Sequence[RunInterval], out: str | Path, title: str | None = None, now: float | None = None
) -> TimelineSummary:
    """Draw the intervals to ``out`` (PNG, or any format matplotlib knows by the suffix)."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ModuleNotFoundError:
        raise TimelineError("plotting needs matplotlib: pip install 'zkcontroller[plot]'") from None

    if not intervals:
        raise TimelineError("no run intervals to plot")
    now = now if now is not None else max([time.time()] + [i.end or i.start for i in intervals])
    spans = _spans(intervals, now)
    t0 = min(s for _, _, s, _ in spans)
    t1 = max(e for _, _, _, e in spans)
    tasks = sorted({t for t, *_ in spans}, key=_natural)
    brokers = sorted({b for _, b, *_ in spans}, key=_natural)
    row = {t: i for i, t in enumerate(tasks)}

    fig = Figure(figsize=(12, min(40.0, max(2.5, 0.28 * len(tasks) + 1.6))), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    cmap = matplotlib.colormaps["tab10" if len(brokers) <= 10 else "tab20" if len(brokers) <= 20 else "turbo"]
    colour = {
        b: cmap(i % cmap.N) if len(brokers) <= 20 else cmap(i / max(1, len(brokers) - 1)) for i, b in enumerate(brokers)
    }
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for t, b, s, e in spans:
        bars.setdefault((t, b), []).append((s - t0, max(e - s, 1e-3)))
    for (t, b), xr in bars.items():
        ax.broken_barh(xr, (row[t] - 0.4, 0.8), facecolors=colour[b], edgecolor="none")
    gap, n_overlaps, overlaps = _gaps_and_overlaps(spans)
    for t, s, e in overlaps:
        ax.broken_barh(
            [(s - t0, max(e - s, 1e-3))], (row[t] - 0.45, 0.9), facecolors="none", edgecolor="red", linewidth=1.5
        )
    ax.set_ylim(-0.7, len(tasks) - 0.3)
    ax.invert_yaxis()
    if len(tasks) <= MAX_LABELLED_ROWS:
        ax.set_yticks(range(len(tasks)), labels=tasks, fontsize=8 if len(tasks) > 30 else 9)
    else:
        ax.set_ylabel(f"{len(tasks)} tasks")
        ax.set_yticks([])
    ax.set_xlim(0, max(t1 - t0, 1e-3))
    ax.set_xlabel("seconds since " + time.strftime("%H:%M:%S", time.localtime(t0)))
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=colour[b], label=b) for b in brokers[:20]]
    if n_overlaps:
        handles.append(Patch(facecolor="none", edgecolor="red", label=f"double ownership ({n_overlaps})"))
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        title="broker",
        title_fontsize=9,
        frameon=False,
    )
    ax.set_title(title or f"task ownership: {len(tasks)} tasks, {len(brokers)} brokers, {len(spans)} runs")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return TimelineSummary(str(out), len(tasks), len(brokers), len(spans), round(t1 - t0, 3), round(gap, 3), n_overlaps)


__all__ = ["plot_timeline", "load_intervals", "intervals_from_json", "TimelineSummary", "TimelineError"]
