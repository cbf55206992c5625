"""How ``make test`` hands the tests to its two pytest processes (pytest-xdist, ``--dist loadgroup``).

A unit of work is one test file, so a module-scoped fixture (a cluster of processes) is set up once, except
for the tests that cannot share the machine with another heavy one: Spark JVMs, containers, a browser, chaos
runs and ensembles (everything in tests/e2e), and the integration tests whose broker processes race a session
timeout or a deadline (a starved process there fails the test, not the code). Those form one unit, run in turn
by one process while the other runs the rest, and the few light ones among them (``SHARED_PATHS``).

The units are decided here from the test ids rather than by ``xdist_group`` marks: xdist reads those marks
through the test ids, which pytest 9.2's structured ids no longer carry (pytest-dev/pytest-xdist#1386), and a
mark that silently stops grouping would let the heavy tests starve each other again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from xdist.scheduler import LoadScopeScheduling

EXCLUSIVE = "exclusive"
#: Test-id prefixes of the exclusive unit. A test marked ``slow`` must fall under one (tests/conftest.py checks).
EXCLUSIVE_PATHS = (
    "tests/e2e/",
    "tests/integration/worker/test_hard_fence.py::",
    "tests/integration/worker/test_full_pipe.py::",
    "tests/integration/worker/test_outage.py::",
    "tests/integration/cli/test_cli_processes.py::",
    "tests/integration/daemon/test_group_protocol.py::test_kill_dash_nine_of_a_worker_process",
)
#: Test-id prefixes under ``EXCLUSIVE_PATHS`` that may share the machine after all, so they run beside the
#: exclusive unit instead of lengthening it: in-process chaos runs, whose brokers and controllers are threads
#: of the test process and whose one ZooKeeper is the run's own (no Spark, no broker processes, no ensemble).
#: Their verdicts hold beside a loaded machine (a starved process there delays its fences and its faults
#: alike). They keep their file as their unit; none may be marked ``slow`` (tests/conftest.py checks).
SHARED_PATHS = (
    "tests/e2e/test_chaos.py::test_in_process_",
    "tests/e2e/test_chaos.py::test_a_worker_without_its_fence_is_caught",
    "tests/e2e/test_chaos.py::test_ghost_members_and_rewritten_reports_under_reconcile",
)


def exclusive(nodeid: str) -> bool:
    """Whether a test must not share the machine with another heavy one."""
    return nodeid.startswith(EXCLUSIVE_PATHS) and not nodeid.startswith(SHARED_PATHS)


def work_unit(nodeid: str) -> str:
    """The exclusive unit for an exclusive test, else its file."""
    if exclusive(nodeid):
        return EXCLUSIVE
    return nodeid.split("::", 1)[0]


class ExclusiveFirst(OrderedDict[str, Any]):
    """A work queue that keeps the exclusive unit at its head, whatever order the units come in."""

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if key == EXCLUSIVE:
            self.move_to_end(key, last=False)


class TierScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (largest unit first, more work to a process once it is nearly idle), with
    ``work_unit`` as the scope, except that the exclusive unit goes first: it is the longest by far (the
    suite's wall time is its length), and by its number of tests alone it would queue behind large files
    of fast unit tests."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.workqueue = ExclusiveFirst()

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
