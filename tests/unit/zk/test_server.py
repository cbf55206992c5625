"""The embedded ZooKeeper's set-up, before any server starts: its classpath comes from the jars inside pyspark,
and a missing Java is one clear error saying what to install (the server: tests/integration/zk/test_embedded_zk.py)."""

from __future__ import annotations

import pytest

from controller.zk.server import ZooKeeperServer, ZooKeeperSetupError, free_port, zookeeper_classpath


def test_classpath_comes_from_pyspark():
    cp = zookeeper_classpath()
    assert "pyspark" in cp and "zookeeper-" in cp


def test_missing_java_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    server = ZooKeeperServer(data_dir=tmp_path / "zk", port=free_port())
    with pytest.raises(ZooKeeperSetupError, match="install.*openjdk-17"):
        server.start()
