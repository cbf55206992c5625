"""How ``make test`` hands the tests to its two pytest processes (pytest-xdist, ``--dist loadgroup``).

A unit of work is one test file, so a module-scoped fixture (a cluster of processes) is set up once, except
for the tests that cannot share the machine with another heavy one: Spark JVMs, containers, a browser, chaos
runs and ensembles (everything in tests/e2e), and the integration tests whose broker processes race a session
timeout or a deadline (a starved process there fails the test, not the code). Those form one unit, run in turn
by one process while the other runs the rest.

The units are decided here from the test ids rather than by ``xdist_group`` marks: xdist reads those marks
through the test ids, which pytest 9.2's structured ids no longer carry (pytest-dev/pytest-xdist#1386), and a
mark that silently stops grouping would let the heavy tests starve each other again.
"""

from __future__ import annotations

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
    "tests/e2e/test_load_balance_spark.py::",
)


def work_unit(nodeid: str) -> str:
    """The exclusive unit for a test under ``EXCLUSIVE_PATHS``, else its file."""
    if nodeid.startswith(EXCLUSIVE_PATHS):
        return EXCLUSIVE
    return nodeid.split("::", 1)[0]


class TierScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (largest unit first, more work to a process once it is nearly idle), with
    ``work_unit`` as the scope."""

    def _split_scope(self, nodeid: str) -> str:
        return work_unit(nodeid)
