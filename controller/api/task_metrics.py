"""Per-task Prometheus metrics on the API's ``/metrics``: what each pipeline is doing (rows and batches of
its current run, input and processing rates, files not yet read), from the statuses its owner writes.

Bounded cardinality: one series per figure per task, labelled ``task`` and ``group`` only (never the broker,
which changes at every move and would leave a series behind per move), for at most ``max_tasks`` tasks: the
first page of the task listing, read at the source (bucket order, the same tasks at every scrape while the
cluster does not change). ``zkc_task_metrics_tasks`` says how many are exported and
``zkc_task_metrics_truncated`` whether the cluster holds more. A scrape reads ZooKeeper at most once per
``ttl_s`` (the page is kept that long), so scrapers cost the cluster one page read per ``ttl_s`` at most.
Figures are validated (``pipeline_metrics``): what a broker writes into its status is untrusted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.admin.views import TaskPage
from controller.protocol.tasks.pipeline_metrics import figures

log = logging.getLogger(__name__)

DEFAULT_MAX_TASKS = 500
DEFAULT_TTL_S = 5.0

_FIGURES = (
    ("zkc_task_rows", "rows read by the task's current run", "rows"),
    ("zkc_task_batches", "micro-batches committed by the task's current run", "batches"),
    ("zkc_task_input_rows_per_second", "the task's input rate at its last batch", "input_rows_per_s"),
    ("zkc_task_processed_rows_per_second", "the task's processing rate at its last batch", "processed_rows_per_s"),
    ("zkc_task_load_share", "the share of its trigger interval the task's batches take (smoothed)", "load_share"),
    ("zkc_task_driver_rss_megabytes", "resident memory of an isolated task's own driver", "driver_rss_mb"),
    (
        "zkc_task_backlog_files",
        "files in the task's source not read yet (file sources on local storage)",
        "backlog_files",
    ),
)


class TaskMetricsCollector(Collector):
    """Collects per-task gauges from one page of tasks, read through ``read_page(limit)`` and cached ``ttl_s``."""

    def __init__(
        self,
        read_page: Callable[[int], TaskPage],
        max_tasks: int = DEFAULT_MAX_TASKS,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_tasks < 0:
            raise ValueError("max_tasks must not be negative")
        self._read_page = read_page
        self.max_tasks = max_tasks
        self.ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._page: TaskPage | None = None
        self._at = float("-inf")

    def _current(self) -> TaskPage | None:
        with self._lock:
            if self._clock() - self._at >= self.ttl_s:
                try:
                    self._page = self._read_page(self.max_tasks)
                except Exception as exc:  # ZooKeeper away: the last page, if any, rather than a failed scrape
                    log.info("task metrics: cannot read the tasks: %s", exc)
                self._at = self._clock()
            return self._page

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.max_tasks == 0:
            return
        page = self._current()
        rows = page.rows if page is not None else ()
        exported = GaugeMetricFamily("zkc_task_metrics_tasks", "tasks whose metrics this endpoint exports")
        exported.add_metric([], len(rows))
        yield exported
        truncated = GaugeMetricFamily(
            "zkc_task_metrics_truncated", "1 if the cluster holds more tasks than the exported ones (the cap)"
        )
        truncated.add_metric([], 1 if page is not None and page.next_cursor is not None else 0)
        yield truncated
        running = GaugeMetricFamily(
            "zkc_task_running", "1 if the task's owner reports it RUNNING", labels=["task", "group"]
        )
        families = {attr: GaugeMetricFamily(name, doc, labels=["task", "group"]) for name, doc, attr in _FIGURES}
        for r in rows:
            labels = [r.task_id, r.group or ""]
            live = bool(r.owner) and r.shown not in ("STALE", "UNASSIGNED")
            running.add_metric(labels, 1 if live and r.status == "RUNNING" else 0)
            if not live:
                continue  # a task nobody runs has no current figures (its last status is not what it does)
            f = figures(r.metrics)
            for attr, family in families.items():
                value = getattr(f, attr)
                if value is not None:
                    family.add_metric(labels, float(value))
        yield running
        yield from families.values()


__all__ = ["TaskMetricsCollector", "DEFAULT_MAX_TASKS", "DEFAULT_TTL_S"]
