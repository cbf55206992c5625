"""Watches that survive a dropped connection. kazoo does not re-register watches when it reconnects within
a session: on SUSPENDED it fires every watcher it holds with an event of type NONE and forgets them all,
and the server drops the watches of the closed connection. Each of ours must therefore come back by its
own means. These tests ask the server which watches each session holds (``wchc``) before and after a
connection drop, and check that a change made after it is still noticed."""

from __future__ import annotations

import time

import pytest
from kazoo.client import KazooClient

from broker_sim.sim.netproxy import NetProxy
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec, decode_task
from controller.zk.client import ZkSettings
from controller.zk.watches import PersistentWatches
from tests.controller_support import settle, watches_by_session
from tests.waiting import wait_until


def steady_watches(hosts: str, session: int, timeout: float = 10.0) -> set[str]:
    """A session's watched paths once two looks 0.3 s apart agree."""
    deadline = time.monotonic() + timeout
    last = watches_by_session(hosts).get(session, set())
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = watches_by_session(hosts).get(session, set())
        if now == last:
            return now
        last = now
    return last


@pytest.mark.parametrize("task_watch", ["persistent", "one-shot"])
def test_no_watch_is_lost_when_the_connection_drops(cluster, zk, layout, zk_hosts, zk_root, task_watch):
    host, port = zk_hosts.split(":")
    proxy = NetProxy(host, int(port), name="proxy-watches")
    try:
        via_proxy = ZkSettings(hosts=proxy.address, root=zk_root, session_timeout_s=10.0)
        for i in range(4):
            zk.create(layout.task(f"t{i}"), TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")).encode())
        ctl = cluster.controller("c", settings=via_proxy, task_watch=task_watch)
        w = cluster.worker("w", settings=via_proxy, status_interval_s=0.1)
        direct = cluster.worker("d", status_interval_s=0.1)
        wait_until(
            lambda: (
                len(w.running_tasks()) + len(direct.running_tasks()) == 4 and w.state() == direct.state() == "Stable"
            ),
            20,
            "4 tasks running on 2 workers",
        )
        settle(ctl)
        wait_until(lambda: ctl.client.client_id and w.client.client_id, 15, "both connected")
        sessions = {"controller": ctl.client.client_id[0], "worker": w.client.client_id[0]}
        before = {name: steady_watches(zk_hosts, s) for name, s in sessions.items()}
        if task_watch == "persistent":  # one recursive watch instead of one per task
            assert ctl.tasks.tree_watched and layout.tasks in before["controller"]
            assert not any(p.startswith(layout.tasks + "/") for p in before["controller"]), before["controller"]
        else:
            assert {layout.task(f"t{i}") for i in range(4)} <= before["controller"], before["controller"]
        assert any("/tasks/" in p for p in before["worker"]), before["worker"]

        proxy.reset()  # both lose their connection and reconnect at once, within their sessions
        wait_until(lambda: ctl.connected and ctl.client.connected and w.client.connected, 15, "reconnected")
        settle(ctl)
        # (read once connected: a client between connections has no session id to show)
        wait_until(lambda: ctl.client.client_id and w.client.client_id, 15, "both connected after settling")
        assert ctl.client.client_id[0] == sessions["controller"] and w.client.client_id[0] == sessions["worker"], (
            "a session was lost with the connection (the test needs the same sessions)"
        )

        def still_needed(name: str, path: str) -> bool:
            """A watch whose znode is gone (an old generation's sync) or, for the worker, on the spec of a task
            it no longer holds (a rebalance still finishing under load moved it) has no reason to stay."""
            if zk.exists(path) is None:
                return False
            held = {layout.task(t) for t in w.running_tasks()}
            return not (name == "worker" and layout.task_of(path) is not None and path not in held)

        for name, s in sessions.items():
            deadline = time.monotonic() + 10
            while (
                lost := {p for p in before[name] - steady_watches(zk_hosts, s) if still_needed(name, p)}
            ) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not lost, f"the {name} lost its watches of {sorted(lost)} with the connection"

        # and they work: a task paused after the drop is seen by the controller and let go by its worker
        mine = sorted(w.running_tasks())[0]
        data, stat = zk.get(layout.task(mine))
        spec = decode_task(data, layout.task(mine))
        zk.set(layout.task(mine), spec.model_copy(update={"state": "PAUSED"}).encode(), version=stat.version)
        wait_until(lambda: ctl.ctx.tasks[mine].state == "PAUSED", 10, "the controller saw the pause")
        wait_until(lambda: mine not in w.running_tasks() | direct.running_tasks(), 15, "the paused task stopped")
    finally:
        proxy.close()


def _client(hosts: str, **kw) -> KazooClient:
    c = KazooClient(hosts=hosts, timeout=10.0, **kw)
    c.start(timeout=15)
    return c


def test_a_recursive_watch_reports_every_change_below_it_and_stays_armed(zk, layout, zk_hosts):
    c = _client(zk_hosts)
    try:
        root = layout.root + "/pw"
        c.ensure_path(root + "/a")
        seen: list[tuple[str, str | None]] = []
        once: list[str] = []
        watches = PersistentWatches.for_client(c)
        assert PersistentWatches.for_client(c) is watches  # one registry per client
        assert watches.add(root, lambda e: seen.append((e.type, e.path)))
        c.get(root + "/a", watch=lambda e: once.append(e.type))  # a one-shot watch on a watched path
        c.create(root + "/a/b", b"1")
        c.set(root + "/a", b"x")
        c.set(root + "/a", b"y")  # the one-shot watch fired already; the persistent one still reports
        c.delete(root + "/a/b")
        c.create(root + "-sibling")  # not below the watched path
        wait_until(lambda: len(seen) == 4, 5, "four events")
        assert seen == [
            ("CREATED", root + "/a/b"),
            ("CHANGED", root + "/a"),
            ("CHANGED", root + "/a"),
            ("DELETED", root + "/a/b"),
        ]
        assert once == ["CHANGED"]
        assert root in watches_by_session(zk_hosts)[c.client_id[0]]
        watches.remove(root)
        assert root not in watches_by_session(zk_hosts).get(c.client_id[0], set())
        c.set(root + "/a", b"z")
        time.sleep(0.3)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert len(seen) == 4
    finally:
        c.stop()
        c.close()


def test_a_persistent_watch_is_rearmed_after_the_connection_drops(zk, layout, zk_hosts):
    host, port = zk_hosts.split(":")
    proxy = NetProxy(host, int(port), name="proxy-persistent")
    c = _client(proxy.address)
    try:
        root = layout.root + "/pw2"
        c.ensure_path(root)
        seen: list[tuple[str, str | None]] = []
        watches = PersistentWatches.for_client(c)
        assert watches.add(root, lambda e: seen.append((e.type, e.path)))
        proxy.reset()
        wait_until(lambda: ("NONE", None) in seen, 5, "the owner told the watch may have missed changes")
        wait_until(lambda: c.connected, 10, "reconnected")
        wait_until(lambda: watches.armed(root), 5, "re-armed on CONNECTED")
        watches.ensure(root)
        assert root in watches_by_session(zk_hosts)[c.client_id[0]]
        zk.create(root + "/after")
        wait_until(lambda: ("CREATED", root + "/after") in seen, 5, "a change after the reconnect reported")
    finally:
        c.stop()
        c.close()
        proxy.close()
