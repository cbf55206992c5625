"""Admin paths at scale (issue 35, item 1), measured by B10: a one-task create, a first page of 50 tasks,
a first page of a one-task group, and ``status``, on an empty root and on roots of N tasks, same run.

Each root's tasks are written in pipelined transactions straight into the bucketed layout (20 groups, none
with a tally yet, as on a root laid out before tallies existed): the first create into a group measures it
from every spec once (reported apart), the next ones read the group's tally only."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import Bench, median
from controller.admin import AdminClient, ensure_layout
from controller.protocol.layout import ZkLayout
from controller.protocol.taskspec import NoopPipeline, TaskSpec
from controller.zk.io import delete_tree

GROUPS = 20
CREATES_PER_TX = 250
TX_WINDOW = 16


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def write_tasks(client: Any, layout: ZkLayout, n: int) -> float:
    """``n`` noop task specs in ``GROUPS`` groups (``g00``..), in transactions; returns seconds."""
    t0 = time.perf_counter()
    ensure_layout(client, layout)
    in_flight: list[Any] = []
    for lo in range(0, n, CREATES_PER_TX):
        tx = client.transaction()
        for i in range(lo, min(lo + CREATES_PER_TX, n)):
            t = f"task-{i:06d}"
            tx.create(layout.task(t), TaskSpec(id=t, group=f"g{i % GROUPS:02d}", pipeline=NoopPipeline(kind="noop")).encode())
        in_flight.append(tx.commit_async())
        while len(in_flight) > TX_WINDOW:
            in_flight.pop(0).get(timeout=120)
    for a in in_flight:
        a.get(timeout=120)
    return time.perf_counter() - t0


def measure_root(bench: Bench, client: Any, layout: ZkLayout, n: int, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {"tasks": n, "write_s": round(write_tasks(client, layout, n), 2)}
    admin = AdminClient(client, layout)
    spec = lambda t, g="g00": TaskSpec(id=t, group=g, pipeline=NoopPipeline(kind="noop"))  # noqa: E731
    res["first_create_s"], _ = _timed(lambda: admin.create_tasks([spec("probe-first")]))
    creates = [_timed(lambda i=i: admin.create_tasks([spec(f"probe-{i}")]))[0] for i in range(rounds)]
    res["create_s"], res["create_runs_s"] = median(creates), [round(x, 4) for x in creates]
    admin.create_tasks([spec("solo-1", "solo")])
    pages = [_timed(lambda: admin.list_page(limit=50))[0] for _ in range(rounds)]
    res["page_s"], res["page_runs_s"] = median(pages), [round(x, 4) for x in pages]
    solo = [_timed(lambda: admin.list_page(group="solo", limit=50))[0] for _ in range(3)]
    res["group_page_s"] = median(solo)
    statuses = [_timed(admin.status)[0] for _ in range(3)]
    res["status_s"] = median(statuses)
    bench.log(f"admin paths at {n:,} tasks: create {res['create_s'] * 1000:.1f} ms (first, measuring its group: "
              f"{res['first_create_s'] * 1000:.0f} ms), first page of 50 {res['page_s'] * 1000:.1f} ms, page of a "
              f"one-task group {res['group_page_s'] * 1000:.0f} ms, status {res['status_s']:.2f} s")
    return res


def measure(bench: Bench, client: Any, prefix: str, sizes: Sequence[int], rounds: int = 7) -> dict[str, Any]:
    """The figures on an empty root and at each size (each root deleted after it is measured)."""
    out: dict[str, Any] = {}
    for n in (0, *sizes):
        layout = ZkLayout(f"{prefix}-{n}")
        try:
            out[str(n)] = measure_root(bench, client, layout, n, rounds)
        finally:
            delete_tree(client, layout.root)
    return out
