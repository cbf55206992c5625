"""Hostile names: a child whose name cannot be one of ours (``evil<b>`` under ``/brokers/ids``, ``bad<g>`` under
``/groups``, ...), as a broker's credentials can create, is data like any other: every surface leaves it out
(and logs it), the controller activates and sweeps it, and nothing else is hidden by it. Real ZooKeeper, a
real controller and worker, the real HTTP server."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from broker_sim.worker import Worker, WorkerConfig
from controller.admin import AdminClient, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings
from tests.api_support import REPO, ZKCTL


def bad_paths(layout: ZkLayout) -> list[str]:
    """One illegal child in every container whose children are named after something of ours."""
    return [
        f"{layout.broker_ids}/evil<b>",
        f"{layout.groups}/bad<g>",
        f"{layout.intervals}/bad<i>",
        f"{layout.group_members('default')}/m<x>",
        f"{layout.group_assignments('default')}/a<x>",
        f"{layout.admin_delete_tasks}/d<t>",
        f"{layout.admin_reassign}/r<t>",
        f"{layout.admin_controlled_shutdown}/s<2>",
    ]


def plant(zk: KazooClient, layout: ZkLayout) -> list[str]:
    paths = bad_paths(layout)
    for p in paths:
        zk.create(p, b"{}", makepath=True)
    return paths


@pytest.fixture
def worker(zk: KazooClient, zk_settings: ZkSettings) -> Iterator[Worker]:
    w = Worker(WorkerConfig("b0", zk_settings, status_interval_s=0.1, intervals_flush_s=0.2, on_halt="kill")).start()
    try:
        assert wait_for(lambda: zk.exists(ZkLayout(zk_settings.root).broker("b0")) is not None, 15)
        yield w
    finally:
        w.stop()


def test_admin_reads_leave_bad_names_out(zk: KazooClient, layout: ZkLayout, worker: Worker, caplog) -> None:
    """No controller (nothing sweeps): status, broker list, groups, intervals and watch list the rest."""
    caplog.set_level("WARNING")
    plant(zk, layout)
    admin = AdminClient(zk, layout)
    for full in (False, True):
        st = admin.status(full=full)
        assert [b.broker_id for b in st.brokers] == ["b0"]
        assert "bad<g>" not in [g.group for g in st.groups]
    assert [b.broker_id for b in admin.brokers()] == ["b0"]
    assert "bad<g>" not in [g.summary.group for g in admin.describe_group()]
    assert admin.intervals() == []
    first = next(iter(admin.watch(duration=1.0)))
    assert first is not None and "1 brokers" in first.message
    assert "evil<b>" in caplog.text and "not a legal broker id" in caplog.text


def test_cli_status_and_broker_list_leave_bad_names_out(
    zk: KazooClient, layout: ZkLayout, worker: Worker, cli_env: dict[str, str]
) -> None:
    plant(zk, layout)
    env = {**cli_env, "PYTHONPATH": str(REPO)}
    for args in (["status"], ["broker", "list"], ["group", "describe"]):
        r = subprocess.run(ZKCTL + args, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        assert "b0" in r.stdout and "evil" not in r.stdout and "bad<g>" not in r.stdout
    # the raw tree shows every name, as data: a right-to-left override is printed as its escape
    zk.create(f"{layout.groups}/rtl\u202egnp", b"")
    r = subprocess.run(ZKCTL + ["zk", "tree"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0 and "rtl\\u202egnp" in r.stdout and "\u202e" not in r.stdout, r.stdout


@contextlib.contextmanager
def api_server(zk: KazooClient, layout: ZkLayout) -> Iterator[Callable[..., tuple[int, Any]]]:
    """The real HTTP server (uvicorn, in a named thread) on this root; yields ``call(method, path, body)``."""
    import uvicorn

    from controller.api.app import create_app
    from controller.api.context import ApiConfig
    from controller.zk.server import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ApiConfig(zk, layout)), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="test-api-server", daemon=True)
    thread.start()

    def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        assert wait_for(lambda: bool(getattr(server, "started", False)), 15)
        yield call
    finally:
        server.should_exit = True
        thread.join(10)


def test_http_api_listings_leave_bad_names_out(zk: KazooClient, layout: ZkLayout, worker: Worker) -> None:
    """The listings the console draws from answer 200 with the good entries, not 404 for the whole list."""
    plant(zk, layout)
    with api_server(zk, layout) as call:
        code, status = call("GET", "/status")
        assert code == 200 and isinstance(status, dict)
        assert [b["broker_id"] for b in status["brokers"]] == ["b0"]
        code, brokers = call("GET", "/brokers")
        assert code == 200 and isinstance(brokers, list) and [b["broker_id"] for b in brokers] == ["b0"]
        code, groups = call("GET", "/groups")
        assert code == 200 and isinstance(groups, list) and "bad<g>" not in json.dumps(groups)
        code, intervals = call("GET", "/intervals")
        assert code == 200 and intervals == []


def test_a_404_quotes_a_bounded_escaped_prefix_of_the_id(zk: KazooClient, layout: ZkLayout) -> None:
    huge = "<script>" + "x" * 6000
    with api_server(zk, layout) as call:
        for method, path, body in (
            ("GET", f"/tasks/{urllib.parse.quote(huge)}", None),
            ("GET", f"/groups/{urllib.parse.quote(huge)}", None),
            ("PATCH", f"/settings?group={urllib.parse.quote(huge)}", {"max_moves": 1}),
        ):
            code, err = call(method, path, body)
            assert code == 404 and err["error"] == "not_found", (path[:40], code, err)
            assert len(err["message"]) < 300 and "6008 characters" in err["message"], err["message"][:300]
        code, err = call("PATCH", "/settings?group=nosuchgroup", {"max_moves": 1})
        assert code == 404 and "unknown group 'nosuchgroup'" in err["message"]
        assert zk.exists(layout.settings) is None or b"nosuchgroup" not in zk.get(layout.settings)[0]


def test_controller_activates_past_bad_names_and_sweeps_them(
    zk: KazooClient, layout: ZkLayout, zk_settings: ZkSettings, worker: Worker
) -> None:
    """Present at activation (startup load) and created later (event handlers): the controller activates,
    assigns, and deletes every illegal name it finds."""
    paths = plant(zk, layout)
    zk.create(layout.task("t1"), TaskSpec(id="t1", pipeline=NoopPipeline(kind="noop")).encode())
    ctl = Controller(ControllerConfig("c0", zk_settings, GroupConfig(rebalance_timeout_s=3.0))).start()
    try:
        assert ctl.wait_active(15)
        assert wait_for(lambda: worker.running_tasks() == {"t1"}, 20)
        assert wait_for(lambda: all(zk.exists(p) is None for p in paths), 15), [p for p in paths if zk.exists(p)]
        later = [f"{layout.groups}/late<g>", f"{layout.broker_ids}/late<b>", f"{layout.admin_reassign}/late<t>"]
        for p in later:
            zk.create(p, b"")
        zk.create(layout.task("t2"), TaskSpec(id="t2", pipeline=NoopPipeline(kind="noop")).encode())
        assert wait_for(lambda: worker.running_tasks() == {"t1", "t2"}, 20)
        assert wait_for(lambda: all(zk.exists(p) is None for p in later), 15), [p for p in later if zk.exists(p)]
        assert ctl.active and ctl.ctx is not None and ctl.thread.is_alive()
    finally:
        ctl.stop()


class LoadFailingClient(KazooClient):
    """A real client whose listing of ``/groups`` fails: every activation of its controller fails to load."""

    def __init__(self, settings: ZkSettings) -> None:
        super().__init__(hosts=settings.hosts, timeout=settings.session_timeout_s)
        self.groups_path = ZkLayout(settings.root).groups
        self.refused = 0

    def get_children_async(self, path: str, watch=None, include_data: bool = False):  # type: ignore[no-untyped-def]
        if path == self.groups_path:
            self.refused += 1
            raise RuntimeError("injected: the context cannot be loaded")
        return super().get_children_async(path, watch=watch, include_data=include_data)


def test_a_controller_whose_activation_fails_resigns_and_a_standby_takes_over(
    zk: KazooClient, layout: ZkLayout, zk_settings: ZkSettings, worker: Worker
) -> None:
    client = LoadFailingClient(zk_settings)
    failing = Controller(ControllerConfig("c-bad", zk_settings, GroupConfig(rebalance_timeout_s=3.0)), client=client)
    failing.start()
    standby: Controller | None = None
    try:
        assert wait_for(lambda: client.refused >= 1, 15)
        assert wait_for(lambda: zk.exists(layout.controller) is None, 5), "the seat is held without a context"
        zk.create(layout.task("t1"), TaskSpec(id="t1", pipeline=NoopPipeline(kind="noop")).encode())
        standby = Controller(ControllerConfig("c-good", zk_settings, GroupConfig(rebalance_timeout_s=3.0))).start()
        assert standby.wait_active(20)
        assert wait_for(lambda: worker.running_tasks() == {"t1"}, 20)
        assert not (failing.active and failing.ctx is None)
    finally:
        if standby is not None:
            standby.stop()
        failing.stop()
