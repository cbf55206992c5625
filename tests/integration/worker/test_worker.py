"""Workers against a real ZooKeeper: every worker state transition happens for real, the fence deadline
stops tasks before the session can expire, failed tasks restart with backoff and end FAILED."""

from __future__ import annotations

import time

import pytest

from broker_sim.runners.noop import NoopRunner
from broker_sim.sim.netproxy import NetProxy
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.member import WorkerState as WS
from controller.protocol.group.rules import COOPERATIVE, EAGER
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import admin_records, codecs, group_messages, task_records
from controller.protocol.tasks.spec import NoopPipeline, RestartPolicy, TaskSpec
from controller.zk.client import ZkSettings
from controller.zk.io import get_many
from controller.zk.layout_io import list_statuses


@pytest.fixture
def controller(zk, zk_settings):
    ctl = Controller(ControllerConfig("c0", zk_settings, GroupConfig(rebalance_timeout_s=3.0))).start()
    assert ctl.wait_active(10)
    yield ctl
    ctl.stop()


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        if not w.closing:
            w.stop()


def _create(zk, layout, *specs: TaskSpec) -> None:
    tx = zk.transaction()
    for s in specs:
        tx.create(layout.task(s.id), s.encode())
    tx.commit()


def _worker(workers, settings, bid, **kw) -> Worker:
    w = Worker(WorkerConfig(broker_id=bid, settings=settings, status_interval_s=0.1, **kw, on_halt="kill")).start()
    workers.append(w)
    return w


def test_every_worker_transition_happens_for_real(zk, layout, zk_settings, controller, workers):
    import threading

    from controller.protocol.group.rules import run_assignor

    _create(zk, layout, *[TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")) for i in range(6)])
    a = _worker(workers, zk_settings, "a", protocols=(EAGER,))
    b = _worker(workers, zk_settings, "b", protocols=(EAGER,))
    assert wait_for(lambda: len(a.running_tasks() | b.running_tasks()) == 6 and a.state() == b.state() == "Stable", 15)
    coord = controller.ctx.groups["default"]
    # Joining -> PreparingJoin: a cooperative-only member cannot join an eager group (INCONSISTENT_PROTOCOL)
    c = _worker(workers, zk_settings, "c", protocols=(COOPERATIVE,))
    assert wait_for(lambda: (WS.JOINING, WS.PREPARING_JOIN) in c.member.transitions, 15)
    assert c.member.last_error is not None and c.member.last_error.name == "INCONSISTENT_PROTOCOL"
    assert wait_for(lambda: coord.state.value == "Stable", 10)
    settled = coord.rebalances
    time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert coord.rebalances == settled and c.state() == "PreparingJoin", "no rebalance storm from the misfit"
    c.stop()
    assert wait_for(lambda: coord.state.value == "Stable" and set(coord.generation_members) == {"a", "b"}, 15)
    # Syncing -> PreparingJoin: the leader stalls in its assignor past the sync timeout
    leader = a if coord.leader == "a" else b
    follower = b if leader is a else a
    release = threading.Event()

    def stalled(name, join):
        release.wait(10)
        return run_assignor(name, join)

    leader.member.assign = stalled
    zk.create(
        f"{layout.admin_rebalance}/req-", codecs.encode(admin_records.RebalanceRequest(group="default")), sequence=True
    )
    assert wait_for(lambda: (WS.SYNCING, WS.PREPARING_JOIN) in follower.member.transitions, 15)
    release.set()
    leader.member.assign = run_assignor
    assert wait_for(lambda: coord.state.value == "Stable" and len(a.running_tasks() | b.running_tasks()) == 6, 20)
    seen = set(a.member.transitions) | set(b.member.transitions) | set(c.member.transitions)
    for pair in [
        (WS.DOWN, WS.PREPARING_JOIN),
        (WS.PREPARING_JOIN, WS.JOINING),
        (WS.JOINING, WS.SYNCING),
        (WS.SYNCING, WS.STABLE),
        (WS.STABLE, WS.PREPARING_JOIN),
        (WS.JOINING, WS.PREPARING_JOIN),
        (WS.SYNCING, WS.PREPARING_JOIN),
    ]:
        assert pair in seen, (pair, sorted((x.value, y.value) for x, y in seen))


def test_session_loss_takes_the_worker_down_and_back(zk, layout, zk_settings, controller, workers):
    from kazoo.client import KazooClient

    _create(zk, layout, *[TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")) for i in range(4)])
    w = _worker(workers, zk_settings, "x")
    assert wait_for(lambda: len(w.running_tasks()) == 4, 15)
    member = w.member
    # expire the session from outside (same session id/password, closed by another client)
    other = KazooClient(hosts=zk_settings.hosts, client_id=w.client.client_id)
    other.start(10)
    other.stop()
    other.close()
    assert wait_for(
        lambda: (WS.STABLE, WS.DOWN) in member.transitions or (WS.SYNCING, WS.DOWN) in member.transitions, 15
    )
    assert wait_for(lambda: len(w.running_tasks()) == 4 and w.state() == "Stable", 20)


@pytest.mark.parametrize("stop_latency_s", [0.0, 1.5], ids=["instant-stop", "slow-stop"])
def test_fence_deadline_stops_tasks_before_the_session_can_expire(
    zk, layout, zk_hosts, zk_root, controller, workers, stop_latency_s
):
    """A worker cut off from ZooKeeper (a silent network, via a TCP proxy) stops all its tasks before its
    session expires on the server: the new owners start only after that. With a runner whose stop takes
    1.5 s (declaring a budget of 2 s; the default margin is a sixth of the 4 s session, 0.67 s), the
    worker fences that much earlier: with the default margin the stop would end ~0.8 s after the expiry."""
    host, port = zk_hosts.split(":")
    proxy = NetProxy(host, int(port), name="proxy-fence")
    try:
        session = 4.0
        budget = stop_latency_s + 0.5 if stop_latency_s else 0.0  # at most half the session (the cap)

        def start(bid: str, hosts: str) -> Worker:
            runner = NoopRunner(stop_latency_s=stop_latency_s)
            runner.stop_budget_s = budget
            config = WorkerConfig(
                broker_id=bid,
                settings=ZkSettings(hosts=hosts, root=zk_root, session_timeout_s=session),
                status_interval_s=0.1,
                on_halt="kill",
            )
            w = Worker(config, runner=runner).start()
            workers.append(w)
            return w

        _create(zk, layout, *[TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")) for i in range(6)])
        cut = start("cut", proxy.address)
        other = start("other", zk_hosts)
        assert cut.fence_margin_s == max(session / 6, budget)
        assert wait_for(lambda: len(cut.running_tasks()) == 3 and len(other.running_tasks()) == 3, 15)
        mine = cut.running_tasks()
        t_cut = time.time()
        proxy.partition()
        assert wait_for(lambda: cut.running_tasks() == set(), session)
        fenced_at = time.time()
        assert wait_for(lambda: mine <= other.running_tasks(), 30)
        starts = [i.start for i in other.open_intervals() if i.task_id in mine]
        assert starts and fenced_at < min(starts), "the cut-off worker stopped before anyone else started"
        assert fenced_at - t_cut < session, "fenced inside the session timeout"
        proxy.reset()
        proxy.heal()
    finally:
        proxy.close()


def test_failed_task_restarts_with_backoff_then_stays_failed(zk, layout, zk_settings, controller, workers):
    policy = RestartPolicy(max_attempts=3, backoff_initial_s=0.2, backoff_max_s=1.0)
    spec = TaskSpec(
        id="flaky",
        restart=policy,
        pipeline=NoopPipeline(kind="noop", fail_after_s=0.05, fail_message="boom: simulated"),
    )
    _create(zk, layout, spec, TaskSpec(id="healthy", pipeline=NoopPipeline(kind="noop")))
    w = _worker(workers, zk_settings, "w")

    def status(t: str) -> task_records.TaskStatus | None:
        try:
            data, _ = zk.get(layout.status(t))
        except Exception:
            return None
        return codecs.decode(task_records.TaskStatus, data, layout.status(t))

    assert wait_for(lambda: (s := status("flaky")) is not None and s.state == "FAILED", 20)
    st = status("flaky")
    assert st.failures == 4 and st.error == "boom: simulated" and "NoopFailure" in (st.trace or "")
    starts = sorted(i.start for i in w.intervals if i.task_id == "flaky")
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 4 and gaps == sorted(gaps), f"backoff grows: {gaps}"
    assert gaps[-1] > gaps[0] + 0.2
    assert "healthy" in w.running_tasks(), "a failing task does not disturb the others"
    # it stays FAILED until `task restart` bumps the nonce
    time.sleep(1.5)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert status("flaky").state == "FAILED" and len([i for i in w.intervals if i.task_id == "flaky"]) == 4
    data, stat = zk.get(layout.task("flaky"))
    zk.set(layout.task("flaky"), spec.model_copy(update={"restart_nonce": 1}).encode(), version=stat.version)
    assert wait_for(lambda: len([i for i in w.intervals if i.task_id == "flaky"]) >= 5, 10)


def test_tasks_given_together_are_taken_in_pipelined_rounds(zk, layout, zk_settings, controller, workers):
    """A worker given many tasks at once creates all their owner znodes in one multi and sends all their spec
    reads right behind it, without waiting in between (one round, not two round trips per task,
    ``pool_size`` at a time, nor a request per create)."""
    ids = [f"p{i:02d}" for i in range(24)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    w = Worker(WorkerConfig(broker_id="solo", settings=zk_settings, status_interval_s=0.1, pool_size=4, on_halt="kill"))
    sent: list[tuple[str, str]] = []
    send = w.client._call

    def recording_call(request, async_object):
        ops = getattr(request, "operations", None)
        if ops is not None:
            sent.append(("Transaction", ",".join(f"{type(op).__name__}:{op.path}" for op in ops)))
        else:
            sent.append((type(request).__name__, getattr(request, "path", "") or ""))
        return send(request, async_object)

    w.client._call = recording_call
    workers.append(w.start())
    assert wait_for(lambda: w.running_tasks() == set(ids), 15)
    single = [i for i, (kind, p) in enumerate(sent) if kind == "Create" and p.endswith("/owner")]
    assert not single, "owner znodes created one request each"
    multis = [i for i, (kind, p) in enumerate(sent) if kind == "Transaction" and "/owner" in p and "Create:" in p]
    assert len(multis) == 1, sent
    [multi] = multis
    assert sorted(op.split(":")[1].rsplit("/", 2)[-2] for op in sent[multi][1].split(",")) == ids
    reads = [i for i, (kind, p) in enumerate(sent) if kind == "GetData" and p.rsplit("/", 1)[1] in ids]
    assert len(reads) == len(ids)
    assert multi < min(reads), "the spec reads go out behind the creates"
    for t in ids:
        owner = codecs.decode(task_records.OwnerInfo, zk.get(layout.task_owner(t))[0])
        assert owner.broker == "solo" and owner.generation == w.generation


def test_a_task_still_owned_elsewhere_is_taken_once_let_go(zk, layout, zk_settings, controller, workers):
    """In a batch, a task whose owner znode another session still holds waits (watch, bounded) while the
    others start; it starts once the znode is gone, and never while it exists."""
    ids = [f"q{i}" for i in range(5)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    zk.create(
        layout.task_owner("q2"), codecs.encode(task_records.OwnerInfo(broker="elsewhere", generation=0)), ephemeral=True
    )
    w = _worker(workers, zk_settings, "taker")
    assert wait_for(lambda: w.running_tasks() == set(ids) - {"q2"}, 15)
    time.sleep(0.5)  # a window for a wrong change to show (nothing to wait for when all goes right)
    assert "q2" not in w.running_tasks()
    assert codecs.decode(task_records.OwnerInfo, zk.get(layout.task_owner("q2"))[0]).broker == "elsewhere"
    zk.delete(layout.task_owner("q2"))
    assert wait_for(lambda: w.running_tasks() == set(ids), 10)
    assert codecs.decode(task_records.OwnerInfo, zk.get(layout.task_owner("q2"))[0]).broker == "taker"


def test_tasks_revoked_together_are_released_in_one_multi_with_their_last_status(
    zk, layout, zk_settings, controller, workers
):
    """A cooperative revocation of several tasks: their runners stop, then one multi writes each last status
    (still ours) and deletes each owner znode; the new owner starts them only after that."""
    ids = [f"r{i}" for i in range(8)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    a = Worker(WorkerConfig(broker_id="giver", settings=zk_settings, status_interval_s=0.1, on_halt="kill"))
    sent: list[list[tuple[str, str]]] = []
    send = a.client._call

    def recording_call(request, async_object):
        if type(request).__name__ == "Transaction":
            sent.append([(type(op).__name__, op.path) for op in request.operations])
        return send(request, async_object)

    a.client._call = recording_call
    workers.append(a.start())
    assert wait_for(lambda: a.running_tasks() == set(ids), 15)
    assert wait_for(
        lambda: (
            all(
                codecs.decode(task_records.TaskStatus, zk.get(layout.status(t))[0]).broker == "giver"
                for t in ids
                if zk.exists(layout.status(t))
            )
            and len(list_statuses(zk, layout)) == len(ids)
        ),
        10,
    )
    del sent[:]
    b = _worker(workers, zk_settings, "taker")
    assert wait_for(lambda: len(b.running_tasks()) == 4 and len(a.running_tasks()) == 4, 15)
    moved = b.running_tasks()
    releases = [ops for ops in sent if any(kind == "Delete" and path.endswith("/owner") for kind, path in ops)]
    assert len(releases) == 1, releases
    [ops] = releases
    assert sorted(p.rsplit("/", 2)[-2] for kind, p in ops if kind == "Delete") == sorted(moved)
    assert sorted(p.rsplit("/", 1)[1] for kind, p in ops if kind == "SetData") == sorted(moved)
    for t in moved:
        assert codecs.decode(task_records.OwnerInfo, zk.get(layout.task_owner(t))[0]).broker == "taker"
        assert wait_for(
            lambda t=t: codecs.decode(task_records.TaskStatus, zk.get(layout.status(t))[0]).broker == "taker", 5
        )


def test_a_release_writes_the_last_status_at_its_own_last_version_without_reading_it(
    zk, layout, zk_settings, controller, workers
):
    """A release may write a task's last status only while that status is still ours. The version our own
    last write left says so without a read (a broker letting go of one task spends one round trip, not
    two); a status someone else wrote since is not ours: the release finds that out and leaves it alone."""
    specs = {t: TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ("v0", "v1")}
    _create(zk, layout, *specs.values())
    a = Worker(
        WorkerConfig(
            broker_id="giver", settings=zk_settings, status_interval_s=0.1, metrics_interval_s=600.0, on_halt="kill"
        )
    )
    sent: list[tuple[str, str | None]] = []
    send = a.client._call

    def recording_call(request, async_object):
        sent.append((type(request).__name__, getattr(request, "path", None)))
        return send(request, async_object)

    a.client._call = recording_call
    workers.append(a.start())

    def status(t: str) -> tuple[task_records.TaskStatus, int] | None:
        try:
            data, stat = zk.get(layout.status(t))
        except Exception:
            return None
        return codecs.decode(task_records.TaskStatus, data), stat.version

    assert wait_for(
        lambda: all(
            (s := status(t))
            and s[0].state == "RUNNING"
            and s[0].broker == "giver"
            and a.reporting.status_versions.get(layout.status(t)) == s[1]
            for t in specs
        ),
        20,
    )
    del sent[:]
    zk.set(layout.task("v0"), specs["v0"].with_state("PAUSED").encode())
    assert wait_for(lambda: a.running_tasks() == {"v1"} and zk.exists(layout.task_owner("v0")) is None, 15)
    last, _ = status("v0")
    assert (last.broker, last.state) == ("giver", "STOPPED")
    assert ("GetData", layout.status("v0")) not in sent, "the release read the status it had written itself"
    assert layout.status("v0") not in a.reporting.status_versions, (
        "a released task's version is the next owner's to know"
    )
    # someone else writes v1's status (an operator, or the controller marking a task FAILED)
    foreign = codecs.encode(
        task_records.TaskStatus(
            broker="operator", state="FAILED", generation=0, updated=time.time(), error="marked by hand"
        )
    )
    zk.set(layout.status("v1"), foreign)
    zk.set(layout.task("v1"), specs["v1"].with_state("PAUSED").encode())
    assert wait_for(lambda: not a.running_tasks() and zk.exists(layout.task_owner("v1")) is None, 15)
    assert zk.get(layout.status("v1"))[0] == foreign, "the release overwrote a status that was no longer ours"


def test_a_release_is_reported_even_when_the_member_looks_before_the_stop_job_has_ended(
    zk, layout, zk_settings, controller, workers
):
    """A task let go counts as released only once its stop job is over (its slot busy no more: until then it
    "may be held any moment"). The member must hear of it after that, not only from inside the release:
    here every release returns 0.3 s late, so a look from inside it always sees the slot still busy. With
    the look only there, the report that hands the task on never came and the joiner never got its share."""
    from controller.protocol.group.rules import RECONCILE

    ids = [f"b{i}" for i in range(6)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    both = (RECONCILE, COOPERATIVE)
    a = _worker(workers, zk_settings, "a", protocols=both)
    b = _worker(workers, zk_settings, "b", protocols=both)
    assert wait_for(
        lambda: (
            len(a.running_tasks()) + len(b.running_tasks()) == 6
            and controller.ctx.groups["default"].protocol == RECONCILE
            and controller.ctx.groups["default"].state.value == "Stable"
        ),
        20,
    )
    for w in (a, b):
        release = w.ownership.release

        def late_release(tasks, cached=True, _release=release):
            _release(tasks, cached)
            time.sleep(0.3)  # the scenario: a release slow to return

        w.ownership.release = late_release
        # the pool thread's release (a reconciling member's goes with its report from the event thread, which
        # clears the busy flags itself before telling the member; it falls back to this one when a status
        # version is not known, as here)
        w.ownership.send_release = lambda *_a: False
    c = _worker(workers, zk_settings, "c", protocols=both)
    assert wait_for(
        lambda: len(c.running_tasks()) == 2 and len(a.running_tasks()) == len(b.running_tasks()) == 2, 10
    ), (a.running_tasks(), b.running_tasks(), c.running_tasks())


def test_a_reconciling_member_releases_and_reports_in_one_multi(zk, layout, zk_settings, controller, workers):
    """Under reconcile, a broker giving tasks up writes their last statuses, deletes their owner znodes and
    rewrites its request (its report, which lets the coordinator hand them on) in ONE multi, sent from its
    event thread: the report costs no round trip of its own, and it is in ZooKeeper the instant the owner
    znodes are gone. No separate report follows it."""
    from controller.protocol.group.rules import RECONCILE

    ids = [f"f{i}" for i in range(6)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    both = (RECONCILE, COOPERATIVE)
    a = _worker(workers, zk_settings, "a", protocols=both, metrics_interval_s=600.0)
    b = _worker(workers, zk_settings, "b", protocols=both, metrics_interval_s=600.0)
    assert wait_for(
        lambda: (
            len(a.running_tasks()) + len(b.running_tasks()) == 6
            and controller.ctx.groups["default"].protocol == RECONCILE
            and controller.ctx.groups["default"].state.value == "Stable"
            and all(
                w.reporting.status_versions.get(layout.status(t)) is not None for w in (a, b) for t in w.running_tasks()
            )
        ),
        20,
    )
    sent: dict[str, list[list[tuple[str, str]]]] = {"a": [], "b": []}
    for w in (a, b):
        send = w.client._call

        def recording_call(request, async_object, _send=send, _log=sent[w.id]):
            if type(request).__name__ == "Transaction":
                _log.append([(type(op).__name__, op.path) for op in request.operations])
            elif type(request).__name__ in ("SetData", "Create"):
                _log.append([(type(request).__name__, request.path)])
            return _send(request, async_object)

        w.client._call = recording_call
    before = {w.id: w.running_tasks() for w in (a, b)}
    c = _worker(workers, zk_settings, "c", protocols=both)
    assert wait_for(
        lambda: (
            len(c.running_tasks()) == 2
            and len(a.running_tasks()) == len(b.running_tasks()) == 2
            and controller.ctx.groups["default"].state.value == "Stable"
        ),
        15,
    )
    for w in (a, b):
        member = layout.group_member("default", w.id)
        gone = before[w.id] - w.running_tasks()
        assert gone, f"{w.id} gave nothing up: the test proves nothing"
        releases = [ops for ops in sent[w.id] if any(k == "Delete" for k, _ in ops)]
        assert len(releases) == 1, releases
        [ops] = releases
        assert {p.rsplit("/", 2)[-2] for k, p in ops if k == "Delete"} == gone
        assert ("SetData", member) in ops, f"{w.id}'s release did not carry its report: {ops}"
        later = sent[w.id][sent[w.id].index(ops) + 1 :]
        assert not any(p == member for step in later for _, p in step), f"a separate report followed: {later}"
        report = codecs.decode(group_messages.JoinRequest, zk.get(member)[0])
        assert not gone & set(report.owned) and report.join_generation == w.member.generation
    assert controller.ctx.groups["default"].reconcile.unreleased == {}


def test_no_release_goes_out_while_a_status_write_is_in_flight(zk, layout, zk_settings, controller, workers):
    """The status loop writes (creates, for a task it never wrote) the statuses of the tasks it runs; a
    release writes the last status of each task it lets go. Were both in flight at once for one task, the
    status loop's create would fail on the release's (its batch lost: seen as a status-loop traceback in 3
    benchmark runs of 3) or its set overwrite the final status. So a release waits for a status write in
    flight (``status_lock``, held here by the test as the status loop holds it), then goes, once it ends."""
    from controller.protocol.group.rules import RECONCILE

    ids = [f"s{i}" for i in range(6)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    both = (RECONCILE, COOPERATIVE)
    a = _worker(workers, zk_settings, "a", protocols=both)
    b = _worker(workers, zk_settings, "b", protocols=both)
    assert wait_for(
        lambda: (
            (g := controller.ctx.groups.get("default")) is not None
            and g.protocol == RECONCILE
            and g.state.value == "Stable"
            and len(a.running_tasks()) + len(b.running_tasks()) == 6
        ),
        20,
    )
    group = controller.ctx.groups["default"]  # (there once a member joined: not at once)

    def owned_by(w: Worker) -> set[str]:
        return {
            t for t in ids if (st := zk.exists(layout.task_owner(t))) is not None and st.ephemeralOwner == w.session_id
        }

    held = {w.id: owned_by(w) for w in (a, b)}
    for w in (a, b):
        w.reporting.status_lock.acquire()
    try:
        c = _worker(workers, zk_settings, "c", protocols=both)
        assert wait_for(lambda: len(a.running_tasks()) + len(b.running_tasks()) < 6, 15), "nothing was revoked"
        time.sleep(1.0)  # a window for a wrong change to show (nothing to wait for when all goes right)
        assert {w.id: owned_by(w) for w in (a, b)} == held, "a release went out during a status write"
    finally:
        for w in (a, b):
            w.reporting.status_lock.release()
    assert wait_for(lambda: len(c.running_tasks()) == 2 and group.state.value == "Stable", 15)
    moved = c.running_tasks()
    assert wait_for(
        lambda: all(codecs.decode(task_records.TaskStatus, zk.get(layout.status(t))[0]).broker == "c" for t in moved),
        10,
    )


def test_a_spec_watch_whose_re_read_failed_is_armed_again(zk, layout, zk_settings, controller, workers):
    """A spec change fires the owner's one-shot watch; the read that re-arms it fails (the connection dropped
    just then). The worker reads again shortly, so the restart asked for then is carried out, and so is one
    asked for later (without the retry the task ran on, its watch gone, and no restart was ever seen)."""
    from kazoo.exceptions import ConnectionLoss

    spec = TaskSpec(id="watched", pipeline=NoopPipeline(kind="noop"))
    _create(zk, layout, spec)
    w = _worker(workers, zk_settings, "w")
    assert wait_for(lambda: w.running_tasks() == {"watched"}, 15)
    path = layout.task("watched")
    get = w.client.get
    failed = []

    def flaky_get(p, *a, **kw):
        if p == path and not failed:
            failed.append(p)
            raise ConnectionLoss("the connection dropped (injected)")
        return get(p, *a, **kw)

    w.client.get = flaky_get
    runs = lambda: len([i for i in w.intervals if i.task_id == "watched"])  # noqa: E731 (runs ended so far)
    for nonce in (1, 2):
        data, stat = zk.get(path)
        zk.set(path, spec.model_copy(update={"restart_nonce": nonce}).encode(), version=stat.version)
        assert wait_for(lambda n=nonce: runs() >= n and w.running_tasks() == {"watched"}, 10), f"restart {nonce}"
    assert failed, "the injected failure did not happen: the test proves nothing"


def test_a_fence_the_suspended_timer_raised_after_a_reconnection_is_lifted_by_the_probe(
    zk, layout, zk_settings, controller, workers
):
    """The SUSPENDED timer can fire after the reconnection's handler has run (the timer thread was already
    inside ``_fence``): the worker is fenced with the connection healthy, so neither the probe's own silence
    nor a reconnection will come to lift it. The probe's next answer, to a request sent after the fence
    went up, must: else the worker holds its tasks stopped, and takes none it is given, for good."""
    ids = [f"t{i}" for i in range(3)]
    _create(zk, layout, *[TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
    w = _worker(workers, zk_settings, "w1")
    assert wait_for(lambda: len(w.running_tasks()) == 3, 15)

    def states() -> set[str]:  # (one pipelined round)
        return {
            codecs.decode(task_records.TaskStatus, got[0]).state if got else "none yet"
            for got in get_many(zk, [layout.status(t) for t in ids])
        }

    assert wait_for(lambda: states() == {"RUNNING"}, 5)
    lift = w.fence.lift
    w.fence.lift = lambda sent, why: False  # held up while connected: what it shows meanwhile
    try:
        w.fence.fence()  # what the timer does
        assert wait_for(lambda: w.running_tasks() == set(), 5)
        assert wait_for(lambda: states() == {"STOPPED"}, 5), "a fenced broker's statuses say its stopped tasks run"
    finally:
        w.fence.lift = lift
    assert wait_for(lambda: len(w.running_tasks()) == 3, 5 * w.fence.probe.interval + 2), "the fence was never lifted"
    assert not w.fence.up
    assert wait_for(lambda: states() == {"RUNNING"}, 5)


def test_a_suspended_timer_pending_when_the_probe_fences_cannot_fence_again_after_the_lift(
    zk, layout, zk_settings, controller, workers
):
    """The chaos run's tasks left without an owner: a partition armed the SUSPENDED timer, the liveness probe
    fenced first (which dropped the timer without cancelling it), the reconnection lifted the fence, and
    the orphaned timer then fenced again with the connection healthy, nobody left to lift it; tasks the
    coordinator then gave the worker were never taken. A fence, whoever raises it, cancels a pending
    timer."""
    _create(zk, layout, *[TaskSpec(id=f"t{i}", pipeline=NoopPipeline(kind="noop")) for i in range(3)])
    w = _worker(workers, zk_settings, "w1")
    assert wait_for(lambda: len(w.running_tasks()) == 3, 15)
    w.fence.arm()  # SUSPENDED
    timer = w.fence.timer
    assert timer is not None and timer.is_alive()
    w.fence.fence()  # the probe's
    probes_fence = w.fence.raised_at
    assert wait_for(lambda: w.running_tasks() == set(), 5)
    assert wait_for(lambda: len(w.running_tasks()) == 3 and not w.fence.up, 5 * w.fence.probe.interval + 2)
    timer.join(5)  # ended: cancelled, or (without the cancel) fired, its ``_fence`` done, within its delay
    assert not timer.is_alive()
    assert w.fence.raised_at == probes_fence, "a fence raised after it was lifted"
    _create(zk, layout, TaskSpec(id="t9", pipeline=NoopPipeline(kind="noop")))  # given now: it is taken
    assert wait_for(lambda: "t9" in w.running_tasks(), 10)


def test_only_an_answer_to_a_request_sent_after_the_fence_went_up_lifts_it(zk_settings):
    """The lifting rule alone (a worker not started: no ZooKeeper needed): an answer proves the session alive
    at its request's send time, so one sent before the fence says nothing about the silence that raised it."""
    w = Worker(WorkerConfig(broker_id="rule", settings=zk_settings))
    try:
        fence = w.fence
        fence.up, fence.raised_at, fence.probe.last_ok = True, 100.0, 90.0
        assert not fence.lift(99.9, "an older answer") and fence.up and fence.probe.last_ok == 90.0
        assert fence.lift(100.0, "an answer sent after") and not fence.up
        assert fence.probe.last_ok == 100.0  # the fence deadline moves forward from the send time
        assert not fence.lift(101.0, "nothing to lift")
    finally:
        w.pool.shutdown()


def test_the_interval_log_is_rewritten_when_a_run_starts_not_at_every_flush(
    zk, layout, zk_settings, controller, workers
):
    """An open interval stays the same while its task runs: a broker whose runs did not change leaves its
    interval log alone at every flush (it rewrote it at every one), and writes it when a run starts."""
    from kazoo.exceptions import NoNodeError

    _create(zk, layout, *[TaskSpec(id=f"i{i}", pipeline=NoopPipeline(kind="noop")) for i in range(2)])
    _worker(workers, zk_settings, "iv", intervals_flush_s=0.1)
    path = layout.broker_intervals("iv")

    def log() -> tuple[set[str], int]:
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            return set(), -1
        return {i.task_id for i in codecs.decode(task_records.IntervalLog, data, path).intervals}, stat.version

    assert wait_for(lambda: log()[0] == {"i0", "i1"}, 20)
    _, v0 = log()
    time.sleep(1.0)  # ten flushes
    _, v1 = log()
    assert v1 - v0 <= 1, f"the unchanged log was rewritten {v1 - v0} times in ten flushes"
    _create(zk, layout, TaskSpec(id="i2", pipeline=NoopPipeline(kind="noop")))
    assert wait_for(lambda: log()[0] == {"i0", "i1", "i2"}, 20), "a run that started is in the log"


def test_metric_only_changes_wait_for_the_metrics_interval_state_changes_do_not(
    zk, layout, zk_settings, controller, workers
):
    """The no-op runner's uptime changes at every poll (every 0.1 s here). A broker with no metrics interval
    rewrites that status at every poll; one with a 60 s interval leaves it, yet writes the task's completion
    (a state change) at once, with the metrics of that moment."""
    _create(
        zk,
        layout,
        TaskSpec(id="slow", group="slow", pipeline=NoopPipeline(kind="noop", complete_after_s=3.0)),
        TaskSpec(id="fast", group="fast", pipeline=NoopPipeline(kind="noop")),
    )
    _worker(workers, zk_settings, "s", group="slow", metrics_interval_s=60.0)
    _worker(workers, zk_settings, "f", group="fast", metrics_interval_s=0.0)

    def status(t: str) -> tuple[task_records.TaskStatus, int] | None:
        try:
            data, stat = zk.get(layout.status(t))
        except Exception:
            return None
        return codecs.decode(task_records.TaskStatus, data, layout.status(t)), stat.version

    assert wait_for(lambda: all((s := status(t)) and s[0].state == "RUNNING" for t in ("slow", "fast")), 20)
    (_, slow0), (_, fast0) = status("slow"), status("fast")
    time.sleep(2.0)  # the scenario: the window the writes are counted in
    (slow, slow1), (_, fast1) = status("slow"), status("fast")
    assert fast1 - fast0 >= 8, f"metric-only writes at every poll without an interval: {fast1 - fast0} in 2 s"
    if slow.state == "RUNNING":  # (the completion, due 3 s after the start, may already be in under load)
        assert slow1 == slow0, f"metric-only writes held for the 60 s interval: {slow1 - slow0} in 2 s"
    assert wait_for(lambda: status("slow")[0].state == "COMPLETED", 10), "a state change is not held"
    done, _ = status("slow")
    assert done.metrics["uptime_s"] >= 3.0, f"it carries the metrics of its moment: {done.metrics}"


def test_statuses_whose_existence_the_broker_had_wrong_are_written_all_the_same(zk, layout):
    """A failed multi names only its first failing op (the rest read as rolled back), so a batch in which
    two paths were not what the writer believed (here: both believed there, both gone) fails on one, then on
    the other: the upsert looks them up and writes again until every one is right."""
    from controller.zk.io import FencedWriter

    paths = [layout.root + f"/upsert-race-{i}" for i in range(3)]
    zk.create(paths[2], b"old")
    known = {paths[0], paths[1]}  # believed to exist, they do not
    FencedWriter(zk, None).upsert([(p, f"v{i}".encode()) for i, p in enumerate(paths)], known)
    assert [zk.get(p)[0] for p in paths] == [b"v0", b"v1", b"v2"]
    assert known == set(paths)
