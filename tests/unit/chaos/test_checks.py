"""The chaos harness's own parts, without a cluster: the seeded schedule (same seed, same faults; every kind
drawn; exclusive faults alone), the exactly-once sink reader, each verdict failing on data that breaks it, and
container lives ending where the next begins. The runs themselves: tests/e2e/test_chaos.py."""

from __future__ import annotations

import json

from broker_sim.chaos import (
    DEFAULT_FAULT_KINDS,
    FAULT_KINDS,
    ChaosOptions,
    Sample,
    left_out,
    make_schedule,
    sink_ids,
    verdicts,
)
from controller.protocol.records.task_records import RunInterval
from tests.chaos_support import IN_PROCESS_KINDS


def test_same_seed_same_schedule_and_every_kind_is_drawn():
    opts = ChaosOptions(seed=6, duration_s=30, brokers=3, tasks=20, mean_gap_s=1.5, kinds=IN_PROCESS_KINDS)
    assert make_schedule(opts) == make_schedule(opts)
    assert make_schedule(opts) != make_schedule(
        ChaosOptions(seed=7, duration_s=30, brokers=3, tasks=20, mean_gap_s=1.5)
    )
    assert {f.kind for f in make_schedule(opts)} == set(IN_PROCESS_KINDS)
    long = make_schedule(ChaosOptions(seed=1, duration_s=600))
    assert {f.kind for f in long} == set(DEFAULT_FAULT_KINDS)  # wedged stops only when asked for
    assert "wedged-stop" in {f.kind for f in make_schedule(ChaosOptions(seed=1, duration_s=600, kinds=FAULT_KINDS))}
    for f in long:  # an exclusive fault has the cluster to itself
        if f.kind in ("zk-restart", "rolling-bounce"):
            assert not [g for g in long if g is not f and f.at <= g.at < f.at + f.duration]
    # process brokers are frozen for less than their session (nothing inside a stopped process can fence)
    proc = make_schedule(ChaosOptions(seed=1, duration_s=600, process_brokers=True))
    assert all(f.duration < 0.6 * 4.0 + 1e-6 for f in proc if f.kind == "freeze-broker")


def test_sink_reader_counts_committed_files_only(tmp_path):
    """The exactly-once check reads a file sink as Spark does: the latest compact log plus later batches;
    files with no commit (a killed writer's) do not count; duplicates are kept and so detected."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = tmp_path / "out"
    (sink / "_spark_metadata").mkdir(parents=True)

    def part(name: str, ids: list[int]) -> str:
        pq.write_table(pa.table({"id": ids}), sink / name)
        return json.dumps(
            {
                "path": f"file://{sink / name}",
                "size": 1,
                "isDir": False,
                "modificationTime": 0,
                "blockReplication": 1,
                "blockSize": 1,
                "action": "add",
            }
        )

    (sink / "_spark_metadata" / "0").write_text("v1\n" + part("a.parquet", [1, 2]))
    (sink / "_spark_metadata" / "1.compact").write_text(
        "v1\n" + part("a.parquet", [1, 2]) + "\n" + part("b.parquet", [3])
    )
    (sink / "_spark_metadata" / "2").write_text("v1\n" + part("c.parquet", [3, 4]))
    part("uncommitted.parquet", [5])
    assert sorted(sink_ids(sink)) == [1, 2, 3, 3, 4]


def test_each_verdict_fails_on_data_that_breaks_it():
    a = RunInterval(task_id="t", broker="b1", start=1.0, end=5.0, acquired=1.0, released=5.0)
    b = RunInterval(task_id="t", broker="b2", start=4.0, end=9.0, acquired=4.0, released=9.0)
    assert not verdicts.no_two_running_owners([a, b]).ok and verdicts.no_two_running_owners([a]).ok
    assert not verdicts.converged(None, ["t: no owner"], 3.0, 30.0).ok and verdicts.converged(2.0, [], 3.0, 30.0).ok
    grow = verdicts.epoch_and_generations_only_grow
    assert not grow([Sample(1.0, 2, "Stable", 5), Sample(2.0, 1, "Stable", 5)]).ok
    assert not grow([Sample(1.0, 2, "Stable", 5), Sample(2.0, 2, "Stable", 4)]).ok
    assert grow([Sample(1.0, 2, "Stable", 5), Sample(2.0, 3, "Stable", 6)]).ok
    bound = ChaosOptions(seed=0).stable_bound_s
    stable = lambda samples, faults_end: verdicts.stable_within_bound(samples, faults_end, bound)[0].ok
    stuck = [Sample(10.0 + i, 2, "PreparingRebalance", 6) for i in range(int(bound) + 3)] + [
        Sample(10.0 + int(bound) + 3, 2, "Stable", 7)
    ]
    assert not stable(stuck, 10.0)
    assert stable(stuck, 14.0), "only the time after the faults stopped counts"
    assert stable(stuck[:2] + [Sample(13.0, 2, "Stable", 7)], 10.0)
    assert not stable([Sample(13.0, 2, "PreparingRebalance", 7)], 10.0), "a group that ends out of Stable fails"


def test_the_throttle_and_maintenance_verdicts_fail_on_data_that_breaks_them():
    throttle = lambda intervals, since: verdicts.moves_within_throttle(
        intervals, since, max_moves=2, max_moves_per_broker=1
    )
    first = [
        RunInterval(task_id=t, broker="b1", start=1.0, end=10.0, acquired=1.0, released=10.0)
        for t in ("t1", "t2", "t3")
    ]
    # three tasks leave b1 at 10 and start, overlapping, on b2 and b3: 3 in flight at once, 2 on b2
    moved = [
        RunInterval(task_id="t1", broker="b2", start=12.0, acquired=11.0),
        RunInterval(task_id="t2", broker="b2", start=12.5, acquired=11.5),
        RunInterval(task_id="t3", broker="b3", start=12.5, acquired=11.8),
    ]
    v = throttle(first + moved, since=5.0)
    assert not v.ok and "at most 3 in flight" in v.details[0], v.details
    waves = [
        RunInterval(task_id="t1", broker="b2", start=12.0, acquired=11.0),
        RunInterval(task_id="t2", broker="b3", start=12.5, acquired=11.5),
        RunInterval(task_id="t3", broker="b2", start=14.0, acquired=13.0),
    ]
    assert throttle(first + waves, since=5.0).ok
    in_maintenance = lambda intervals: verdicts.nothing_moves_in_maintenance(intervals, [[20.0, 40.0]])
    assert in_maintenance(first + waves).ok
    late = RunInterval(task_id="t1", broker="b3", start=31.0, acquired=30.0)
    still = RunInterval(task_id="t1", broker="b2", start=12.0, end=29.0, acquired=11.0, released=29.0)
    assert not in_maintenance(first + [still, late, *waves[1:]]).ok
    under_way = RunInterval(task_id="t1", broker="b2", start=12.0, end=20.5, acquired=11.0, released=20.5)
    assert in_maintenance(
        first + [under_way, RunInterval(task_id="t1", broker="b3", start=22.0, acquired=21.5), *waves[1:]]
    ).ok


def test_a_container_life_ends_where_the_next_begins(tmp_path):
    """A broker that halted (exit 75) is restarted by its restart policy, not by the harness: its open runs
    end at the next life's birth, so a task it ran and someone else took meanwhile is no overlap."""
    from broker_sim.deploy.container_chaos import _journal_intervals
    from broker_sim.sim.checker import double_ownership

    def life(broker: str, born: float, *records: str) -> None:
        (tmp_path / f"{broker}.{int(born * 1e9)}.log").write_text("".join(r + "\n" for r in records))

    life("b1", 100.0, '{"e": "start", "t": "p1", "ts": 101.0}')  # halted at ~110, no stop record
    life("b1", 112.0, '{"e": "start", "t": "p1", "ts": 125.0}')
    life("b2", 100.0, '{"e": "start", "t": "p1", "ts": 115.0}', '{"e": "stop", "t": "p1", "ts": 120.0}')
    got = _journal_intervals(tmp_path, kills={"b1": [200.0]})
    first = next(i for i in got if i.broker == "b1" and i.start == 101.0)
    assert first.end == 112.0 and first.released == 112.0
    assert double_ownership(got, now=300.0) == []
    # an injected kill earlier than the next life still ends the life there
    assert next(i for i in _journal_intervals(tmp_path, kills={"b1": [105.0]}) if i.start == 101.0).end == 105.0


def test_a_kind_the_harness_cannot_inject_is_never_drawn_and_said_why():
    opts = ChaosOptions(seed=1, duration_s=600, leave_out=frozenset({"freeze-broker"}))
    assert {f.kind for f in make_schedule(opts)} == set(DEFAULT_FAULT_KINDS) - {"freeze-broker"}
    assert list(left_out(opts)) == ["freeze-broker"]
    external = ChaosOptions(seed=1, duration_s=600, zk_hosts="127.0.0.1:2181")  # not the run's ZooKeeper to restart
    assert "zk-restart" in left_out(external) and "zk-restart" not in {f.kind for f in make_schedule(external)}
    assert left_out(ChaosOptions(seed=1)) == {}


def test_the_ownerless_verdict_fails_on_a_task_placed_without_a_running_owner_while_stable():
    """Invariant 9 on synthetic placement samples: a task placed on a member that never runs it, the group
    Stable all along (a ghost given work, a member that never took what it was published) fails once past the
    bound and says which task, where and for how long; the same stretch while the group is not Stable, or
    shorter than the bound, passes; the longest ownerless times are measured either way."""
    from broker_sim.chaos import Placement

    bound = ChaosOptions(seed=0).ownerless_bound_s  # 10 s at the defaults
    ghost_given = [Placement(100.0 + i, "Stable", (("t3", "ghost-1"),)) for i in range(13)]
    ghost_given.append(Placement(113.0, "Stable"))
    v, longest, longest_stable = verdicts.placed_tasks_run_while_stable(ghost_given, bound, t0=90.0)
    assert not v.ok and v.details[0] == (
        "t3: placed on ghost-1 with no running owner for 13.0s while the group said Stable (from t+10.0s)"
    ), v.details
    assert longest == longest_stable == 13.0
    reconciling = [Placement(p.t, "Reconciling", p.unowned) for p in ghost_given]
    v, longest, longest_stable = verdicts.placed_tasks_run_while_stable(reconciling, bound)
    assert v.ok and longest == 13.0 and longest_stable == 0.0
    # Stable and Reconciling in turn: each Stable stretch is short, so the verdict holds
    flapping = [Placement(p.t, "Stable" if i % 4 else "Reconciling", p.unowned) for i, p in enumerate(ghost_given)]
    assert verdicts.placed_tasks_run_while_stable(flapping, bound)[0].ok
    # no controller could act for a while (killed or frozen by the harness): the clock starts again after it
    outage = [Placement(p.t, p.state, p.unowned, controller_up=not 4 <= i <= 8) for i, p in enumerate(ghost_given)]
    v, _, longest_stable = verdicts.placed_tasks_run_while_stable(outage, bound)
    assert v.ok and longest_stable == 4.0, (v.details, longest_stable)
    # still ownerless at the last sample: the stretch ends there
    open_end = [Placement(200.0 + i, "Stable", (("t1", "broker-000"),)) for i in range(12)]
    v, _, longest_stable = verdicts.placed_tasks_run_while_stable(open_end, bound)
    assert not v.ok and longest_stable == 11.0 and "t1: placed on broker-000" in v.details[0]
    # moved from one member to another without ever running: one stretch
    moved = [Placement(300.0 + i, "Stable", (("t2", "broker-000" if i < 6 else "broker-001"),)) for i in range(12)]
    assert not verdicts.placed_tasks_run_while_stable(moved, bound)[0].ok
    assert verdicts.placed_tasks_run_while_stable([], bound)[0].ok


def test_only_the_current_generations_assignments_place_tasks():
    """The placement sampler reads placements as the protocol means them. An assignment znode outlives its
    member's place in the group: a broker whose tasks were put off by maintenance mode, back with its rejoin
    put off too, still has its last assignment, which places nothing (CI saw invariant 9 fail on such a
    znode: six tasks 'placed' on broker-001 for a whole maintenance window)."""
    from broker_sim.chaos.checks import current_placements
    from controller.protocol.records.group_messages import Assignment, GroupStateInfo

    def state(st: str, gen: int, members: tuple[str, ...], protocol: str = "cooperative") -> GroupStateInfo:
        return GroupStateInfo(
            state=st, generation=gen, join_generation=gen, controller_epoch=1, protocol=protocol, members=members
        )

    found = {
        "broker-000": Assignment(generation=7, controller_epoch=1, assigned=("t1", "t2")),
        "broker-001": Assignment(generation=5, controller_epoch=1, assigned=("t3", "t4")),  # left at 5
        "broker-002": Assignment(generation=7, controller_epoch=1, assigned=()),
        "broker-003": Assignment(generation=7, controller_epoch=1, error="UNKNOWN_MEMBER_ID"),
    }
    both = ("broker-000", "broker-001", "broker-002", "broker-003")
    assert current_placements(state("Stable", 7, ("broker-000", "broker-002")), found) == {"broker-000": ("t1", "t2")}
    # a member of the generation whose znode is of an older one: not placed in a join round's Stable ...
    assert current_placements(state("Stable", 7, both), found) == {"broker-000": ("t1", "t2")}
    # ... while a sync is in flight its last one stands, and reconcile's member epochs are not generations
    expected = {"broker-000": ("t1", "t2"), "broker-001": ("t3", "t4")}
    assert current_placements(state("AwaitingSync", 7, both), found) == expected
    assert current_placements(state("Stable", 9, both, "reconcile"), found) == expected
    # no group state readable: every znode counts (the verdict errs towards failing)
    assert current_placements(None, found) == expected


def test_the_stranger_verdict_names_a_ghost_given_work():
    from broker_sim.chaos import Placement

    samples = [Placement(1.0, "Stable"), Placement(2.0, "Stable", (("t1", "ghost-5"),), (("ghost-5", 2),))]
    v = verdicts.no_work_for_strangers(samples, ["ghost-5"])
    assert not v.ok and v.details == ["ghost-5: given 2 task(s) (first seen at t+2.0s)"]
    assert verdicts.no_work_for_strangers(samples[:1], ["ghost-5"]).ok


def test_ghost_members_and_rewritten_reports_are_drawn_only_when_asked_for_and_seeded():
    from broker_sim.chaos.schedule import REWRITES

    asked = ChaosOptions(seed=9, duration_s=600, kinds=FAULT_KINDS)
    schedule = make_schedule(asked)
    assert schedule == make_schedule(asked)
    ghosts = [f for f in schedule if f.kind == "ghost-member"]
    rewrites = [f for f in schedule if f.kind == "rewritten-report"]
    assert ghosts and rewrites
    assert {f.variant for f in ghosts} == {"claims", "nothing"} and {f.variant for f in rewrites} == set(REWRITES)
    assert all(f.duration > 0 for f in ghosts) and all(f.duration == 0 for f in rewrites)
    assert "(claims)" in ghosts[[f.variant for f in ghosts].index("claims")].describe()
    # not asked for, never drawn
    plain = make_schedule(ChaosOptions(seed=9, duration_s=600))
    assert not {"ghost-member", "rewritten-report"} & {f.kind for f in plain}


def test_a_journal_is_read_incrementally_and_a_line_cut_short_waits_for_its_end(tmp_path):
    """The placement sampler reads the process brokers' journals every half second for hours: only what was
    appended since, a start not yet followed by a stop runs, and a line still being written is left for the
    next look."""
    from broker_sim.chaos.processes import JournalTail, read_journal

    path = tmp_path / "b.journal"
    tail = JournalTail(path)
    assert tail.running() == set()  # no journal yet
    path.write_text('{"e": "start", "t": "a", "ts": 1.0}\n{"e": "start", "t": "b", "ts": 2.0}\n{"e": "sto')
    assert tail.running() == {"a", "b"}
    with open(path, "a") as f:
        f.write('p", "t": "a", "ts": 3.0}\n{"e": "start", "t": "c", "ts": 4.0}\n')
    assert tail.running() == {"b", "c"}
    assert tail.running() == {"b", "c"}  # nothing new
    assert {i.task_id for i in read_journal(path, "b", None) if i.end is None} == tail.running()
