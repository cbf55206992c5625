"""Shared fixtures: one real ZooKeeper per test session (stopped by pid, also on failure), a fresh root
per test, kazoo clients. Spark sessions are shared too (see tests/spark_support.py).

With pytest-xdist (``make test``: two processes, ``--dist loadgroup``) each process is a session of its own:
its own ZooKeeper on a free port, its own temporary directories and its own state directory. The tests that
cannot share the machine with another heavy one run one after another in one group (``EXCLUSIVE``)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from controller.admin import ensure_layout
from controller.protocol.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import delete_tree
from controller.zk.server import ZooKeeperServer, free_port

#: The xdist group of the tests that cannot share the machine: Spark JVMs, containers, a browser, chaos runs and
#: ensembles (everything in tests/e2e), the integration tests marked slow, and those whose broker processes race
#: a session timeout or a deadline (a starved process there fails the test, not the code). One process runs
#: them in turn while the other runs the rest.
EXCLUSIVE = "exclusive"
_EXCLUSIVE_PATHS = ("tests/e2e/", "tests/integration/test_hard_fence.py", "tests/integration/test_outage.py",
                    "tests/integration/test_cli_processes.py")
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


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.replace("\\", "/")
        if path.startswith(_EXCLUSIVE_PATHS) or item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(EXCLUSIVE))
        elif _shares_a_module_fixture(item):  # one set-up (a cluster of processes), not one per process
            item.add_marker(pytest.mark.xdist_group(path.split("::", 1)[0]))


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return any(d.scope in ("module", "class", "package") for fixturedefs in defs.values() for d in fixturedefs)


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
def cli_env(zk_hosts: str, zk_root: str, tmp_path: Path) -> dict[str, str]:
    """Environment for running `zkctl` as a subprocess against this test's ZooKeeper and root."""
    env = dict(os.environ)
    env.update(ZKC_ZK=zk_hosts, ZKC_ROOT=zk_root, ZKC_STATE_DIR=str(tmp_path / "state"))
    return env
