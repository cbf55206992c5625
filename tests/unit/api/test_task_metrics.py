"""The per-task Prometheus collector: its figures bounded, validated and cached."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest

from controller.admin.views import TaskPage, TaskRow
from controller.api.task_metrics import TaskMetricsCollector


# ---- per-task Prometheus metrics ---------------------------------------------------------------------------
def _row(task: str, owner: str | None, metrics: dict, status: str = "RUNNING", shown: str | None = None) -> TaskRow:
    return TaskRow(task, group="g", owner=owner, status=status, shown=shown or status, metrics=metrics)


def test_task_metrics_are_bounded_validated_and_cached() -> None:
    now = [0.0]
    reads: list[int] = []
    pages = [
        TaskPage(
            (
                _row(
                    "t1",
                    "b1",
                    {"rows": 10, "batches": 2, "input_rows_per_s": 5.0, "backlog_files": 3, "load_share": 0.5},
                ),
                _row("t2", "b2", {"rows": "<b>", "input_rows_per_s": math.nan, "load_share": 1e9}),
                _row("t3", "b9", {"rows": 99}, shown="STALE"),  # its writer's session is gone: no figures
            ),
            next_cursor="t3",
        )
    ]

    def read(limit: int) -> TaskPage:
        reads.append(limit)
        if not pages:
            raise ConnectionError("ZooKeeper away")
        return pages.pop()

    registry = CollectorRegistry()
    registry.register(TaskMetricsCollector(read, max_tasks=3, ttl_s=5.0, clock=lambda: now[0]))
    text = generate_latest(registry).decode()
    assert reads == [3]
    assert 'zkc_task_rows{group="g",task="t1"} 10.0' in text
    assert 'zkc_task_backlog_files{group="g",task="t1"} 3.0' in text
    assert 'zkc_task_load_share{group="g",task="t1"} 0.5' in text  # (t2's absurd share is left out below)
    assert 'zkc_task_running{group="g",task="t1"} 1.0' in text and 'zkc_task_running{group="g",task="t3"} 0.0' in text
    assert 'task="t2"' not in text.replace('zkc_task_running{group="g",task="t2"} 1.0', "")  # no bad figure
    assert 'zkc_task_rows{group="g",task="t3"}' not in text
    assert "zkc_task_metrics_truncated 1.0" in text and "zkc_task_metrics_tasks 3.0" in text
    generate_latest(registry)
    assert reads == [3]  # within the ttl: no read
    now[0] = 6.0
    text = generate_latest(registry).decode()  # the read fails: the last page still answers
    assert reads == [3, 3] and 'zkc_task_rows{group="g",task="t1"} 10.0' in text
    off = CollectorRegistry()
    off.register(TaskMetricsCollector(read, max_tasks=0))
    assert "zkc_task" not in generate_latest(off).decode() and reads == [3, 3]
