"""How ``make test`` hands the tests to its pytest processes (pytest-xdist, ``--dist loadgroup``).

A unit of work is one test file, so a module-scoped fixture (a cluster of processes) is set up once. The tests
that must not share the machine with more than one other heavy test are *heavy*: Spark JVMs, containers, a
browser, chaos runs and ensembles (everything in tests/e2e), and the integration tests whose broker processes
race a session timeout or a deadline (a starved process there fails the test, not the code). At most
``HEAVY_AT_ONCE`` processes run heavy units at a time, the heaviest units first; the other processes take the
light units (and the few light tests among the heavy paths, ``SHARED_PATHS``), and every process takes light
units once no heavy one is left. Heavy tests mostly wait (for a JVM, a session timeout, a fault's end), so two
of them and a light one keep two cores busy without starving each other.

The units are decided here from the test ids rather than by ``xdist_group`` marks: xdist reads those marks
through the test ids, which pytest 9.2's structured ids no longer carry (pytest-dev/pytest-xdist#1386), and a
mark that silently stops grouping would let the heavy tests starve each other again.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

#: Prefix of a heavy unit's name.
HEAVY = "heavy:"
#: Test-id prefixes of the heavy tests. A test marked ``slow`` must fall under one (tests/conftest.py checks).
HEAVY_PATHS = (
    "tests/e2e/",
    "tests/integration/worker/test_hard_fence.py::",
    "tests/integration/worker/test_full_pipe.py::",
    "tests/integration/worker/test_outage.py::",
    "tests/integration/cli/test_cli_processes.py::",
    "tests/integration/daemon/test_group_protocol.py::test_kill_dash_nine_of_a_worker_process",
)
#: Test-id prefixes under ``HEAVY_PATHS`` that may share the machine after all: in-process chaos runs, whose
#: brokers and controllers are threads of the test process and whose one ZooKeeper is the run's own (no Spark,
#: no broker processes, no ensemble). Their verdicts hold beside a loaded machine (a starved process there
#: delays its fences and its faults alike). They keep their file as their unit; none may be marked ``slow``.
SHARED_PATHS = (
    "tests/e2e/test_chaos.py::test_in_process_",
    "tests/e2e/test_chaos.py::test_a_worker_without_its_fence_is_caught",
    "tests/e2e/test_chaos.py::test_ghost_members_and_rewritten_reports_under_reconcile",
)
#: Files that form one heavy unit together. The container files come in two units of about equal length, so
#: that the longest (the roll, the Spark HA cluster) do not follow the others on one process: as one unit they
#: were the suite's critical path (14 to 17 minutes of a 22-minute run). A process that takes one builds the
#: image once (a quarter of a minute with the engine's layer cache).
GROUPS = {
    "tests/e2e/test_docker.py": "containers",
    "tests/e2e/test_docker_roll.py": "containers-spark",
    "tests/e2e/test_docker_spark_ha.py": "containers-spark",
}
#: The heavy units that take longest, longest first (a scheduling hint measured on a quiet 2-core machine:
#: started first, they leave the short units to even out the processes' ends). Any other heavy unit follows.
HEAVIEST_FIRST = (
    HEAVY + "containers",
    HEAVY + "containers-spark",
    HEAVY + "tests/e2e/test_chaos.py",
    HEAVY + "tests/e2e/test_spark_ha.py",
    HEAVY + "tests/e2e/test_spark_runner.py",
    HEAVY + "tests/e2e/test_isolation.py",
    HEAVY + "tests/e2e/test_pipelines_e2e.py",
    HEAVY + "tests/e2e/test_spark_declarative.py",
)
#: How many processes run heavy units at once (``ZKC_TEST_HEAVY_AT_ONCE``; 1: one at a time).
HEAVY_AT_ONCE = max(1, int(os.environ.get("ZKC_TEST_HEAVY_AT_ONCE", "2")))


def heavy(nodeid: str) -> bool:
    """Whether a test must not share the machine with more than ``HEAVY_AT_ONCE - 1`` other heavy ones."""
    return nodeid.startswith(HEAVY_PATHS) and not nodeid.startswith(SHARED_PATHS)


def work_unit(nodeid: str) -> str:
    """A test's unit: its file (or its group of files), prefixed with ``HEAVY`` for a heavy test."""
    path = nodeid.split("::", 1)[0]
    if heavy(nodeid):
        return HEAVY + GROUPS.get(path, path)
    return path


def next_unit(queue: list[str], heavy_elsewhere: int, limit: int = HEAVY_AT_ONCE) -> str | None:
    """The unit a process takes next from ``queue`` (in queue order), given how many other processes hold a
    heavy unit: a heavy one while fewer than ``limit`` do, else the first light one; None when only heavy
    units are left and ``limit`` processes run them (this process then waits for the end)."""
    allowed = heavy_elsewhere < limit
    for unit in queue:
        if allowed or not unit.startswith(HEAVY):
            return unit
    return None


class HeaviestFirst(OrderedDict[str, Any]):
    """A work queue that keeps the heavy units at its head, in ``HEAVIEST_FIRST`` order, whatever order the
    units come in (xdist fills it largest unit first by number of tests, which is no measure of time)."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key.startswith(HEAVY):
            order = sorted(
                (k for k in self if k.startswith(HEAVY)),
                key=lambda k: HEAVIEST_FIRST.index(k) if k in HEAVIEST_FIRST else len(HEAVIEST_FIRST),
                reverse=True,
            )
            for k in order:
                self.move_to_end(k, last=False)


class TierScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (more work to a process once it is nearly idle), with ``work_unit`` as the
    scope, heavy units first and at most ``HEAVY_AT_ONCE`` processes on heavy units at a time."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.workqueue = HeaviestFirst()

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)

    def _holds_heavy(self, node: Any) -> bool:
        return any(
            scope.startswith(HEAVY) and not all(done.values())
            for scope, done in self.assigned_work.get(node, {}).items()
        )

    def _assign_work_unit(self, node: Any) -> None:
        elsewhere = sum(1 for n in self.assigned_work if n is not node and self._holds_heavy(n))
        unit = next_unit(list(self.workqueue), elsewhere)
        if unit is None:
            return
        work = self.workqueue.pop(unit)
        self.assigned_work.setdefault(node, {})[unit] = work
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work.items() if not done])
