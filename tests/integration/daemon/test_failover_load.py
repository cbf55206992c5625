"""The failover load's fast path against a real ZooKeeper: ``zkio.multi_read`` / ``multi_children`` (ZooKeeper's
multiRead request spoken through kazoo) return exactly what kazoo's ``get`` / ``get_children`` return, chunk
large payloads, raise per-znode errors, and fall back to pipelined reads on a server without multiRead; the
controller's multiRead load arms its task watches in the background without losing a spec change made
between the load and the watch, and without stacking watchers.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, UnimplementedError
from kazoo.security import make_digest_acl

from controller import daemon
from controller.daemon import Controller
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.io import InterruptibleClient, children_many, get_many
from controller.zk.multi_read import MULTI_READ_FIRST_OPS, MultiRead, multi_children, multi_read
from controller.zk.watches import AddWatch, PersistentWatches
from tests.controller_support import create_tasks, settle, watches_by_session
from tests.waiting import wait_until


def counting(client: KazooClient) -> list[MultiRead]:
    """Record every multiRead request the client sends."""
    sent: list[MultiRead] = []
    send = client._call

    def call(request: Any, async_object: Any) -> Any:
        if isinstance(request, MultiRead):
            sent.append(request)
        return send(request, async_object)

    client._call = call
    return sent


@pytest.fixture
def client(zk_hosts: str) -> Any:
    c = KazooClient(hosts=zk_hosts, timeout=10)
    c.start(timeout=15)
    try:
        yield c
    finally:
        c.stop()
        c.close()


def _make(zk: KazooClient, items: dict[str, bytes]) -> None:
    pending = []
    paths = list(items)
    for i in range(0, len(paths), 200):
        tx = zk.transaction()
        for p in paths[i : i + 200]:
            tx.create(p, items[p])
        pending.append(tx.commit_async())
    for p in pending:
        assert not any(isinstance(r, Exception) for r in p.get(timeout=60))


# ---- zkio.multi_read ----------------------------------------------------------------------------------
def test_multi_read_returns_what_get_returns_including_missing_znodes(zk, layout, client):
    base = f"{layout.root}/mr"
    zk.ensure_path(base)
    items = {f"{base}/n{i:04d}": (b"" if i % 7 == 0 else f"value-{i}".encode() * (i % 5 + 1)) for i in range(600)}
    _make(zk, items)
    for p in list(items)[::50]:
        zk.set(p, b"rewritten")  # version, mzxid, mtime move: the stat must be the current one
    zk.delete(f"{base}/n0100")
    paths = [f"{base}/absent-0"] + list(items) + [f"{base}/absent-1", f"{layout.root}/no/such/parent"]
    sent = counting(client)
    got = multi_read(client, paths)
    expected = [zk.get(p) if zk.exists(p) else None for p in paths]
    assert got == expected
    assert got[0] is None and got[paths.index(f"{base}/n0100")] is None and got[-1] is None
    assert 2 <= len(sent) <= 5, [len(r.ops) for r in sent]  # 603 reads in a few requests
    assert len(sent[0].ops) == MULTI_READ_FIRST_OPS
    assert multi_read(client, []) == []
    # through the controller's interruptible wrapper, and the same as the pipelined reads
    assert multi_read(InterruptibleClient(client), paths) == got == get_many(client, paths)


def test_multi_read_chunks_large_payloads_by_expected_reply_size(zk, layout, client):
    base = f"{layout.root}/big"
    zk.ensure_path(base)
    big = bytes(range(256)) * 200  # 51,200 bytes
    items = {f"{base}/n{i:04d}": (big[i % 256 :] if i % 10 == 0 else f"small-{i}".encode()) for i in range(3000)}
    _make(zk, items)
    paths = list(items)
    sent = counting(client)
    got = multi_read(client, paths, max_bytes=1024 * 1024)
    assert got == get_many(client, paths)
    assert [r.ops[0][1] for r in sent] == [paths[sum(len(s.ops) for s in sent[:i])] for i in range(len(sent))]
    assert sum(len(r.ops) for r in sent) == 3000
    # 15 MB in replies of about 1 MiB each: not one reply of 15 MB, nor 3,000 requests
    sizes = []
    offset = 0
    for r in sent:
        sizes.append(sum(len(data) for data, _ in got[offset : offset + len(r.ops)]))
        offset += len(r.ops)
    assert max(sizes) <= 2 * 1024 * 1024, sizes
    assert 12 <= len(sent) <= 40, [len(r.ops) for r in sent]
    # small znodes go a thousand to a request
    small = [p for i, p in enumerate(paths) if i % 10]
    sent.clear()
    assert multi_read(client, small) == get_many(client, small)
    assert len(sent) <= 4 and max(len(r.ops) for r in sent) == 1000


def test_multi_read_raises_a_per_znode_error_other_than_no_node(zk, layout, zk_hosts):
    base = f"{layout.root}/acl"
    zk.ensure_path(base)
    zk.create(f"{base}/open", b"open")
    zk.create(f"{base}/secret", b"secret", acl=[make_digest_acl("owner", "pw", all=True)])
    stranger = KazooClient(hosts=zk_hosts, timeout=10)
    stranger.start(timeout=15)
    try:
        with pytest.raises(NoAuthError):
            stranger.get(f"{base}/secret")
        with pytest.raises(NoAuthError):
            multi_read(stranger, [f"{base}/open", f"{base}/secret", f"{base}/gone"])
        assert multi_read(stranger, [f"{base}/open", f"{base}/gone"]) == [stranger.get(f"{base}/open"), None]
    finally:
        stranger.stop()
        stranger.close()
    owner = KazooClient(hosts=zk_hosts, timeout=10, auth_data=[("digest", "owner:pw")])
    owner.start(timeout=15)
    try:
        assert multi_read(owner, [f"{base}/secret"]) == [owner.get(f"{base}/secret")]
    finally:
        owner.stop()
        owner.close()


def test_multi_children_returns_what_get_children_returns(zk, layout, client):
    base = f"{layout.root}/kids"
    zk.ensure_path(base)
    for i in range(5):
        zk.ensure_path(f"{base}/p{i}")
        for j in range(i * 3):
            zk.create(f"{base}/p{i}/c{j}")
    paths = [f"{base}/p{i}" for i in range(5)] + [f"{base}/missing", base]
    got = multi_children(client, paths)
    assert got == [client.get_children(p) if client.exists(p) else None for p in paths]
    assert got == children_many(client, paths)
    assert got[0] == [] and got[5] is None


def test_multi_read_under_a_chroot(zk, layout, zk_hosts, zk_root):
    create_tasks(zk, layout, [f"t{i}" for i in range(20)])
    chrooted = KazooClient(hosts=f"{zk_hosts}{zk_root}", timeout=10)
    chrooted.start(timeout=15)
    try:
        inner = ZkLayout("/")
        paths = [inner.task(f"t{i}") for i in range(21)]
        assert multi_read(chrooted, paths) == get_many(chrooted, paths)
        assert multi_read(chrooted, paths)[0][0] == zk.get(layout.task("t0"))[0]
        assert multi_children(chrooted, [inner.tasks]) == [chrooted.get_children(inner.tasks)]
    finally:
        chrooted.stop()
        chrooted.close()


def test_a_server_without_multi_read_gets_pipelined_reads(zk, layout, zk_hosts):
    """ZooKeeper < 3.6 answers an unknown opcode with UNIMPLEMENTED (and drops the connection, as 3.9 does
    for an opcode it does not know): the client falls back to ``get_many`` and never sends multiRead again."""
    create_tasks(zk, layout, [f"t{i}" for i in range(30)])
    old = KazooClient(hosts=zk_hosts, timeout=10)
    old.start(timeout=15)
    try:
        send = old._call
        rejected: list[MultiRead] = []

        def call(request: Any, async_object: Any) -> Any:
            if isinstance(request, MultiRead):
                rejected.append(request)
                async_object.set_exception(UnimplementedError())
                return None
            return send(request, async_object)

        old._call = call
        paths = [layout.task(f"t{i}") for i in range(31)]
        assert multi_read(old, paths) == get_many(zk, paths)
        assert multi_children(old, [layout.tasks]) == [old.get_children(layout.tasks)]
        assert multi_read(InterruptibleClient(old), paths) == get_many(zk, paths)
        assert len(rejected) == 1
    finally:
        old.stop()
        old.close()


# ---- the controller's load --------------------------------------------------------------------------
def _set_spec(zk: KazooClient, layout: ZkLayout, t: str, **changes: Any) -> None:
    spec = TaskSpec(id=t, group="default", pipeline=NoopPipeline(kind="noop")).model_copy(update=changes)
    zk.set(layout.task(t), spec.encode())


def _watchers(ctl: Controller, layout: ZkLayout, t: str) -> int:
    return len(ctl.client._data_watchers.get(layout.task(t), ()))


def test_a_spec_change_between_the_load_and_its_watch_is_not_lost(cluster, zk, layout, monkeypatch):
    """Driven by the armer's hook, which runs on its thread before each chunk, after the load: a task
    changed before its chunk is armed is caught by the comparison of mzxids, one changed after its chunk was
    armed by its watch; either way the context ends up current and each task has one watcher."""
    monkeypatch.setattr(daemon.loading, "ARM_WATCH_CHUNK", 10)
    ids = [f"t{i:03d}" for i in range(45)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("c0", start=False, task_watch="one-shot")
    chunks: list[list[str]] = []
    touched: dict[str, str] = {}

    def hook(chunk: Any) -> None:
        chunks.append(list(chunk))
        if len(chunks) == 1:  # the load is over, nothing armed yet
            assert ctl.ctx is not None and len(ctl.ctx.tasks) == 45
            touched["paused_before"] = chunk[3]
            _set_spec(zk, layout, chunk[3], state="PAUSED")
            later = [t for t in ids if t not in chunk]
            touched["deleted"] = later[-1]
            zk.delete(layout.task(later[-1]))
        elif len(chunks) == 2:  # the first chunk is armed, this one and the rest are not
            touched["edited_after"] = chunks[0][0]
            _set_spec(zk, layout, chunks[0][0], weight=7)
            later = [t for t in ids if t not in chunks[0] and t not in chunk and t != touched["deleted"]]
            touched["edited_before"] = later[0]
            _set_spec(zk, layout, later[0], weight=9)

    ctl.loader.before_arming = hook
    ctl.start()
    wait_until(
        lambda: ctl.loader.watch_armer is not None and ctl.loader.watch_armer.took_s is not None,
        20,
        "every watch armed",
    )
    armer = ctl.loader.watch_armer
    assert len(chunks) == 5 and armer.armed == 45
    assert armer.changed == 3  # paused_before, deleted, edited_before: the watch caught edited_after

    def current() -> bool:
        tasks = ctl.ctx.tasks
        return (
            tasks[touched["paused_before"]].state == "PAUSED"
            and touched["deleted"] not in tasks
            and tasks[touched["edited_after"]].weight == 7
            and tasks[touched["edited_before"]].weight == 9
        )

    wait_until(current, 10, "the context to show every change")
    settle(ctl)
    live = [t for t in ids if t != touched["deleted"]]
    assert all(_watchers(ctl, layout, t) == 1 for t in live), {t: _watchers(ctl, layout, t) for t in live}
    # a later change fires the one watch, whose re-read re-arms it: still one watcher, still current
    for t in (touched["edited_before"], next(t for t in reversed(chunks[-1]) if t != touched["deleted"])):
        _set_spec(zk, layout, t, weight=11)
        wait_until(lambda: ctl.ctx.tasks[t].weight == 11, 10, f"{t}'s edit seen")
    settle(ctl)
    assert all(_watchers(ctl, layout, t) == 1 for t in live)


@dataclass(frozen=True)
class Reload:
    def process(self, c: Controller) -> None:
        c.reload()


def test_a_reload_stops_the_watch_armer_of_the_load_before(cluster, zk, layout, monkeypatch):
    monkeypatch.setattr(daemon.loading, "ARM_WATCH_CHUNK", 10)
    ids = [f"t{i:03d}" for i in range(30)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("c1", start=False, task_watch="one-shot")
    entered, release = threading.Event(), threading.Event()
    cluster.releases.append(release)
    seen: list[int] = []

    def hook(chunk: Any) -> None:
        seen.append(len(chunk))
        if len(seen) == 2:
            entered.set()
            assert release.wait(20)

    ctl.loader.before_arming = hook
    ctl.start()
    assert entered.wait(20)
    first = ctl.loader.watch_armer
    ctl.put(Reload())
    wait_until(lambda: ctl.loader.watch_armer is not first, 10, "a new load and armer")
    second = ctl.loader.watch_armer
    release.set()
    first.join(5)
    assert not first.is_alive() and first.armed == 10 and first.took_s is None  # stopped between chunks
    wait_until(lambda: second.took_s is not None, 20, "the new armer done")
    assert second.armed == 30 and second.token == ctl.token != first.token
    _set_spec(zk, layout, ids[-1], state="PAUSED")
    wait_until(lambda: ctl.ctx.tasks[ids[-1]].state == "PAUSED", 10, "the change seen through the new watch")


def test_the_pipelined_load_arms_watches_inline_and_starts_no_armer(cluster, zk, layout):
    ids = [f"t{i:03d}" for i in range(20)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("c2", load="pipelined", task_watch="one-shot")
    wait_until(lambda: ctl.active and ctl.ctx is not None, 10, "active")
    assert ctl.loader.watch_armer is None
    assert all(_watchers(ctl, layout, t) == 1 for t in ids)
    _set_spec(zk, layout, ids[0], state="PAUSED")
    wait_until(lambda: ctl.ctx.tasks[ids[0]].state == "PAUSED", 10, "the change seen")
    with pytest.raises(ValueError):
        daemon.ControllerConfig("x", ctl.config.settings, load="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        daemon.ControllerConfig("x", ctl.config.settings, task_watch="bogus")  # type: ignore[arg-type]


@pytest.mark.parametrize("load", ["multiread", "pipelined"])
def test_the_persistent_watch_of_the_tasks_replaces_every_task_watch(cluster, zk, layout, zk_hosts, load):
    """One PERSISTENT_RECURSIVE watch on /tasks, armed before the load reads: no armer, no data watch per
    task, no children watch; a task created, edited, paused or deleted afterwards is seen through it, and
    events below a task (its owner) are not taken for spec changes. A resign removes it on the server."""
    ids = [f"t{i:03d}" for i in range(20)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("c3", load=load)
    wait_until(lambda: ctl.active and ctl.ctx is not None and len(ctl.ctx.tasks) == 20, 10, "active")
    assert ctl.tasks.tree_watched and ctl.loader.watch_armer is None
    assert not any(_watchers(ctl, layout, t) for t in ids)
    assert not ctl.client._child_watchers.get(layout.tasks)
    create_tasks(zk, layout, ["new"])
    _set_spec(zk, layout, ids[0], state="PAUSED")
    _set_spec(zk, layout, ids[1], weight=5)
    zk.delete(layout.task(ids[2]))
    zk.create(layout.task_owner(ids[3]), b"{}", ephemeral=True)  # a child event: no spec re-read
    wait_until(
        lambda: (
            "new" in ctl.ctx.tasks
            and ctl.ctx.tasks[ids[0]].state == "PAUSED"
            and ctl.ctx.tasks[ids[1]].weight == 5
            and ids[2] not in ctl.ctx.tasks
        ),
        10,
        "every change seen",
    )
    settle(ctl)
    watches = PersistentWatches.for_client(ctl.client)
    assert watches.armed(layout.tasks)
    after: list[Any] = []
    ctl.put(
        Resign(
            lambda: after.extend(
                [
                    watches.armed(layout.tasks),
                    ctl.tasks.tree_watched,
                    watches_by_session(zk_hosts).get(ctl.client.client_id[0], set()),
                ]
            )
        )
    )
    settle(ctl)
    assert after[:2] == [False, False] and layout.tasks not in after[2], after  # (before it runs again and wins)


@dataclass(frozen=True)
class Resign:
    then: Any

    def process(self, c: Controller) -> None:
        c.resign("a test asked")
        self.then()


def test_a_server_without_add_watch_gets_one_watch_per_task(cluster, zk, layout):
    """ZooKeeper < 3.6 answers addWatch with UNIMPLEMENTED (as the multiRead test above plays it): the
    controller keeps one data watch per task and a children watch on /tasks, and sees changes through them."""
    ids = [f"t{i:03d}" for i in range(10)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("c4", start=False)
    send = ctl.client._call
    rejected: list[AddWatch] = []

    def call(request: Any, async_object: Any) -> Any:
        if isinstance(request, AddWatch):
            rejected.append(request)
            async_object.set_exception(UnimplementedError())
            return None
        return send(request, async_object)

    ctl.client._call = call
    ctl.start()
    wait_until(lambda: ctl.active and ctl.ctx is not None and len(ctl.ctx.tasks) == 10, 10, "active")
    wait_until(
        lambda: ctl.loader.watch_armer is not None and ctl.loader.watch_armer.took_s is not None,
        20,
        "every watch armed",
    )
    assert len(rejected) == 1 and not ctl.tasks.tree_watched
    assert all(_watchers(ctl, layout, t) == 1 for t in ids)
    create_tasks(zk, layout, ["new"])
    _set_spec(zk, layout, ids[0], state="PAUSED")
    wait_until(lambda: "new" in ctl.ctx.tasks and ctl.ctx.tasks[ids[0]].state == "PAUSED", 10, "changes seen")


def test_the_load_runs_with_the_cyclic_collector_paused_and_gives_it_back(cluster, zk, layout):
    """The load allocates a dozen objects per task and frees almost none: collections it triggered walked
    the growing context again and again (B10: 100,000 tasks loaded in 3.09 s with them, 1.26 s without,
    same run). The collector is paused for the load alone, and on again after it, a failed load included."""
    import gc

    create_tasks(zk, layout, [f"g{i:03d}" for i in range(20)])
    ctl = cluster.controller("c0", start=False)
    seen: list[bool] = []
    load_state = ctl.loader._load_state

    def watched() -> None:
        seen.append(gc.isenabled())
        load_state()

    ctl.loader._load_state = watched  # type: ignore[method-assign]
    assert gc.isenabled()
    ctl.start()
    wait_until(lambda: ctl.ctx is not None and len(ctl.ctx.tasks) == 20, 20, "the state loaded")
    assert seen and not any(seen), "the collector ran during the load"
    # (the context is in place before the load's last steps: the collector comes back once they are over)
    wait_until(gc.isenabled, 20, "the collector on again after the load")

    def failing() -> None:
        seen.append(gc.isenabled())
        raise RuntimeError("a load that fails half-way (injected)")

    ctl.loader._load_state = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        ctl.loader.load()
    assert seen[-1] is False and gc.isenabled()
