"""The broker's load report: its process's CPU and memory (with its children: a Spark broker's JVM and its
isolated drivers) and each running task's load share, written into its registration now and then.

A registration write wakes the controller (it watches every broker znode), so the report is written only
when a figure moved by more than a step, or when the last one has grown old: a steady broker writes once
a minute at most."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from broker_sim.worker.slots import TaskTable
from controller.protocol.tasks.load import MAX_TASKS_REPORTED

log = logging.getLogger(__name__)

CPU_STEP = 10.0  # percentage points of one core
RSS_STEP_MB = 64.0
SHARE_STEP = 0.1
MAX_AGE_S = 60.0


def _changed(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether ``new`` differs from ``old`` by more than the steps (a new or gone task always counts)."""
    if old is None or old.get("tasks", {}).keys() != new["tasks"].keys():
        return True
    if abs(float(old.get("cpu_percent") or 0) - new["cpu_percent"]) > CPU_STEP:
        return True
    if abs(float(old.get("rss_mb") or 0) - new["rss_mb"]) > RSS_STEP_MB:
        return True
    return any(abs(float(old["tasks"][t]) - v) > SHARE_STEP for t, v in new["tasks"].items())


class LoadReport:
    """Samples this process (and its children) and the task table; ``due`` says whether to write."""

    def __init__(self, table: TaskTable, interval_s: float, write: Callable[[dict[str, Any]], None]) -> None:
        self.table = table
        self.interval_s = interval_s
        self.write = write
        self.process = psutil.Process()
        self.process.cpu_percent(None)  # the first call starts the measurement
        self._children: dict[int, psutil.Process] = {}
        self._last_sample = 0.0
        self._written: dict[str, Any] | None = None
        self._written_at = 0.0

    def sample(self) -> dict[str, Any]:
        """The figures now: CPU since the last sample (percent of one core), resident memory, task shares."""
        cpu, rss = self.process.cpu_percent(None), self.process.memory_info().rss
        alive: dict[int, psutil.Process] = {}
        try:
            children = self.process.children(recursive=True)
        except psutil.Error:
            children = []
        for child in children:
            known = self._children.get(child.pid, child)
            try:
                cpu += known.cpu_percent(None)  # (0 at a child's first sample)
                rss += known.memory_info().rss
                alive[child.pid] = known
            except psutil.Error:
                continue
        self._children = alive
        with self.table.lock:
            shares = {
                t: float(s.metrics["load_share"])
                for t, s in self.table.slots.items()
                if s.running and isinstance(s.metrics.get("load_share"), (int, float))
            }
        tasks = dict(sorted(shares.items())[:MAX_TASKS_REPORTED])
        return {
            "cpu_percent": round(cpu, 1),
            "rss_mb": round(rss / 2**20, 1),
            "memory_percent": round(rss / psutil.virtual_memory().total * 100, 2),
            "tasks": {t: round(v, 3) for t, v in tasks.items()},
        }

    def tick(self) -> None:
        """Sample every ``interval_s``; write when the figures moved or the last write is ``MAX_AGE_S`` old."""
        now = time.monotonic()
        if self.interval_s <= 0 or now - self._last_sample < self.interval_s:
            return
        self._last_sample = now
        figures = self.sample()
        if not _changed(self._written, figures) and now - self._written_at < MAX_AGE_S:
            return
        self.write(figures)
        self._written, self._written_at = figures, now


__all__ = ["LoadReport"]
