"""Shared fixtures: one real ZooKeeper per test session (stopped by pid, also on failure), a fresh root
per test, kazoo clients. Spark sessions are shared too (see tests/spark_support.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from kazoo.client import KazooClient

from controller.admin import ensure_layout
from controller.protocol.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import ZooKeeperServer, free_port
from controller.zk.io import delete_tree


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
