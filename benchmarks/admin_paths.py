"""Admin paths at scale (issue 35, item 1), measured by B10: a one-task create, a first page of 50 tasks,
a first page of a one-task group, and ``status``, on an empty root and on roots of N tasks, same run.

``status`` is measured twice: as operators get it, from the summary an active controller keeps (one
controller per root, started after its tasks are written: ``status_s``), and as the full read of every task
(``status --full``: ``status_full_s``). ``summary_count_s`` is the controller's own cost of one count at that
size (in memory, on its event thread, at most once a second).

Each root's tasks are written in pipelined transactions straight into the bucketed layout (20 groups, none
with a tally yet, as on a root laid out before tallies existed): the first create into a group measures it
from every spec once (reported apart), the next ones read the group's tally only."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import Bench, median
from controller.admin import AdminClient, ensure_layout
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.protocol.tasks.summary import summarize
from controller.zk.client import ZkSettings
from controller.zk.subtrees import delete_tree

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
            tx.create(
                layout.task(t), TaskSpec(id=t, group=f"g{i % GROUPS:02d}", pipeline=NoopPipeline(kind="noop")).encode()
            )
        in_flight.append(tx.commit_async())
        while len(in_flight) > TX_WINDOW:
            in_flight.pop(0).get(timeout=120)
    for a in in_flight:
        a.get(timeout=120)
    return time.perf_counter() - t0


def _spec(task_id: str, group: str = "g00") -> TaskSpec:
    return TaskSpec(id=task_id, group=group, pipeline=NoopPipeline(kind="noop"))


def _start_controller(hosts: str, layout: ZkLayout, n: int) -> Controller:
    """An active controller on ``layout`` whose summary counts the root's ``n`` tasks (+ the probes to come)."""
    ctl = Controller(ControllerConfig(f"bench-{n}", ZkSettings(hosts=hosts, root=layout.root, session_timeout_s=30.0)))
    ctl.start()
    if not ctl.wait_active(300):
        raise RuntimeError(f"no active controller on {layout.root}")
    return ctl


def _wait_summary(admin: AdminClient, n: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        st = admin.status()
        if st.source == "summary" and st.tasks["total"] >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no summary of {n} tasks: {st.source}, {st.fallback}, {st.tasks.get('total')}")
        time.sleep(0.5)


def _count_cost(ctl: Controller, k: int = 5) -> float:
    """The controller's in-memory count at this size, measured on its own context (a copy of the call the
    summary writer makes)."""
    ctx = ctl.ctx
    assert ctx is not None and ctl.epoch is not None
    runs = []
    for _ in range(k):
        t0 = time.perf_counter()
        summarize(
            ctl.epoch,
            time.time(),
            ctx.tasks,
            ctx.invalid_tasks,
            ctx.deleting,
            {g: c.assignment for g, c in ctx.groups.items()},
        )
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def measure(
    bench: Bench, client: Any, prefix: str, sizes: Sequence[int], rounds: int = 15, hosts: str | None = None
) -> dict[str, Any]:
    """The figures on an empty root and at each size. Every root is written first; then each measurement
    takes one turn per root, round after round, so that the machine's load falls on every size alike.
    ``hosts``: start a controller per root, so that ``status`` reads its summary (else only the full read)."""
    roots = {n: ZkLayout(f"{prefix}-{n}") for n in (0, *sizes)}
    out: dict[str, Any] = {}
    controllers: list[Controller] = []
    try:
        for n, layout in roots.items():
            out[str(n)] = {"tasks": n, "write_s": round(write_tasks(client, layout, n), 2)}
            if hosts is not None:
                t0 = time.perf_counter()
                controllers.append(_start_controller(hosts, layout, n))
                out[str(n)]["controller_load_s"] = round(time.perf_counter() - t0, 2)
        admins = {n: AdminClient(client, layout) for n, layout in roots.items()}
        for n, admin in admins.items():
            out[str(n)]["first_create_s"], _ = _timed(lambda: admin.create_tasks([_spec("probe-first")]))
            admin.create_tasks([_spec("solo-1", "solo")])

        def turns(what: str, fn: Callable[[AdminClient, int], Any], k: int) -> None:
            runs: dict[int, list[float]] = {n: [] for n in admins}
            for r in range(k):
                for n, admin in admins.items():
                    runs[n].append(_timed(lambda: fn(admin, r))[0])
            for n in admins:
                out[str(n)][f"{what}_s"] = median(runs[n])
                out[str(n)][f"{what}_runs_s"] = [round(x, 4) for x in runs[n]]

        turns("create", lambda admin, r: admin.create_tasks([_spec(f"probe-{r}")]), rounds)
        turns("page", lambda admin, r: admin.list_page(limit=50), rounds)
        turns("group_page", lambda admin, r: admin.list_page(group="solo", limit=50), 3)
        if hosts is not None:
            for (n, admin), ctl in zip(admins.items(), controllers):
                _wait_summary(admin, n)
                out[str(n)]["summary_count_s"] = _count_cost(ctl)
            turns("status", lambda admin, r: admin.status(), rounds)
            for n, admin in admins.items():
                st = admin.status()
                out[str(n)]["status_source"] = st.source
                out[str(n)]["summary_age_s"] = st.summary_age
        turns("status_full", lambda admin, r: admin.status(full=True), 3)
        for n in admins:
            res = out[str(n)]
            summary = (
                f"status {res['status_s'] * 1000:.1f} ms (from the controller's summary; its count "
                f"{res['summary_count_s'] * 1000:.1f} ms), "
                if "status_s" in res
                else ""
            )
            bench.log(
                f"admin paths at {n:,} tasks: create {res['create_s'] * 1000:.1f} ms (first, measuring its "
                f"group: {res['first_create_s'] * 1000:.0f} ms), first page of 50 {res['page_s'] * 1000:.1f} ms, "
                f"page of a one-task group {res['group_page_s'] * 1000:.0f} ms, "
                + summary
                + f"status --full {res['status_full_s']:.2f} s"
            )
    finally:
        for ctl in controllers:
            ctl.stop()
        for layout in roots.values():
            delete_tree(client, layout.root)
    return out


def main(argv: Sequence[str]) -> None:
    """``python -m benchmarks.admin_paths [N ...]``: the admin paths alone (default 20,000 and 100,000
    tasks beside an empty root), on a fresh embedded ZooKeeper; B10 runs the same after its layout figures."""
    from benchmarks.common import zookeeper
    from controller.zk.client import make_client

    sizes = [int(a) for a in argv] or [20_000, 100_000]
    with zookeeper(heap_mb=2048, name="admin-paths") as zk:
        client = make_client(ZkSettings(hosts=zk.address, root="/admin-paths", session_timeout_s=30.0))
        try:
            bench = Bench()
            bench.write(
                "admin_paths",
                {"sizes": sizes, "admin_paths": measure(bench, client, "/admin-paths", sizes, hosts=zk.address)},
            )
        finally:
            client.stop()
            client.close()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
