"""What a pipeline is doing, from the metrics its owner reports in its status: rows, batches, rates, the
backlog and the recent input rates. Those metrics are a member's claim, written where any broker can write:
every figure is checked to be a finite, non-negative number within bounds, and anything else is left out
(``None``), never passed on. Pure: shared by ``task list``, the API's Prometheus metrics and the console's
server side."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.protocol.tasks.load import MAX_LOAD_SHARE, MAX_RSS_MB

MAX_COUNT = 2**53  # a count past this is not one a runner reports (and not exact as a JSON number)
MAX_RATE = 1e12  # rows per second
MAX_HISTORY = 20  # the runner keeps 20 (``spark_jobs.RATE_HISTORY``); a longer list is cut, not trusted whole


@dataclass(frozen=True)
class PipelineFigures:
    """A task's figures as reported, validated (None: not reported, or not a valid figure)."""

    rows: int | None = None
    batches: int | None = None
    input_rows_per_s: float | None = None
    processed_rows_per_s: float | None = None
    backlog_files: int | None = None
    rate_history: tuple[float, ...] = ()
    load_share: float | None = None  # smoothed batch time / trigger interval (over 1: falling behind)
    batch_ms: int | None = None
    driver_rss_mb: float | None = None  # an isolated pipeline's own driver


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def _rate(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_RATE else None


def figures(metrics: Mapping[str, Any] | None) -> PipelineFigures:
    """The figures in a status's ``metrics``, each validated on its own (one bad figure hides only itself)."""
    if not isinstance(metrics, Mapping):
        return PipelineFigures()
    history = metrics.get("rate_history")
    rates: tuple[float, ...] = ()
    if isinstance(history, (list, tuple)):
        checked = [_rate(v) for v in list(history)[-MAX_HISTORY:]]
        rates = tuple(v for v in checked if v is not None)
    return PipelineFigures(
        rows=_count(metrics.get("rows")),
        batches=_count(metrics.get("batches")),
        input_rows_per_s=_rate(metrics.get("input_rows_per_s")),
        processed_rows_per_s=_rate(metrics.get("processed_rows_per_s")),
        backlog_files=_count(metrics.get("backlog_files")),
        rate_history=rates,
        load_share=_within(metrics.get("load_share"), MAX_LOAD_SHARE),
        batch_ms=_count(metrics.get("batch_ms")),
        driver_rss_mb=_within(metrics.get("driver_rss_mb"), MAX_RSS_MB),
    )


def _within(value: Any, top: float) -> float | None:
    """A figure within ``0..top``: an absurd one (past the bound) is no figure, not a huge one."""
    v = _rate(value)
    return v if v is not None and v <= top else None


def load_text(f: PipelineFigures) -> str:
    """``0.42`` (the load share; ``1.30 behind`` past one trigger interval), or empty when not reported."""
    if f.load_share is None:
        return ""
    return f"{f.load_share:.2f}" + (" behind" if f.load_share > 1.0 else "")


SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: tuple[float, ...], width: int = 10) -> str:
    """The last ``width`` values as block characters scaled to their maximum (a terminal's sparkline)."""
    shown = values[-width:]
    top = max(shown, default=0.0)
    if top <= 0:
        return SPARK_BARS[0] * len(shown)
    return "".join(SPARK_BARS[min(len(SPARK_BARS) - 1, int(v / top * (len(SPARK_BARS) - 1) + 0.5))] for v in shown)


def rate_text(f: PipelineFigures) -> str:
    """``148.2/s ▃▅▇█▆`` (the input rate and its recent history), or empty when the task reports none."""
    if f.input_rows_per_s is None:
        return ""
    rate = f"{f.input_rows_per_s:,.0f}/s" if f.input_rows_per_s >= 100 else f"{f.input_rows_per_s:.1f}/s"
    return f"{rate} {sparkline(f.rate_history)}".rstrip()


__all__ = ["PipelineFigures", "figures", "load_text", "rate_text", "sparkline"]
