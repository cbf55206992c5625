"""A small real cluster for the HTTP API and console tests: ``zkctl controller run``, no-op
``zkctl broker run`` processes and ``zkctl api run``, on the test's ZooKeeper root, each stopped by pid.
``api_clusters`` (a fixture, registered through ``pytest_plugins`` in tests/conftest.py) starts such clusters
for a test module on roots of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from controller.protocol.cluster.layout import ZkLayout
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import free_port
from controller.zk.subtrees import delete_tree
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
ZKCTL = [sys.executable, "-m", "cli.main"]
TOKEN = "test-admin-token-8f2c"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class ApiCluster:
    env: dict[str, str]
    logs: Path
    port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    brokers: set[str] = field(default_factory=set)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.procs[name] = subprocess.Popen(
                ZKCTL + list(args), env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
            )
        finally:
            log.close()
        return self.procs[name]

    def start_broker(self, broker_id: str) -> subprocess.Popen:
        """A no-op broker. Its SIGTERM (``stop``) is a controlled shutdown, which the last brokers standing cannot
        complete (nowhere to hand their tasks): they stop after 3 s, not the default 2 minutes."""
        self.brokers.add(broker_id)
        return self.start(
            broker_id,
            "broker",
            "run",
            "--id",
            broker_id,
            "--runner",
            "noop",
            "--session-timeout",
            "4",
            "--shutdown-timeout",
            "3",
        )

    def kill(self, name: str) -> None:
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)

    def stop(self) -> None:
        """The brokers first, while the controller can still hand their tasks over (SIGTERM is a controlled
        shutdown, which waits for the controller), then the rest; what is left after 15 s is killed."""
        deadline = time.monotonic() + 15
        brokers = {n: p for n, p in self.procs.items() if n in self.brokers}
        for wave in (brokers, self.procs):
            for p in wave.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in wave.values():
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)

    def request(
        self, method: str, path: str, body: Any = None, token: str | None = TOKEN, timeout: float = 60
    ) -> Reply:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return Reply(r.status, json.loads(raw) if raw else None, {k.lower(): v for k, v in r.headers.items()})
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return Reply(exc.code, json.loads(raw) if raw else None, {k.lower(): v for k, v in exc.headers.items()})

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def init_root(env: dict[str, str]) -> None:
    """``zkctl init`` on the environment's root: the API and the brokers refuse a root never set up."""
    p = subprocess.run(ZKCTL + ["init"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)


def start_cluster(
    env: dict[str, str], logs: Path, brokers: tuple[str, ...] = ("b1", "b2"), token: str | None = TOKEN
) -> ApiCluster:
    """Controller, brokers and the API server as processes; returns once the API answers and every broker
    is registered. The caller stops it (``ApiCluster.stop``) in a finally."""
    logs.mkdir(parents=True, exist_ok=True)
    env = {**env, "PYTHONPATH": str(REPO), "ZKC_TEST_TOKEN": token or ""}
    init_root(env)  # as an operator does: the brokers may register before the controller sets the root up
    cluster = ApiCluster(env=env, logs=logs, port=free_port())
    try:
        cluster.start(
            "controller", "controller", "run", "--id", "c1", "--rebalance-timeout", "5", "--session-timeout", "4"
        )
        for b in brokers:
            cluster.start_broker(b)
        args = ["api", "run", "--port", str(cluster.port)] + (["--admin-token", "env:ZKC_TEST_TOKEN"] if token else [])
        cluster.start("api", *args)

        def ready() -> bool:
            for name, p in cluster.procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited with {p.returncode}:\n{cluster.log(name)[-3000:]}")
            try:
                r = cluster.request("GET", "/api/v1/brokers", timeout=5)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False
            return r.status == 200 and {b["broker_id"] for b in r.body} >= set(brokers)

        wait_until(ready, 60, "the API to answer with every broker registered", interval=0.25)
        return cluster
    except BaseException:
        cluster.stop()
        raise


#: A running cluster as its tests use it: the processes, a ZooKeeper client of the test's own, the root's layout.
ApiHandle = tuple[ApiCluster, KazooClient, ZkLayout]


@contextmanager
def running_api(
    zk_hosts: str, tmp: Path, prefix: str, brokers: tuple[str, ...] = ("b1", "b2"), token: str | None = TOKEN
) -> Iterator[ApiHandle]:
    """``start_cluster`` on a fresh root ``/<prefix>-<random>`` (state and logs under ``tmp``); at the end the
    processes are stopped, the root deleted and the client closed, also when the test failed."""
    root = f"/{prefix}-{uuid.uuid4().hex[:10]}"
    env = {**os_environ_without_auth(), "ZKC_ZK": zk_hosts, "ZKC_ROOT": root, "ZKC_STATE_DIR": str(tmp / "state")}
    cluster = start_cluster(env, tmp / "logs", brokers=brokers, token=token)
    try:
        zk = make_client(ZkSettings(hosts=zk_hosts, root=root))
    except BaseException:
        cluster.stop()
        raise
    try:
        yield cluster, zk, ZkLayout(root)
    finally:
        cluster.stop()
        try:
            delete_tree(zk, root)
        finally:
            zk.stop()
            zk.close()


@pytest.fixture(scope="module")
def api_clusters(zk_hosts: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ApiHandle]]:
    """Starts a ``running_api`` cluster for the module (``api_clusters("api", brokers=..., token=...)``), each
    torn down when the module's tests are done: a cluster's start costs seconds, its tests share it."""
    with ExitStack() as stack:

        def start(prefix: str, brokers: tuple[str, ...] = ("b1", "b2"), token: str | None = TOKEN) -> ApiHandle:
            tmp = tmp_path_factory.mktemp(prefix)
            return stack.enter_context(running_api(zk_hosts, tmp, prefix, brokers=brokers, token=token))

        yield start


def os_environ_without_auth() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("ZKC_AUTH", "ZKC_AUTH_FILE")}
