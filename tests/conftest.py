"""Shared fixtures: one real ZooKeeper per test session (stopped by pid, also on failure), a fresh root
per test, kazoo clients. Spark sessions are shared too (see tests/spark_support.py).

With pytest-xdist (``make test``: three processes, ``--dist loadgroup``) each process is a session of its own:
its own ZooKeeper on a free port, its own temporary directories and its own state directory; which process runs
which tests: tests/xdist_support.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings
from kazoo.client import KazooClient

from controller.admin import ensure_layout
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import ZooKeeperServer, free_port
from controller.zk.subtrees import delete_tree

if TYPE_CHECKING:
    from xdist.remote import Producer

    from tests.xdist_support import TierScheduling

# The fixtures the tiers share, registered once here (a test names one as a parameter, never imports it).
pytest_plugins = [
    "tests.api_support",
    "tests.broker_processes",
    "tests.controller_support",
    "tests.docker_support",
    "tests.security_fixtures",
    "tests.spark_support",
]

# Property tests check what holds, not how fast: Hypothesis's per-example deadline (200 ms) would turn a loaded
# machine into a red run; speed is the benchmarks' business (benchmarks/).
settings.register_profile("zkc", deadline=None)
settings.load_profile("zkc")

_STATE_DIR = "ZKC_STATE_DIR"


def pytest_configure(config: pytest.Config) -> None:
    """A state directory of this run's own (brokers' lease files, Spark's default checkpoints), so that the
    checkout gets no ``.zkc``, with a subdirectory per xdist process so that two never share one; a directory
    given in the environment is the base. Set before collection: modules read it when imported."""
    if _STATE_DIR not in os.environ:
        base = tempfile.mkdtemp(prefix="zkc-test-state-")
        os.environ[_STATE_DIR] = base
        config.add_cleanup(lambda: shutil.rmtree(base, ignore_errors=True))
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker:  # an xdist process: the base came from the controlling process's environment
        os.environ[_STATE_DIR] = os.path.join(os.environ[_STATE_DIR], worker)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked slow runs among the heavy units of ``make test`` (tests/xdist_support.py): say so if not."""
    from tests.xdist_support import heavy

    stray = [i.nodeid for i in items if i.get_closest_marker("slow") and not heavy(i.nodeid)]
    if stray:
        raise pytest.UsageError(
            f"marked slow but not heavy (tests/xdist_support.py's HEAVY_PATHS, SHARED_PATHS): {stray}"
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> TierScheduling | None:
    """``--dist loadgroup``: the units of tests/xdist_support.py (any other mode: xdist's own)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_support import TierScheduling

    return TierScheduling(config, log)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """A real standalone ZooKeeper from the jars inside pyspark, on a free loopback port."""
    server = ZooKeeperServer(data_dir=tmp_path_factory.mktemp("zookeeper"), port=free_port(), tick_ms=200)
    server.start(timeout=90)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_hosts(zk_server: ZooKeeperServer) -> str:
    return zk_server.address


@pytest.fixture
def zk_root() -> str:
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def layout(zk_root: str) -> ZkLayout:
    return ZkLayout(zk_root)


@pytest.fixture
def zk_settings(zk_hosts: str, zk_root: str) -> ZkSettings:
    return ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=4.0)


@pytest.fixture
def zk(zk_settings: ZkSettings, layout: ZkLayout) -> Iterator[KazooClient]:
    """A connected kazoo client with this test's root laid out; the root is deleted afterwards."""
    client = make_client(zk_settings)
    ensure_layout(client, layout)
    try:
        yield client
    finally:
        try:
            delete_tree(client, layout.root)
        except Exception:
            pass
        client.stop()
        client.close()


@pytest.fixture
def cli_env(zk_hosts: str, zk_root: str, tmp_path: Path, zk: KazooClient) -> dict[str, str]:
    """Environment for running `zkctl` as a subprocess against this test's ZooKeeper and root (set up by the
    ``zk`` fixture, as ``zkctl init`` does); the record of started servers under the test's own home."""
    env = dict(os.environ)
    env.update(
        ZKC_ZK=zk_hosts, ZKC_ROOT=zk_root, ZKC_STATE_DIR=str(tmp_path / "state"), ZKC_HOME=str(tmp_path / "home")
    )
    return env
