"""Spark in HA, the parts without a JVM: the masters' recovery settings (ZooKeeper mode, the cluster's
ensemble, a directory under its root), the URL brokers are given, and a spec refused before anything starts.
(The masters and workers for real: tests/e2e/test_spark_ha.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_sim.deploy.spark_ha import SparkHAError, SparkHASpec, master_url, recovery_conf


def test_the_masters_recover_through_the_clusters_own_ensemble_under_its_root():
    assert recovery_conf("zk1:2181,zk2:2181", "/prod/") == {
        "spark.deploy.recoveryMode": "ZOOKEEPER",
        "spark.deploy.zookeeper.url": "zk1:2181,zk2:2181",
        "spark.deploy.zookeeper.dir": "/prod/spark",
    }
    assert master_url([("m1", 7077), ("m2", 7077)]) == "spark://m1:7077,m2:7077"


@pytest.mark.parametrize(
    ("hosts", "root"), [("", "/zkc"), ("zk1:2181 zk2:2181", "/zkc"), ("zk:2181", "zkc"), ("zk:2181", "/a/../b")]
)
def test_a_bad_ensemble_or_root_is_refused_before_anything_starts(hosts: str, root: str):
    with pytest.raises(SparkHAError):
        SparkHASpec(zk_hosts=hosts, root=root, workdir=Path("unused"))


def test_sizes_out_of_range_are_refused():
    with pytest.raises(SparkHAError):
        SparkHASpec(zk_hosts="zk:2181", root="/zkc", workdir=Path("unused"), masters=0)
    with pytest.raises(SparkHAError):
        SparkHASpec(zk_hosts="zk:2181", root="/zkc", workdir=Path("unused"), workers=9)


def test_zkctl_spark_up_refuses_a_bad_ensemble_in_one_line_and_starts_nothing(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli

    res = CliRunner().invoke(cli, ["--zk", "zk1:2181 zk2:2181", "--state-dir", str(tmp_path), "spark", "up"])
    assert res.exit_code == 1 and "expected host:port" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "spark").exists()
