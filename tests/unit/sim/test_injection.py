"""The rule every chaos harness judges a run by, without a cluster: a fault the engine refuses at injection is
recorded as not injected with the engine's message and never fails the run by itself; a broken invariant
does, and so does a run in which fewer than half the drawn faults happened. Checked on the rule itself, on the
player that times the process harness's faults, on both harnesses' summaries, and on the protocol simulation.
(Real refusals: tests/integration/chaos/test_chaos_processes.py and tests/e2e/test_docker.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_sim.chaos.player import play
from broker_sim.chaos.schedule import Fault
from broker_sim.chaos.summary import ChaosSummary, Verdict, format_summary
from broker_sim.deploy.container_chaos import ContainerChaosSummary, summary_lines
from broker_sim.sim.injection import FaultRefused, Injection, NotInjected, judge
from broker_sim.sim.protosim import ProtocolSim
from broker_sim.sim.protosim_types import SimConfig
from controller.protocol.errors import ZkcError
from tests.chaos_support import chaos_summary

PAUSE_REFUSED = "APIError: OCI runtime pause failed: unable to freeze"


def refusals(n: int) -> tuple[NotInjected, ...]:
    return tuple(NotInjected(f"pause-broker on b{i}", PAUSE_REFUSED) for i in range(n))


def test_half_the_drawn_faults_are_enough_fewer_are_not():
    assert Injection(4, refusals(2)).enough and Injection(4, refusals(2)).injected == 2
    assert not Injection(4, refusals(3)).enough
    assert Injection(5, refusals(2)).enough and not Injection(5, refusals(3)).enough
    assert Injection(0).enough  # a run that drew nothing has nothing to fall short of
    with pytest.raises(ValueError):
        Injection(1, refusals(2))


def test_a_refusal_never_fails_a_run_a_broken_invariant_and_too_few_faults_do():
    assert judge(True, Injection(6, refusals(1))) == (True, "OK")
    assert judge(False, Injection(6)) == (False, "VIOLATION")
    assert judge(False, Injection(6, refusals(5)))[1] == "VIOLATION"  # the invariant is said first
    ok, word = judge(True, Injection(6, refusals(4)))
    assert not ok and word == "TOO FEW FAULTS INJECTED (2 of 6)"
    line = Injection(6, refusals(1)).line()
    assert line.startswith("5 of 6 drawn faults injected; not injected: pause-broker on b0: ") and PAUSE_REFUSED in line
    assert "TOO FEW" in Injection(2, refusals(2)).line()
    assert issubclass(FaultRefused, ZkcError) and issubclass(FaultRefused, RuntimeError)


def _player(outcomes: dict[str, Callable[[], None]]) -> tuple[list[Fault], Callable[[Fault], None]]:
    schedule = [Fault(0.01 * i, "freeze-broker", target, 0.01) for i, target in enumerate(outcomes)]

    def begin(f: Fault) -> None:
        outcomes[f.target]()

    return schedule, begin


def _refuse() -> None:
    raise FaultRefused(PAUSE_REFUSED)


def _break() -> None:
    raise KeyError("a harness defect")


def test_the_player_records_a_refusal_apart_from_a_harness_error_and_plays_on():
    schedule, begin = _player({"b0": lambda: None, "b1": _refuse, "b2": _break, "b3": lambda: None})
    said: list[str] = []
    played = play(schedule, begin, lambda s: False, said.append)
    assert played.injected["freeze-broker"] == 2
    assert played.injection.drawn == 4 and played.injection.injected == 3  # the defect is no refusal
    (refused,) = played.injection.not_injected
    assert refused.fault.endswith("b1          for  0.01s") and refused.reason == PAUSE_REFUSED
    assert len(played.failed) == 1 and "KeyError" in played.failed[0]
    assert any(line.startswith("  not injected (" + PAUSE_REFUSED) for line in said), said


def _chaos_summary(verdicts_ok: bool, drawn: int, refused: int) -> ChaosSummary:
    return chaos_summary(
        [Verdict(1, "no task ever had two running owners", verdicts_ok)],
        faults_injected={"freeze-broker": drawn - refused},
        faults_drawn=drawn,
        not_injected=[(n.fault, n.reason) for n in refusals(refused)],
    )


def test_the_process_harness_summary_shows_each_refusal_and_judges_by_the_rule():
    s = _chaos_summary(True, drawn=4, refused=1)
    text = format_summary(s)
    assert s.ok and s.to_dict()["ok"] and text.endswith("verdict            OK")
    assert "not injected       1 of 4 drawn" in text and f"pause-broker on b0: {PAUSE_REFUSED}" in text
    assert not _chaos_summary(False, drawn=4, refused=0).ok
    few = _chaos_summary(True, drawn=4, refused=3)
    assert not few.ok and format_summary(few).endswith("TOO FEW FAULTS INJECTED (1 of 4)")


def _container_summary(drawn: int, refused: int, overlaps: list[str]) -> ContainerChaosSummary:
    return ContainerChaosSummary(
        seed=1,
        schedule=[{"kind": "pause-broker"}] * drawn,
        injected={"pause-broker": drawn - refused},
        failed=[],
        intervals=10,
        overlaps=overlaps,
        restarted_and_back=True,
        converged_s=2.0,
        wall_s=30.0,
        sinks={"pipeline-1": {"expected": 800, "held": 800, "duplicates": 0, "missing": 0}},
        not_injected=[(n.fault, n.reason) for n in refusals(refused)],
    )


def test_the_container_harness_judges_by_the_same_rule():
    s = _container_summary(5, 1, [])
    lines = summary_lines(s)
    assert s.ok and s.to_dict()["ok"] and lines[-1].endswith("OK")
    assert any("not injected (refused by the engine): 1 of 5 drawn" in line for line in lines), lines
    assert any(PAUSE_REFUSED in line for line in lines)
    assert not _container_summary(5, 0, ["t1: b1 overlaps b2"]).ok
    few = _container_summary(5, 3, [])
    assert not few.ok and summary_lines(few)[-1].endswith("TOO FEW FAULTS INJECTED (2 of 5)")


def test_the_protocol_simulation_records_a_fault_that_found_nothing_to_strike():
    """A restart drawn while no member is down strikes nothing: recorded as not injected, with why."""
    found = None
    for seed in range(60):
        result = ProtocolSim(seed, SimConfig()).run()
        refused = [n for n in result.injection.not_injected if n.fault.endswith(" restart")]
        if refused:
            found = (result, refused[0])
            break
    assert found is not None, "no seed of 60 drew a restart with no member down"
    result, refused = found
    assert refused.reason == "no member is down" and result.injection.drawn == len(result.faults)
    assert result.ok == (not result.violations and result.injection.enough)


def test_a_fault_pushed_back_by_an_exclusive_one_that_overran_says_when_it_began():
    """The schedule says planned times; a lost quorum that took a minute to return moves every later fault by
    as much, so the player says when such a fault began, on the clock the verdicts use."""
    now = [100.0]

    def sleep(s: float) -> bool:
        now[0] += s
        return False

    def slow_return() -> None:
        now[0] += 60.0  # the servers took this long to serve again

    schedule = [
        Fault(1.0, "freeze-broker", "b0", 2.0),
        Fault(5.0, "zk-lose-quorum", "two of three", 10.0),
        Fault(20.0, "freeze-broker", "b1", 2.0),
    ]
    said: list[str] = []
    played = play(
        schedule,
        lambda f: slow_return if f.kind == "zk-lose-quorum" else (lambda: None),
        sleep,
        said.append,
        clock=lambda: now[0],
    )
    assert played.injected == {"freeze-broker": 2, "zk-lose-quorum": 1}
    injected = [line for line in said if line.startswith("  injected")]
    assert [line.endswith("late)") for line in injected] == [False, False, True], said
    assert injected[2].endswith("(began at t+80.00s, 60.00s late)"), said
