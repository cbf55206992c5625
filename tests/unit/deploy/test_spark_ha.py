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


def test_the_masters_sasl_login_is_a_jaas_file_for_their_eyes_only(tmp_path):
    from broker_sim.deploy.spark_ha import SASL_DIGEST_OPT, SparkHA, write_client_jaas

    jaas = write_client_jaas(tmp_path / "c" / "client.jaas", "spark-masters:pw-1\n")
    text = jaas.read_text()
    assert text.startswith("Client {") and 'username="spark-masters"' in text and 'password="pw-1";' in text
    assert jaas.stat().st_mode & 0o777 == 0o600
    spec = SparkHASpec(zk_hosts="zk:2181", root="/zkc", workdir=tmp_path / "w", jaas_file=jaas)
    ha = SparkHA(spec)  # (nothing started: its processes' environments only)
    master_opts = ha._env(master=True)["SPARK_DAEMON_JAVA_OPTS"]
    assert f"-Djava.security.auth.login.config={jaas.resolve()}" in master_opts and SASL_DIGEST_OPT in master_opts
    assert "login.config" not in ha._env()["SPARK_DAEMON_JAVA_OPTS"]  # workers do not talk to ZooKeeper
    for bad in ("no-colon", ":pw", "u:", 'u:p"w', "u:p;w", "u:p\\w", "u:p\nw"):
        with pytest.raises(SparkHAError):
            write_client_jaas(tmp_path / "bad.jaas", bad)
    with pytest.raises(SparkHAError):
        SparkHASpec(zk_hosts="zk:2181", root="/zkc", workdir=tmp_path, jaas_file=tmp_path / "missing.jaas")
    with pytest.raises(SparkHAError):
        SparkHASpec(zk_hosts="zk:2181", root="/zkc", workdir=tmp_path, worker_timeout_s=1)


def test_spark_containers_need_the_spark_runner_and_sizes_in_range():
    from broker_sim.deploy.containers import ClusterSpec

    assert ClusterSpec(runner="spark", spark_masters=2, spark_workers=2).spark_masters == 2
    for bad in (
        {"runner": "noop", "spark_masters": 2},
        {"runner": "spark", "spark_masters": 6},
        {"runner": "spark", "spark_masters": 2, "spark_workers": 0},
    ):
        with pytest.raises(ValueError):
            ClusterSpec(**bad)
