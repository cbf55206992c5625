"""The controller against a real ZooKeeper: watch firings handled one event at a time and in order, batched
and pipelined writes (thousands of tasks created and deleted in few requests, a task deleted only after its
owner lets go), metrics, broker membership, and the group's writes (old generations deleted blind, holds
kept across a failover).

Every controller, worker, client and server a test starts is registered with the ``cluster`` fixture,
which stops it (servers by pid) also when the test fails.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
import urllib.request
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from prometheus_client.parser import text_string_to_metric_families

from broker_sim.worker import Worker
from controller.daemon import Controller
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, group_messages, registration_records, task_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings
from controller.zk.layout_io import list_statuses, list_tasks
from tests.controller_support import (
    Block,
    Probe,
    create_tasks,
    group_state,
    join_request,
    request_deletions,
    request_rebalance,
    settle,
    view,
)
from tests.waiting import wait_until

WRITE_REQUESTS = ("Create", "SetData", "Delete", "Transaction")


# ---- 3. one event at a time, in order -------------------------------------------------------------
class RecordingController(Controller):
    """Records every ``process`` call: the thread it ran on, its interval, and how many were inside at once."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.inside = 0
        self.max_inside = 0
        self.calls: list[tuple[str, int, int, str]] = []

    def _process(self, event: Any) -> None:
        self.inside += 1
        self.max_inside = max(self.max_inside, self.inside)
        start = time.monotonic_ns()
        try:
            super()._process(event)
        finally:
            self.calls.append((threading.current_thread().name, start, time.monotonic_ns(), type(event).__name__))
            self.inside -= 1


def test_concurrent_watch_firings_are_processed_one_at_a_time_in_order(cluster, zk, layout):
    ctl = cluster.controller("solo", cls=RecordingController)
    wait_until(lambda: ctl.active and ctl.ctx is not None, 10, "active")

    probes: list[int] = []
    arrival: list[int] = []
    order_lock = threading.Lock()
    seq = itertools.count()
    barrier = threading.Barrier(20)
    member_client = cluster.client()

    def make_tasks(k: int) -> None:
        barrier.wait(10)
        for i in range(10):
            zk.create(layout.task(f"k{k}-{i}"), TaskSpec(id=f"k{k}-{i}", pipeline=NoopPipeline(kind="noop")).encode())

    def make_members(k: int) -> None:
        barrier.wait(10)
        for i in range(3):
            m = f"m{k}-{i}"
            member_client.create(layout.group_member("default", m), join_request(m), ephemeral=True, makepath=True)

    def put_probes(k: int) -> None:
        barrier.wait(10)
        for _ in range(50):
            with order_lock:  # one arrival order across the producing threads
                n = next(seq)
                arrival.append(n)
                ctl.put(Probe(n, probes))

    jobs = [make_tasks] * 8 + [make_members] * 6 + [put_probes] * 6
    threads = [threading.Thread(target=fn, args=(k,), name=f"test-producer-{k}") for k, fn in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    wait_until(lambda: len(probes) == 300, 10, "all probes processed")
    wait_until(lambda: len(ctl.ctx.tasks) == 80, 10, "all tasks seen")
    # (member znodes with no broker behind them: seen, and set apart as ghosts)
    wait_until(lambda: len([k for k in ctl.ctx.ghost_members if k[0] == "default"]) == 18, 10, "all members seen")
    settle(ctl)

    assert probes == arrival  # arrival order preserved
    assert ctl.max_inside == 1
    calls = list(ctl.calls)
    assert {name for name, *_ in calls} == {ctl.thread.name}
    ordered = sorted(calls, key=lambda c: c[1])
    overlaps = [(a, b) for a, b in zip(ordered, ordered[1:]) if b[1] < a[2]]
    assert overlaps == []
    kinds = collections.Counter(k for *_, k in calls)
    # new tasks come through the persistent watch of /tasks as (merged) spec re-reads, not a children listing
    assert kinds["TaskConfigChange"] + kinds["TaskConfigChanges"] >= 1 and kinds["TaskChange"] == 0, kinds
    assert kinds["MembersChange"] >= 1 and kinds["Probe"] == 301, kinds


# ---- 4. batched and pipelined writes --------------------------------------------------------------
def test_five_thousand_tasks_run_and_are_deleted_in_few_requests(cluster, zk, layout, zk_hosts, zk_root):
    # one Python process hosts the controller and three workers here, so allow a generous session timeout
    settings = ZkSettings(hosts=zk_hosts, root=zk_root, session_timeout_s=20.0)
    n = 5000
    ids = [f"t{i:05d}" for i in range(n)]
    t0 = time.monotonic()
    create_tasks(zk, layout, ids)
    created = time.monotonic() - t0

    ctl = cluster.controller("bulk", settings=settings, start=False)
    requests: collections.Counter[str] = collections.Counter()
    send = ctl.client._call

    def counting_call(request: Any, async_object: Any) -> Any:
        requests[type(request).__name__] += 1
        return send(request, async_object)

    ctl.client._call = counting_call
    t0 = time.monotonic()
    ctl.start()
    wait_until(lambda: ctl.active and ctl.ctx is not None and len(ctl.ctx.tasks) == n, 30, "all tasks loaded")
    loaded = time.monotonic() - t0
    workers = [cluster.worker(f"w{i}", settings=settings) for i in range(3)]
    wait_until(lambda: sum(len(w.running_tasks()) for w in workers) == n, 180, "all 5000 tasks running", interval=0.1)
    running = time.monotonic() - t0
    owned = [w.running_tasks() for w in workers]
    assert set().union(*owned) == set(ids) and sum(map(len, owned)) == n
    start_requests = dict(requests)
    start_writes = sum(requests[k] for k in WRITE_REQUESTS)
    assert start_writes < 100, start_requests

    requests.clear()
    t0 = time.monotonic()
    request_deletions(zk, layout, ids)
    wait_until(lambda: list_tasks(zk, layout) == [], 180, "all tasks deleted", interval=0.1)
    wait_until(lambda: zk.get_children(layout.admin_delete_tasks) == [], 10, "all requests done")
    deleted = time.monotonic() - t0
    wait_until(lambda: list_statuses(zk, layout) == [], 10, "all statuses deleted")
    assert all(not w.running_tasks() for w in workers)
    settle(ctl)  # ZooKeeper may show a multi's effect before the controller has finished the event
    delete_requests = dict(requests)
    delete_writes = sum(requests[k] for k in WRITE_REQUESTS)
    assert delete_writes < 100, delete_requests
    assert len(ctl.ctx.tasks) == 0 and not ctl.ctx.deleting and not ctl.ctx.deletable
    print(
        f"create {created:.2f}s, load {loaded:.2f}s, all running {running:.2f}s, deleted {deleted:.2f}s; "
        f"controller requests while starting {start_requests}, while deleting {delete_requests}"
    )


def test_a_task_is_deleted_only_after_its_owner_lets_go(cluster, zk, layout):
    create_tasks(zk, layout, ["t1", "t2", "t3"])
    status = codecs.encode(task_records.TaskStatus(broker="x", state="RUNNING", generation=1, updated=0.0))
    for t in ("t1", "t2", "t3"):
        zk.create(layout.status(t), status)
    owner = cluster.client()
    owner.create(
        layout.task_owner("t1"), codecs.encode(task_records.OwnerInfo(broker="x", generation=1)), ephemeral=True
    )
    ctl = cluster.controller("del")
    wait_until(lambda: ctl.active and ctl.ctx is not None and len(ctl.ctx.tasks) == 3, 10, "active")

    request_deletions(zk, layout, ["t1", "t2", "t3", "ghost"])
    # the others go (after the batching linger, since t1 is still owned); a request for no task is dropped
    wait_until(lambda: list_tasks(zk, layout) == ["t1"], 10, "t2 and t3 deleted")
    wait_until(lambda: zk.get_children(layout.admin_delete_tasks) == ["t1"], 5, "their requests removed")
    assert list_statuses(zk, layout) == ["t1"]
    settle(ctl)
    assert set(ctl.ctx.tasks) == {"t1"} and ctl.ctx.deleting == {"t1"}

    owner.stop()  # the owner lets go
    wait_until(lambda: list_tasks(zk, layout) == [], 5, "t1 deleted once released")
    wait_until(lambda: zk.get_children(layout.admin_delete_tasks) == [], 5, "its request removed")
    assert list_statuses(zk, layout) == []
    settle(ctl)
    assert not ctl.ctx.tasks and not ctl.ctx.deleting and not ctl.ctx.deletable

    # a worker's late status write for a task already deleted does not stay behind
    zk.create(layout.status("t2"), status)
    wait_until(lambda: list_statuses(zk, layout) == [], 5, "the orphaned status deleted")


# ---- 6. metrics -----------------------------------------------------------------------------------
def test_metrics_endpoint_serves_prometheus_text(cluster, zk, layout):
    b = cluster.client()
    for i in range(2):
        b.create(
            layout.broker(f"b{i}"),
            codecs.encode(registration_records.BrokerInfo(broker_id=f"b{i}", host="h", pid=i)),
            ephemeral=True,
        )
    create_tasks(zk, layout, ["t1", "t2", "t3"])
    ctl = cluster.controller("m", metrics_port=0)
    wait_until(lambda: ctl.active and ctl.ctx is not None, 10, "active")
    wait_until(lambda: ctl.thread.queue_size() == 0 and ctl.thread.current is None, 5, "idle")
    port = ctl.metrics_server.port
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("zkc_controller_epoch", ())] == 1
    assert samples[("zkc_controller_active", ())] == 1
    assert samples[("zkc_controller_brokers", ())] == 2
    assert samples[("zkc_controller_tasks", ())] == 3
    assert ("zkc_controller_queue_size", ()) in samples
    assert samples[("zkc_controller_events_total", (("event", "Startup"),))] == 1
    assert samples[("zkc_controller_event_process_seconds_count", (("event", "Startup"),))] == 1
    assert samples[("zkc_controller_event_queue_seconds_count", (("event", "Startup"),))] == 1
    assert samples[("zkc_controller_event_process_seconds_sum", (("event", "Startup"),))] > 0
    assert ("zkc_controller_fenced_writes_total", ()) in samples


# ---- 7. broker membership -------------------------------------------------------------------------
def test_broker_change_distinguishes_joined_left_and_bounced(cluster, zk, layout):
    ctl = cluster.controller("bm")
    wait_until(lambda: ctl.active and ctl.ctx is not None, 10, "active")
    info = lambda b: codecs.encode(registration_records.BrokerInfo(broker_id=b, host="h", pid=1))

    def last_changes() -> list:
        return list(ctl.ctx.broker_changes)

    s1, s2 = cluster.client(), cluster.client()
    s1.create(layout.broker("b1"), info("b1"), ephemeral=True)
    s2.create(layout.broker("b2"), info("b2"), ephemeral=True)
    wait_until(lambda: set(ctl.ctx.brokers) == {"b1", "b2"}, 5, "two joined")
    settle(ctl)
    epochs = {b: zk.exists(layout.broker(b)).czxid for b in ("b1", "b2")}
    assert view(ctl)[0] == epochs
    joined = {b for d in last_changes() for b in d.joined}
    assert joined == {"b1", "b2"}

    # left: its session ends
    n = len(last_changes())
    s2.stop()
    wait_until(lambda: set(ctl.ctx.brokers) == {"b1"}, 5, "b2 left")
    settle(ctl)
    assert [d for d in last_changes()[n:] if d.left] and all(
        "b2" not in d.joined + d.bounced for d in last_changes()[n:]
    )

    # bounced: same id, new session and czxid, re-registered before the controller looked again
    n = len(last_changes())
    entered, release = threading.Event(), threading.Event()
    cluster.releases.append(release)
    ctl.put(Block(entered, release))
    assert entered.wait(5)
    s1.stop()
    s3 = cluster.client()
    s3.create(layout.broker("b1"), info("b1"), ephemeral=True)
    new_epoch = zk.exists(layout.broker("b1")).czxid
    assert new_epoch != epochs["b1"]
    release.set()
    wait_until(lambda: ctl.ctx.brokers.get("b1") and ctl.ctx.brokers["b1"].epoch == new_epoch, 5, "b1 bounced")
    settle(ctl)
    changes = last_changes()[n:]
    assert [d.bounced for d in changes if d.bounced] == [("b1",)]
    assert all(not d.joined and not d.left for d in changes)
    assert ctl.metrics.registry.get_sample_value("zkc_controller_brokers") == 1


# ---- 6. the group's writes: no look-ups on the members' path, old generations deleted blind -----------------
def _count_requests(ctl: Controller) -> list[tuple[str, str]]:
    """Record (request type, path) of every request the controller's client sends from now on."""
    sent: list[tuple[str, str]] = []
    send = ctl.client._call

    def recording_call(request: Any, async_object: Any) -> Any:
        sent.append((type(request).__name__, getattr(request, "path", "") or ""))
        return send(request, async_object)

    ctl.client._call = recording_call
    return sent


def _stable_after(zk: KazooClient, layout: ZkLayout, generation: int, workers: list[Worker], n_tasks: int) -> int:
    wait_until(
        lambda: (
            (s := group_state(zk, layout)) is not None
            and s.state == "Stable"
            and s.generation > generation
            and sum(len(w.running_tasks()) for w in workers) == n_tasks
        ),
        30,
        f"Stable after generation {generation}",
    )
    return group_state(zk, layout).generation


def test_old_generations_are_deleted_without_listings_or_lookups(cluster, zk, layout):
    """Join results and proposals of older generations go in the multi that publishes a later generation's
    assignments (what the controller wrote or read, it knows exists); leftovers of an earlier controller are
    found by one listing, once per activation. A rebalance after that sends no listing and no ``exists``
    for the paths the controller writes."""
    ids = [f"t{i}" for i in range(12)]
    create_tasks(zk, layout, ids)
    for n in ("0", "1"):  # left behind by an earlier controller
        zk.create(layout.group_join("default", int(n)), b"old", makepath=True)
        zk.create(layout.group_sync("default", int(n)), b"old", makepath=True)
    ctl = cluster.controller("gens")
    workers = [cluster.worker(f"w{i}") for i in range(2)]
    gen = _stable_after(zk, layout, 0, workers, len(ids))
    for _ in range(2):
        request_rebalance(zk, layout, "default", "test")
        gen = _stable_after(zk, layout, gen, workers, len(ids))
    settle(ctl)
    sent = _count_requests(ctl)
    token = ctl.token
    request_rebalance(zk, layout, "default", "test")
    gen = _stable_after(zk, layout, gen, workers, len(ids))
    settle(ctl)
    assert ctl.token == token  # no reload
    assert zk.get_children(layout.group_joins("default")) == [str(gen)]
    assert zk.get_children(layout.group_syncs("default")) == [str(gen)]
    group_paths = [(kind, p) for kind, p in sent if "/groups/default/" in p]
    assert not [r for r in group_paths if r[0] == "GetChildren" and r[1].rsplit("/", 1)[1] in ("join", "sync")], (
        group_paths
    )
    assert not [r for r in group_paths if r[0] == "Exists" and "/sync/" not in r[1]], group_paths
    # the one exists per generation arms the proposal's watch, sent with the write
    assert [p for kind, p in group_paths if kind == "Exists"] == [layout.group_sync("default", gen)]


def test_a_join_result_path_that_exists_already_is_written_all_the_same(cluster, zk, layout):
    """The controller creates a generation's join result without looking first; if something is there (left
    behind, or planted), the write goes again through the look-up path instead of failing the event."""
    ids = [f"t{i}" for i in range(6)]
    create_tasks(zk, layout, ids)
    ctl = cluster.controller("planted")
    workers = [cluster.worker(f"w{i}") for i in range(2)]
    gen = _stable_after(zk, layout, 0, workers, len(ids))
    settle(ctl)
    token = ctl.token
    # plant at the generation after the current one: a cooperative follow-up round may have started since
    # (its join result then exists already; the next one is planted instead)
    for _ in range(50):
        current = group_state(zk, layout).generation
        try:
            zk.create(layout.group_join("default", current + 1), b"garbage")
            break
        except NodeExistsError:
            time.sleep(0.1)
    else:
        raise AssertionError("no generation without a join result to plant garbage at")
    request_rebalance(zk, layout, "default", "test")
    new = _stable_after(zk, layout, current, workers, len(ids))  # the planted generation, or a later one
    settle(ctl)
    assert ctl.token == token  # handled inside the write, no reload of the context
    assert new >= current + 1 > gen
    joins = zk.get_children(layout.group_joins("default"))
    assert str(new) in joins
    for n in joins:  # the garbage was overwritten (and, if a later generation followed, deleted)
        assert codecs.decode(
            group_messages.JoinResult, zk.get(layout.group_join("default", int(n)))[0]
        ).generation == int(n)


def test_tasks_held_for_a_departed_static_member_stay_held_across_a_controller_failover(cluster, zk, layout):
    """A static member leaves during the scheduled rebalance delay and the controller fails over inside it: the
    new controller reads the hold from the group state, so the tasks stay unassigned until the delay ends
    (not moved at once), and then move."""
    delay = 6.0
    ids = [f"t{i}" for i in range(6)]
    create_tasks(zk, layout, ids)
    group = GroupConfig(rebalance_timeout_s=5.0, scheduled_rebalance_delay_s=delay)
    first = cluster.controller("first", group=group)
    assert first.wait_active(15)
    stay = cluster.worker("stay", instance_id="i-stay")
    leave = cluster.worker("leave", instance_id="i-leave")
    _stable_after(zk, layout, 0, [stay, leave], len(ids))
    wait_until(lambda: leave.running_tasks() and stay.running_tasks(), 20, "both running tasks")
    theirs = set(leave.running_tasks())
    leave.stop()  # a clean stop: gone, tasks released, its session closed
    left = time.monotonic()
    wait_until(
        lambda: [h.instance for h in (group_state(zk, layout).held or ())] == ["i-leave"],
        10,
        "the hold written to the group state",
    )
    first.stop()  # failover inside the delay
    second = cluster.controller("second", group=group)
    assert second.wait_active(15)
    settle(second)
    assert second.token is not None
    # inside the delay the held tasks run nowhere: not moved to the member that stayed
    while time.monotonic() - left < delay - 1.5:
        assert not (stay.running_tasks() & theirs), "held tasks moved inside the delay"
        time.sleep(0.1)
    wait_until(lambda: stay.running_tasks() == set(ids), delay + 20, "the held tasks to move after the delay")
    assert time.monotonic() - left >= delay - 0.5
    assert group_state(zk, layout).held == ()
