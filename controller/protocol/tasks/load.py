"""Measured load: what a broker says its pipelines and its process cost, checked as the claim it is.

A broker writes its figures into its registration (``BrokerInfo.load``, a plain JSON object): its process's
CPU and memory use and, per task it runs, the task's *load share*, the part of its trigger interval its
micro-batches take (1.0: a pipeline that just keeps up). Anyone who can write a broker znode can write these,
and the load-aware assignor moves pipelines by them, so every figure is bounded here: a value out of range is
clamped to the range (a broker that says 10,000 is read as :data:`MAX_LOAD_SHARE`), a value that is no number
is left out, and each such repair is named in ``problems`` for the caller to log. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: a pipeline whose batches take 10 trigger intervals is as far behind as the assignor needs to know
MAX_LOAD_SHARE = 10.0
MAX_CPU_PERCENT = 100.0 * 1024  # psutil's per-process figure is per core: 1,024 cores at most
MAX_RSS_MB = 16.0 * 1024 * 1024
MAX_TASKS_REPORTED = 2000  # a report naming more tasks is cut (sorted by id), not trusted whole
MAX_TASK_ID_CHARS = 200
#: EWMA weight of the newest batch in a load share (about the last five batches count)
EWMA_ALPHA = 0.3


@dataclass(frozen=True)
class BrokerFigures:
    """A broker's load report as the controller reads it: each figure bounded, or None when not reported."""

    cpu_percent: float | None = None
    rss_mb: float | None = None
    memory_percent: float | None = None
    tasks: Mapping[str, float] = field(default_factory=dict)  # task -> load share, each within 0..MAX_LOAD_SHARE
    problems: tuple[str, ...] = ()  # what was clamped or left out, for the log

    @property
    def load(self) -> float:
        """The broker's pipeline load: the sum of its tasks' load shares."""
        return sum(self.tasks.values())


def bounded(value: Any, top: float) -> tuple[float | None, str | None]:
    """``(figure, problem)``: a finite number clamped into ``0..top``; None for anything that is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, None if value is None else f"not a number: {type(value).__name__}"
    v = float(value)
    if not math.isfinite(v):
        return None, f"not finite: {v!r}"
    if v < 0 or v > top:
        clamped = min(max(v, 0.0), top)
        return clamped, f"{v:g} clamped to {clamped:g}"
    return v, None


def broker_figures(raw: Any) -> BrokerFigures:
    """The validated figures of a registration's ``load`` object (anything else: no figures, one problem)."""
    if raw is None:
        return BrokerFigures()
    if not isinstance(raw, Mapping):
        return BrokerFigures(problems=(f"load is not an object: {type(raw).__name__}",))
    problems: list[str] = []

    def one(key: str, top: float) -> float | None:
        v, problem = bounded(raw.get(key), top)
        if problem:
            problems.append(f"{key}: {problem}")
        return v

    cpu, rss, mem = one("cpu_percent", MAX_CPU_PERCENT), one("rss_mb", MAX_RSS_MB), one("memory_percent", 100.0)
    tasks: dict[str, float] = {}
    reported = raw.get("tasks")
    if isinstance(reported, Mapping):
        keys = sorted(k for k in reported if isinstance(k, str) and 0 < len(k) <= MAX_TASK_ID_CHARS)
        if len(keys) < len(reported):
            problems.append(f"tasks: {len(reported) - len(keys)} bad task ids left out")
        if len(keys) > MAX_TASKS_REPORTED:
            problems.append(f"tasks: {len(keys)} reported, the first {MAX_TASKS_REPORTED} kept")
            keys = keys[:MAX_TASKS_REPORTED]
        for k in keys:
            v, problem = bounded(reported[k], MAX_LOAD_SHARE)
            if problem:
                problems.append(f"tasks.{k[:40]}: {problem}")
            if v is not None:
                tasks[k] = v
    elif reported is not None:
        problems.append(f"tasks is not an object: {type(reported).__name__}")
    return BrokerFigures(cpu, rss, mem, tasks, tuple(problems[:20]))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.I)
_UNIT_S = {
    **dict.fromkeys(("", "ms", "millis", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
}


def trigger_seconds(text: str | None) -> float | None:
    """A processing-time trigger's interval in seconds ('5 seconds', '500 ms', '1 minute'; a bare number is
    milliseconds, as Spark reads it); None when there is none or it does not parse."""
    m = _DURATION.match(text or "")
    scale = _UNIT_S.get(m.group(2).lower()) if m else None
    if m is None or scale is None:
        return None
    seconds = float(m.group(1)) * scale
    return seconds if seconds > 0 else None


def ewma(previous: float | None, sample: float, alpha: float = EWMA_ALPHA) -> float:
    """The smoothed figure after ``sample`` (the first sample is taken as it is)."""
    return sample if previous is None else previous + alpha * (sample - previous)


def batch_share(batch_ms: float, trigger_s: float | None, since_last_s: float | None) -> float:
    """One batch's load share: its duration over its trigger interval, or, for back-to-back batches, over the
    time since the previous batch started (a query that never idles has a share of 1)."""
    interval = trigger_s if trigger_s else since_last_s
    if not interval or interval <= 0:
        return 1.0 if batch_ms > 0 else 0.0
    return min(MAX_LOAD_SHARE, max(0.0, batch_ms / 1000.0 / interval))


__all__ = [
    "BrokerFigures",
    "EWMA_ALPHA",
    "MAX_LOAD_SHARE",
    "MAX_RSS_MB",
    "batch_share",
    "bounded",
    "broker_figures",
    "ewma",
    "trigger_seconds",
]
