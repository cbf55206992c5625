"""The pure tier: state machines, assignors, codecs, layouts and the protocol simulation, with no ZooKeeper,
no process and no Spark (``make test-fast``). A test here that asks for a ZooKeeper fixture is refused, so
the tier stays what its name says."""

from __future__ import annotations

import pytest

_IO_FIXTURES = frozenset({"zk_server", "zk_hosts", "zk", "zk_settings", "cli_env", "spark"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = _IO_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if used and "tests/unit/" in item.nodeid.replace("\\", "/"):
            raise pytest.UsageError(
                f"{item.nodeid} is in the pure tier but uses {sorted(used)}: move it to tests/integration"
            )
