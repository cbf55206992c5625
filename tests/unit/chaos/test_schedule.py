"""The ensemble's fault kinds without a cluster: drawn only with an ensemble of the run's own and only when asked
for, seeded, each alone in the cluster, a lost quorum longer than a session; and verdict 12 failing on a
quorum return after which the tasks did not all run again in time. (The run: tests/e2e/test_chaos.py; the
ensemble's links: tests/e2e/test_ensemble.py.)"""

from __future__ import annotations

from broker_sim.chaos import ChaosOptions, left_out, make_schedule, verdicts
from broker_sim.chaos.schedule import ENSEMBLE_KINDS, EXCLUSIVE, FAULT_KINDS


def test_ensemble_kinds_need_an_ensemble_of_the_runs_own_and_say_why():
    one = ChaosOptions(seed=3, duration_s=600, kinds=FAULT_KINDS)
    assert set(ENSEMBLE_KINDS) <= set(left_out(one)) and "--ensemble 3" in left_out(one)["zk-lose-quorum"]
    assert not set(ENSEMBLE_KINDS) & {f.kind for f in make_schedule(one)}
    external = ChaosOptions(seed=3, duration_s=600, kinds=ENSEMBLE_KINDS, ensemble=3, zk_hosts="127.0.0.1:2181")
    assert make_schedule(external) == []
    three = ChaosOptions(seed=3, duration_s=600, kinds=FAULT_KINDS, ensemble=3)
    assert "zk-restart" in left_out(three) and not set(ENSEMBLE_KINDS) & set(left_out(three))
    # not asked for, never drawn
    plain = make_schedule(ChaosOptions(seed=3, duration_s=600, ensemble=3))
    assert not set(ENSEMBLE_KINDS) & {f.kind for f in plain}


def test_ensemble_faults_are_seeded_alone_in_the_cluster_and_a_lost_quorum_outlasts_a_session():
    opts = ChaosOptions(seed=11, duration_s=600, kinds=(*ENSEMBLE_KINDS, "kill-broker", "task-storm"), ensemble=3)
    schedule = make_schedule(opts)
    assert schedule == make_schedule(opts)
    assert {f.kind for f in schedule} >= set(ENSEMBLE_KINDS)
    assert set(ENSEMBLE_KINDS) <= set(EXCLUSIVE)
    for f in schedule:
        if f.kind in ENSEMBLE_KINDS:  # nothing else begins while it lasts
            assert not [g for g in schedule if g is not f and f.at <= g.at < f.at + f.duration], f
    quorum = [f for f in schedule if f.kind == "zk-lose-quorum"]
    assert quorum and all(f.duration > opts.session_timeout_s for f in quorum)
    cuts = [f for f in schedule if f.kind == "zk-isolate"]
    assert {f.variant for f in cuts} == {"short", "long"} and {f.target for f in cuts} == {"leader", "follower"}
    assert all(f.duration > opts.session_timeout_s for f in cuts if f.variant == "long")
    assert all(f.duration < opts.session_timeout_s for f in cuts if f.variant == "short")
    kills = [f for f in schedule if f.kind.startswith("zk-kill-")]
    assert all(f.target == f.kind.removeprefix("zk-kill-") for f in kills)


def test_verdict_12_fails_when_the_tasks_do_not_all_run_again_in_time_after_the_quorum_returns():
    ok = verdicts.tasks_back_after_quorum([1.6, 2.1], 30.0)
    assert ok.ok and ok.invariant == 12 and "within 2.10s" in ok.details[0]
    late = verdicts.tasks_back_after_quorum([1.6, None, 31.0], 30.0)
    assert not late.ok and [d.split(":")[0] for d in late.details] == ["quorum return 2", "quorum return 3"]
