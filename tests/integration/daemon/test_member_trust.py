"""The reconcile coordinator trusts ZooKeeper, not members' words: a controller and two no-op brokers as
processes (``--protocol reconcile``) on a real ZooKeeper, and a hostile client beside them.

1. a ghost member znode (no broker behind it) claiming a live broker's tasks stops nothing and is given
   nothing; it is shown as ignored;
2. a live broker's report rewritten out of bounds (generation 2^72) is answered, the broker rewrites it and
   keeps its tasks, which are never published to another; a pause of one of them takes effect;
3. a task whose owner znode another session squats is never counted running: the group is not Stable while
   it waits, and after the rebalance timeout its member is fenced from it, with the reason in the state.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.admin import AdminClient, wait_for
from controller.admin.watch import ClusterWatch
from controller.protocol.group.rules import COOPERATIVE, RECONCILE
from controller.protocol.records import codecs, payload_validation, task_records
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import make_client

TASKS = [f"t{i}" for i in range(6)]
GROUP = "default"


def _broker(env: dict[str, str], bid: str, log: Path, protocol: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    with open(log, "ab") as out:  # a file, not a pipe nobody reads
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "broker", "run", "--id", bid, "--runner", "noop"]
            + ["--protocol", protocol, "--session-timeout", "4", *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class Cluster:
    def __init__(
        self,
        zk,
        layout,
        zk_settings,
        env,
        tmp_path: Path,
        rebalance_timeout: float,
        prepare: Callable[[], None],
        protocol: str = RECONCILE,
        broker_args: tuple[str, ...] = (),
    ) -> None:
        from controller.daemon import Controller, ControllerConfig
        from controller.protocol.group.vocabulary import GroupConfig

        self.zk, self.layout, self.tmp = zk, layout, tmp_path
        tx = zk.transaction()
        for t in TASKS:
            tx.create(layout.task(t), TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")).encode())
        tx.commit()
        prepare()
        self.ctl_config = ControllerConfig("c0", zk_settings, GroupConfig(rebalance_timeout_s=rebalance_timeout))
        self.ctl = Controller(self.ctl_config).start()
        self.procs = {b: _broker(env, b, tmp_path / f"{b}.log", protocol, broker_args) for b in ("b1", "b2")}

    def stop_controller(self) -> None:
        self.ctl.stop()

    def start_controller(self, cid: str) -> None:
        from dataclasses import replace

        from controller.daemon import Controller

        self.ctl = Controller(replace(self.ctl_config, controller_id=cid)).start()

    def owners(self) -> dict[str, str]:
        out = {}
        for t in TASKS:
            try:
                data, _ = self.zk.get(self.layout.task_owner(t))
                out[t] = codecs.decode(task_records.OwnerInfo, data).broker
            except Exception:
                pass
        return out

    def state(self) -> GroupStateInfo | None:
        try:
            return codecs.decode(GroupStateInfo, self.zk.get(self.layout.group_state(GROUP))[0])
        except Exception:
            return None

    def assignment(self, m: str) -> Assignment | None:
        try:
            return codecs.decode(Assignment, self.zk.get(self.layout.group_assignment(GROUP, m))[0])
        except Exception:
            return None

    def stable_with_all_owned(self) -> bool:
        s = self.state()
        return s is not None and s.state == "Stable" and set(s.members) == {"b1", "b2"} and len(self.owners()) == 6

    def logs(self) -> str:
        return "\n".join(f"--- {b}.log\n" + (self.tmp / f"{b}.log").read_text()[-3000:] for b in self.procs)

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.ctl.stop()


@pytest.fixture
def cluster_of(zk, layout, zk_settings, cli_env, tmp_path) -> Iterator:
    made: list[Cluster] = []

    def make(
        rebalance_timeout: float = 10.0,
        prepare: Callable[[], None] = lambda: None,
        protocol: str = RECONCILE,
        broker_args: tuple[str, ...] = (),
    ) -> Cluster:
        made.append(
            Cluster(zk, layout, zk_settings, dict(cli_env), tmp_path, rebalance_timeout, prepare, protocol, broker_args)
        )
        return made[-1]

    yield make
    for c in made:
        c.close()


def _request(member: str, **kw) -> bytes:
    base = dict(member_id=member, join_generation=1, generation=-1, protocols=(RECONCILE, COOPERATIVE))
    base.update(assignors=("sticky",), incarnation=f"{member}.ghost")
    base.update(kw)
    return codecs.encode(JoinRequest(**base))  # type: ignore[arg-type]


def test_a_ghost_member_stops_nothing_and_is_given_nothing(cluster_of, zk_settings, layout):
    c = cluster_of()
    assert wait_for(c.stable_with_all_owned, 60, 0.1), c.logs()
    b2_tasks = c.assignment("b2").assigned
    b2_epoch = c.assignment("b2").generation
    assert b2_tasks
    ghost_client = make_client(zk_settings)  # any client of an open root
    watch = ClusterWatch(c.zk, layout)
    watch.start()
    try:
        # a ghost claiming b2's tasks with a huge member epoch, and one claiming nothing
        ghost_client.create(
            layout.group_member(GROUP, "ghost"), _request("ghost", owned=b2_tasks, generation=2**50), ephemeral=True
        )
        ghost_client.create(layout.group_member(GROUP, "ghost2"), _request("ghost2"), ephemeral=True)

        def answered() -> bool:
            a, s = c.assignment("b2"), c.state()
            shown = {i.member for i in getattr(s, "ignored", ())} == {"ghost", "ghost2"}
            return shown or a is None or a.generation != b2_epoch or c.assignment("ghost2") is not None

        assert wait_for(answered, 15), c.state()
        # nothing was taken from b2, nothing published to the ghosts, every task runs where it ran
        assert c.assignment("b2").assigned == b2_tasks and c.assignment("b2").generation == b2_epoch
        assert c.assignment("ghost") is None and c.assignment("ghost2") is None
        s = c.state()
        assert s is not None and s.state == "Stable" and set(s.members) == {"b1", "b2"}
        assert all("no registered broker" in i.reason for i in s.ignored)
        assert len(c.owners()) == 6 and {t for t, b in c.owners().items() if b == "b2"} == set(b2_tasks)
        status = AdminClient(c.zk, layout).status()
        g = next(g for g in status.groups if g.group == GROUP)
        assert any(x.startswith("ghost: ") for x in g.ignored)
        # ``zkctl watch`` tells of it: a group event naming the ghosts
        events = [e for e in watch.refresh([("group", GROUP)]) if e.kind == "group"]
        assert events and "ignoring ghost: ghost: no registered broker ghost" in events[-1].message, events
        assert events[-1].detail["ignored"] and events[-1].detail["unacked"] == []
    finally:
        watch.close()
        ghost_client.stop()
        ghost_client.close()
    assert wait_for(lambda: (s := c.state()) is not None and not s.ignored, 15), "a ghost gone is no longer shown"


def test_a_report_out_of_bounds_is_answered_and_its_broker_keeps_its_tasks(cluster_of, layout):
    c = cluster_of()
    assert wait_for(c.stable_with_all_owned, 60, 0.1), c.logs()
    b2_tasks = set(c.assignment("b2").assigned)
    path = layout.group_member(GROUP, "b2")
    body = json.loads(c.zk.get(path)[0])
    body["generation"] = 2**72
    c.zk.set(path, json.dumps(body).encode())  # any client may rewrite it
    seen_b1: set[str] = set()

    def rewritten_and_stable() -> bool:
        seen_b1.update((c.assignment("b1") or Assignment(0, 0)).assigned)
        try:
            codecs.decode(JoinRequest, c.zk.get(path)[0])  # (the rewritten one does not decode)
        except payload_validation.PayloadError:
            return False
        s = c.state()
        return c.stable_with_all_owned() and s is not None and not s.ignored

    assert wait_for(rewritten_and_stable, 30, 0.05), (c.state(), c.logs())
    assert not seen_b1 & b2_tasks, "b2's tasks were published to b1 while b2 ran them"
    assert {t for t, b in c.owners().items() if b == "b2"} == b2_tasks
    # the broker is a member as before: an operator's pause of one of its tasks takes effect
    victim = sorted(b2_tasks)[0]
    AdminClient(c.zk, layout).pause(victim)
    assert wait_for(lambda: victim not in c.owners(), 20), c.owners()


def test_a_join_round_members_request_out_of_bounds_is_answered_and_it_rejoins_keeping_its_tasks(
    cluster_of, layout, caplog
):
    """The same rewrite under the cooperative join rounds: the broker is answered INVALID_REPORT at the
    generation it joined, writes its request again (a rejoin, which keeps its tasks under cooperative) and the
    group is Stable with it; its tasks are never published to the other broker meanwhile."""
    c = cluster_of(protocol=COOPERATIVE)
    assert wait_for(c.stable_with_all_owned, 60, 0.1), c.logs()
    generation = c.state().generation
    b2_tasks = set(c.assignment("b2").assigned)
    assert b2_tasks
    path = layout.group_member(GROUP, "b2")
    body = json.loads(c.zk.get(path)[0])
    body["capacity"] = 0  # out of bounds, decodes
    c.zk.set(path, json.dumps(body).encode())
    seen_b1: set[str] = set()

    def rewritten_and_stable() -> bool:
        a1 = c.assignment("b1")
        seen_b1.update(a1.assigned if a1 else ())
        req = codecs.decode(JoinRequest, c.zk.get(path)[0])
        s = c.state()
        return req.capacity >= 1 and c.stable_with_all_owned() and s is not None and not s.ignored

    assert wait_for(rewritten_and_stable, 30, 0.02), (c.state(), c.logs())
    # answered (its answer is overwritten by the next generation's assignment within milliseconds: the log says)
    assert any("refused the request of b2" in r.getMessage() and "it rejoins" in r.getMessage() for r in caplog.records)
    assert not seen_b1 & b2_tasks, "b2's tasks were published to b1 while b2 ran them"
    assert {t for t, b in c.owners().items() if b == "b2"} == b2_tasks
    assert c.state().generation > generation  # the rejoin made a new generation


def test_a_task_not_taken_is_never_counted_running_and_its_member_is_fenced_from_it(cluster_of, zk_settings, layout):
    squatter = make_client(zk_settings)
    try:
        # another session holds t0's owner znode: whoever t0 is published to cannot take it
        def squat() -> None:
            owner = codecs.encode(task_records.OwnerInfo(broker="squatter", generation=0))
            squatter.create(layout.task_owner("t0"), owner, ephemeral=True)

        c = cluster_of(rebalance_timeout=4.0, prepare=squat)
        fenced: list[GroupStateInfo] = []
        stable_while_squatted: list[GroupStateInfo] = []

        def fenced_seen() -> bool:
            s = c.state()
            if s is not None and s.state == "Stable" and set(s.members) == {"b1", "b2"}:
                stable_while_squatted.append(s)
            if s is not None and "not taken within the rebalance timeout" in s.reason:
                fenced.append(s)
            return bool(fenced) and len(c.owners()) == 6  # (t0's owner: the squatter's znode)

        assert wait_for(fenced_seen, 60, 0.05), (c.state(), c.logs())
        assert not stable_while_squatted, f"Stable while t0 ran nowhere: {stable_while_squatted[0]}"
        assert fenced[0].state == "Reconciling" and "t0" in fenced[0].reason
        assert c.owners().get("t0") not in ("b1", "b2")
        # a report rewritten to say t0 was taken (a faked acknowledgement): ZooKeeper's owner znode says
        # otherwise, the report is refused and the member writes its own again (t0 still pending)
        holder = next(m for m in ("b1", "b2") if "t0" in (c.assignment(m) or Assignment(0, 0)).assigned)
        path = layout.group_member(GROUP, holder)
        body = json.loads(c.zk.get(path)[0])
        body.update(owned=sorted(set(body["owned"]) | {"t0"}), pending=[], generation=c.assignment(holder).generation)
        faked = c.zk.set(path, json.dumps(body).encode()).version

        def rewritten_by_its_member() -> bool:
            fenced_seen()
            data, stat = c.zk.get(path)
            return stat.version > faked and "t0" in json.loads(data).get("pending", [])

        assert wait_for(rewritten_by_its_member, 20, 0.05), (c.state(), c.logs())
        assert not stable_while_squatted, f"Stable on a faked acknowledgement: {stable_while_squatted[0]}"
    finally:
        squatter.stop()
        squatter.close()
    # the squatter's session ended: t0 is taken, and only now is the group Stable
    assert wait_for(lambda: c.stable_with_all_owned() and c.owners()["t0"] in ("b1", "b2"), 60, 0.1), c.logs()


def test_a_failover_checks_the_acknowledgements_it_loads_against_the_owner_znodes(cluster_of, zk_settings, layout):
    """A report rewritten to acknowledge a task while no controller is active (a failover in between): the new
    controller loads the members' reports as it finds them, so it must ask ZooKeeper as the live path does. The
    task whose owner znode another session holds is not counted running: the group is not Stable, and the
    member is answered and writes its own report again (t0 pending)."""
    squatter = make_client(zk_settings)
    try:

        def squat() -> None:
            owner = codecs.encode(task_records.OwnerInfo(broker="squatter", generation=0))
            squatter.create(layout.task_owner("t0"), owner, ephemeral=True)

        c = cluster_of(rebalance_timeout=60.0, prepare=squat)

        def holder_waits() -> str | None:
            for m in ("b1", "b2"):
                a = c.assignment(m)
                if a is None or "t0" not in a.assigned:
                    continue
                try:
                    req = codecs.decode(JoinRequest, c.zk.get(layout.group_member(GROUP, m))[0])
                except Exception:
                    return None
                s = c.state()
                if "t0" in req.pending and len(c.owners()) == 6 and s is not None and s.unacked:
                    return m
            return None

        assert wait_for(lambda: holder_waits() is not None, 60, 0.1), (c.state(), c.logs())
        holder = holder_waits()
        assert holder is not None
        c.stop_controller()
        path = layout.group_member(GROUP, holder)
        body = json.loads(c.zk.get(path)[0])
        body.update(pending=[], generation=c.assignment(holder).generation)
        faked = c.zk.set(path, json.dumps(body).encode()).version
        c.start_controller("c1")
        stable_on_the_fake: list[GroupStateInfo] = []

        def rewritten_by_its_member() -> bool:
            s = c.state()
            if s is not None and s.state == "Stable" and s.controller_epoch > 1:
                stable_on_the_fake.append(s)
            data, stat = c.zk.get(path)
            return stat.version > faked and "t0" in json.loads(data).get("pending", [])

        assert wait_for(rewritten_by_its_member, 20, 0.05), (c.state(), c.logs())
        assert not stable_on_the_fake, f"Stable on a faked acknowledgement loaded: {stable_on_the_fake[0]}"
        for _ in range(40):  # and it stays out of Stable while the squatter holds t0
            s = c.state()
            assert s is None or s.state != "Stable", s
            time.sleep(0.05)
        assert c.owners().get("t0") not in ("b1", "b2")
    finally:
        squatter.stop()
        squatter.close()


def test_a_failover_stands_in_for_a_live_member_whose_request_it_refuses(cluster_of, layout):
    """b2's request rewritten out of bounds while no controller is active: the new controller has no last good
    request of b2 to keep, as the live path does. b2 still runs its tasks (it holds their owner znodes): they
    must not be published to b1 meanwhile (they would stay down behind b2's owner znodes), b2 is answered and
    writes its request again, and the group is Stable with every task where it ran."""
    c = cluster_of()
    assert wait_for(c.stable_with_all_owned, 60, 0.1), c.logs()
    b2_tasks = set(c.assignment("b2").assigned)
    assert b2_tasks
    c.stop_controller()
    path = layout.group_member(GROUP, "b2")
    body = json.loads(c.zk.get(path)[0])
    body["generation"] = 2**72
    c.zk.set(path, json.dumps(body).encode())
    c.start_controller("c1")
    seen_b1: set[str] = set()

    def rewritten_and_stable() -> bool:
        seen_b1.update((c.assignment("b1") or Assignment(0, 0)).assigned)
        try:
            codecs.decode(JoinRequest, c.zk.get(path)[0])
        except payload_validation.PayloadError:
            return False
        s = c.state()
        return c.stable_with_all_owned() and s is not None and s.controller_epoch > 1 and not s.ignored

    assert wait_for(rewritten_and_stable, 30, 0.05), (c.state(), c.logs())
    assert not seen_b1 & b2_tasks, "b2's tasks were published to b1 while b2 ran them"
    assert {t for t, b in c.owners().items() if b == "b2"} == b2_tasks


def test_stable_means_running_not_only_taken(cluster_of, layout):
    """Brokers whose every start takes 3 s: a member holds the owner znodes of its tasks (it acknowledged)
    long before they run. The group must not say Stable until every task placed runs, 3 s after its owner
    znode was taken, and the state says which members are still starting meanwhile."""
    c = cluster_of(broker_args=("--start-latency", "3"))
    starting_seen: list[tuple[str, ...]] = []
    stable_at: list[float] = []

    def stable() -> bool:
        s = c.state()
        if s is not None and s.starting:
            starting_seen.append(s.starting)
        if c.stable_with_all_owned():
            stable_at.append(time.time())
            return True
        return False

    assert wait_for(stable, 60, 0.05), (c.state(), c.logs())
    taken = max(c.zk.exists(layout.task_owner(t)).ctime / 1000 for t in TASKS)
    assert stable_at[0] >= taken + 3.0 - 0.1, f"Stable {stable_at[0] - taken:.2f}s after the last task was taken"
    assert starting_seen, "the state never named a member still starting"


def test_tasks_the_fence_stopped_are_not_counted_running_until_they_start_again(cluster_of, layout):
    """b1 is paused (SIGSTOP, 4 s) long enough for its pause detector to fence it on waking, not long enough to
    lose its 9 s session: its fence stops every task, then lifts, and they start again, each taking 3 s. Its owner
    znodes never changed hands, but for those 3 s nothing of b1's runs: the group must not say Stable then,
    and its state names b1 as starting; then it is Stable again with every task where it was."""
    c = cluster_of(broker_args=("--start-latency", "3", "--session-timeout", "9"))
    assert wait_for(c.stable_with_all_owned, 60, 0.05), (c.state(), c.logs())
    owners = c.owners()
    b1 = c.procs["b1"]
    b1.send_signal(signal.SIGSTOP)
    try:
        time.sleep(4.0)  # past a third of its 9 s session (the pause detector fences), well inside the session
    finally:
        b1.send_signal(signal.SIGCONT)

    def b1_starting() -> bool:
        s = c.state()
        return s is not None and "b1" in s.starting and s.state != "Stable"

    assert wait_for(b1_starting, 10, 0.02), (c.state(), c.logs())
    assert wait_for(c.stable_with_all_owned, 30, 0.05), (c.state(), c.logs())
    assert c.owners() == owners, "b1's session survived: its tasks stayed where they were"
