"""Invariant 9's measurement, without a cluster: what one look of the placement sampler records
(``settle_look``), the verdict over the looks of a leader kill inside the ensemble, and how the verdict says a
broker's tasks. The sampler's look cut by a real connection loss: tests/integration/chaos/test_placement_look.py."""

from __future__ import annotations

import re

import pytest

from broker_sim.chaos import ChaosOptions, ChaosSummary, Placement, Verdict, format_summary, verdicts
from broker_sim.chaos.checks import settle_look
from tests.chaos_support import chaos_summary

BOUND = ChaosOptions(seed=0).ownerless_bound_s  # 10 s at the defaults
#: a broker's 23 tasks, as the soak's broker-002 held them (sorted: the first five are the ones it printed)
TASKS = ["pipe-0", "storm0-00006", "storm2-00000", "storm2-00007", "storm3-00003"] + [
    f"storm9-{i:05d}" for i in range(18)
]
ALL_UNOWNED = tuple((t, "broker-002") for t in TASKS)


def test_a_look_cut_by_a_connection_loss_or_failed_is_blind_and_the_next_comes_soon():
    seen = Placement(100.0, "Stable", (("t1", "broker-000"),))
    # a good look: recorded as it is; the next after twice as long as it took, at least the interval
    assert settle_look(seen, 100.0, 0.1, False, 0.5) == (seen, 0.5)
    assert settle_look(seen, 100.0, 0.4, False, 0.5) == (seen, 0.8)
    # cut by a connection loss: nothing it read is one instant; blind from when it began, next look soon
    blind, pause = settle_look(seen, 100.0, 6.5, True, 0.5)
    assert blind == Placement(100.0, None, controller_up=False) and pause == 0.5
    # failed (ZooKeeper unreadable): the same, however long the failure took to come
    assert settle_look(None, 100.0, 60.0, False, 0.5) == (Placement(100.0, None, controller_up=False), 0.5)


def _before(t: float) -> list[Placement]:
    """Looks every half second, every task running, up to ``t``."""
    return [Placement(t - 5.0 + i * 0.5, "Stable") for i in range(10)]


def test_a_leader_kill_inside_the_ensemble_no_longer_counts_as_tasks_placed_without_an_owner():
    """The soak's one breach of invariant 9, its looks rebuilt from the broker logs (times t+ of the fault phase).
    A look began at 1089.2 and read the group Stable; the ensemble's leader was killed at 1089.4, every broker
    fenced and every client (the sampler's too) lost its connection; the look's remaining reads waited in
    kazoo's queue for the reconnection and it read what the brokers ran at 1095.7, after two brokers had
    restarted their tasks and before the third had (it did at 1096.4, 0.13 s after its own reconnection).
    Recorded as one instant at its start, and the next look 2 x 6.5 s later, it made broker-002's 23 tasks
    ownerless while Stable for 19.6 s: the summary printed five of them. They had no running process for
    7.0 s, 6 of which the ensemble had no leader (nothing could act): the bound held."""
    start, took = 1089.2, 6.53
    after_look = start + 3 * took  # the next look: after the look, and a pause twice as long
    recorded_then = [
        *_before(start),
        Placement(start, "Stable", ALL_UNOWNED),
        Placement(after_look, "Stable"),
        Placement(after_look + 0.5, "Stable"),
    ]
    v, _, longest_stable = verdicts.placed_tasks_run_while_stable(recorded_then, BOUND)
    assert not v.ok and round(longest_stable, 1) == 19.6
    assert v.details == [
        "23 tasks: placed on broker-002 with no running owner for 19.6s while the group said Stable "
        "(from t+1089.2s): pipe-0, storm0-00006, storm2-00000, storm2-00007, storm3-00003 and 18 more"
    ]

    # as the sampler records it now: the look the drop cut through is blind, the next comes half a second on
    cut, pause = settle_look(Placement(start, "Stable", ALL_UNOWNED), start, took, True, 0.5)
    nxt = start + took + pause  # 1096.2: broker-002 reconnected, its tasks not started yet
    recorded_now = [
        *_before(start),
        cut,
        Placement(nxt, "Stable", ALL_UNOWNED),
        Placement(nxt + 0.5, "Stable"),
        Placement(nxt + 1.0, "Stable"),
    ]
    v, longest, longest_stable = verdicts.placed_tasks_run_while_stable(recorded_now, BOUND)
    assert v.ok, v.details
    assert longest == longest_stable == 0.5


def test_the_verdict_says_each_members_stretch_once_and_the_summary_what_it_left_out():
    """A broker's tasks stop together: one line per member and stretch (a lone task keeps its own line), and
    the summary says how many lines it did not print."""
    looks = [
        Placement(10.0 + i, "Stable", (("a", "broker-000"), ("b", "broker-000"), ("c", "broker-001")))
        for i in range(12)
    ]
    looks.append(Placement(22.0, "Stable"))
    v, _, _ = verdicts.placed_tasks_run_while_stable(looks, BOUND)
    assert v.details == [
        "2 tasks: placed on broker-000 with no running owner for 12.0s while the group said Stable (from t+10.0s): a, b",
        "c: placed on broker-001 with no running owner for 12.0s while the group said Stable (from t+10.0s)",
    ]
    # eleven members, one stretch each: ten lines and the count of the rest
    many = [Placement(float(i), "Stable", tuple((f"t{m}", f"b{m}") for m in range(11))) for i in range(12)]
    v, _, _ = verdicts.placed_tasks_run_while_stable([*many, Placement(12.0, "Stable")], BOUND)
    assert len(v.details) == 11 and v.details[-1] == "... 1 more"
    text = format_summary(_summary(v))
    assert "      ... 6 more line(s) in --json" in text and text.count("placed on b") == 5


def _summary(v: Verdict) -> ChaosSummary:
    return chaos_summary([v], brokers=11, tasks_initial=11, tasks_final=11)


def test_a_kept_runs_looks_are_judged_again_from_its_work_directory(tmp_path):
    """The looks a run wrote into its work directory give the same verdict again (``zkctl sim rejudge DIR``,
    at the run's bound or another); a file that is not one a run wrote is refused with the line at fault."""
    from broker_sim.chaos.record import PLACEMENTS_FILE, RecordError, read_placements, rejudge, write_placements
    from tests.cli_support import invoke

    looks = [
        *_before(1089.2),
        Placement(1089.2, "Stable", ALL_UNOWNED, (("ghost-1", 2),)),
        Placement(1108.8, None, controller_up=False),
        Placement(1109.3, "Stable"),
    ]
    write_placements(tmp_path / PLACEMENTS_FILE, looks, 1000.0, BOUND)
    assert read_placements(tmp_path / PLACEMENTS_FILE) == (1000.0, BOUND, looks)
    v, _, longest_stable = rejudge(tmp_path)
    assert not v.ok and v.details[0].startswith("23 tasks: placed on broker-002") and "(from t+89.2s)" in v.details[0]
    assert rejudge(tmp_path, bound_s=30.0)[0].ok
    out = invoke(["sim", "rejudge", str(tmp_path)])
    assert out.exit_code == 1 and "invariant 9 FAIL" in out.output and "19.6s" in out.output, out.output
    assert invoke(["sim", "rejudge", str(tmp_path), "--bound", "30"]).exit_code == 0

    bad = tmp_path / "bad"
    bad.mkdir()
    for text, needle in [
        ("", ":1: not a placements file's first line"),
        ('{"t0": 1, "bound_s": 10}\n{"t": 1, "state": "Stable", "up": true, "unowned": [["t1"]]}\n', ":2: not a list"),
        ('{"t0": 1, "bound_s": 10}\n{"t": "x", "state": "Stable", "up": true}\n', ":2: no time or state"),
        ('{"t0": 1, "bound_s": 10}\n[1]\n', ":2: not an object"),
    ]:
        (bad / PLACEMENTS_FILE).write_text(text)
        with pytest.raises(RecordError, match=re.escape(needle)):
            read_placements(bad / PLACEMENTS_FILE)
    missing = invoke(["sim", "rejudge", str(tmp_path / "nowhere")])
    assert missing.exit_code == 1 and "no such file" in missing.output, missing.output
