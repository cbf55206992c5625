"""The deterministic simulation in CI: the real coordinator and members, a simulated ZooKeeper, seeded
faults, the invariants (see broker_sim/sim/protosim.py and protosim_checks.py). Over ten thousand seeded
schedules across the configurations below, spread over the machine's cores; every one must finish without a violation.

A failure names the configuration, the seed and the fault schedule, and how to replay it:

    from tests.unit.sim.test_protosim import CONFIGS
    CONFIGS["scheduled-delay"].make(171).run()

Also here: the checker is not vacuous (with the coordinator's "still owns" check disabled, faulty
leaders break invariant 2), and one seed always replays the same schedule.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import time
import traceback
from dataclasses import dataclass

import pytest

import controller.protocol.group.acks
import controller.protocol.group.coordinator
import controller.protocol.group.join_round
import controller.protocol.group.member
import controller.protocol.group.reconcile
from broker_sim.sim.protosim import ProtocolSim
from broker_sim.sim.protosim_types import SimConfig, SimResult
from controller.protocol.group.rules import COOPERATIVE, EAGER, RECONCILE, validate_proposal

MIN_SCHEDULES = 10_000
#: the reconcile protocol alone gets as many as the others together
MIN_RECONCILE_SCHEDULES = 10_000
RECONCILING = (RECONCILE, COOPERATIVE)
CHUNK = 250
#: ``make test-fast`` runs a sample (ZKC_PROTOSIM_SHARE=0.1: the first tenth of every scenario's seeds) to stay a
#: quick loop; ``make test`` and CI run every schedule
SHARE = float(os.environ.get("ZKC_PROTOSIM_SHARE", "1"))
if not 0.0 < SHARE <= 1.0:
    raise ValueError(f"ZKC_PROTOSIM_SHARE={SHARE!r} is not within (0, 1]")


def sampled(seeds: int) -> int:
    """How many of a scenario's seeds this run plays."""
    return max(1, int(seeds * SHARE))


class UpgradeSim(ProtocolSim):
    """A rolling upgrade: the first members run the old, eager-only software; every member started
    after them (restarts and newcomers) supports both and prefers cooperative."""

    def __init__(self, seed: int, config: SimConfig) -> None:
        super().__init__(seed, dataclasses.replace(config, protocol_mix=((EAGER,),)))
        self.cfg = config


class ReconcileUpgradeSim(ProtocolSim):
    """A rolling upgrade to reconcile: the first members run cooperative-only software; every member
    started after them prefers reconcile (and still speaks cooperative)."""

    def __init__(self, seed: int, config: SimConfig) -> None:
        super().__init__(seed, dataclasses.replace(config, protocol_mix=((COOPERATIVE, EAGER),)))
        self.cfg = config


@dataclass(frozen=True)
class Scenario:
    config: SimConfig
    seeds: int
    sim: type[ProtocolSim] = ProtocolSim
    faulty: bool = False
    reconcile: bool = False

    def make(self, seed: int) -> ProtocolSim:
        return self.sim(seed, self.config)


CONFIGS: dict[str, Scenario] = {
    "cooperative": Scenario(SimConfig(), 2500),
    "eager": Scenario(SimConfig(protocol_mix=((EAGER,),), assignor="sticky"), 1500),
    "mixed-eager-cooperative": Scenario(SimConfig(protocol_mix=((COOPERATIVE, EAGER), (EAGER,))), 1500),
    "upgrade-eager-to-cooperative": Scenario(
        SimConfig(protocol_mix=((COOPERATIVE, EAGER),), faults=6), 1000, sim=UpgradeSim
    ),
    "scheduled-delay": Scenario(SimConfig(scheduled_delay=2.0), 2000),
    "faulty-leaders": Scenario(SimConfig(faulty_leader_probability=0.3), 1500, faulty=True),
    "delay-mixed-faulty": Scenario(
        SimConfig(scheduled_delay=2.0, protocol_mix=((COOPERATIVE, EAGER), (EAGER,)), faulty_leader_probability=0.3),
        500,
        faulty=True,
    ),
    # operators' reassigns and roll steps: planned moves handed to their receiver in the round that revokes them
    "planned-moves": Scenario(SimConfig(planned=True, faults=6), 1000),
    "planned-moves-mixed": Scenario(SimConfig(planned=True, protocol_mix=((COOPERATIVE, EAGER), (EAGER,))), 500),
    "reconcile": Scenario(SimConfig(protocol_mix=(RECONCILING,)), 3000, reconcile=True),
    # ghost members and rewritten reports among the faults: neither obeyed nor a reason to drop a member
    "reconcile-hostile": Scenario(SimConfig(protocol_mix=(RECONCILING,), hostile=True, faults=6), 1000, reconcile=True),
    "reconcile-delay": Scenario(SimConfig(protocol_mix=(RECONCILING,), scheduled_delay=2.0), 2000, reconcile=True),
    "upgrade-cooperative-to-reconcile": Scenario(
        SimConfig(protocol_mix=(RECONCILING,), faults=6), 2000, sim=ReconcileUpgradeSim, reconcile=True
    ),
    # members with and without reconcile come and go: the group enters and leaves it, both ways
    "mixed-reconcile-cooperative": Scenario(
        SimConfig(protocol_mix=(RECONCILING, (COOPERATIVE, EAGER)), faults=6), 2000, reconcile=True
    ),
    # planned moves while the group enters and leaves reconcile: a task handed off in a join round is claimed
    # by its receiver across the switch
    "planned-moves-reconcile-mixed": Scenario(
        SimConfig(planned=True, protocol_mix=(RECONCILING, (COOPERATIVE, EAGER)), faults=6), 500, reconcile=True
    ),
}


# --------------------------------------------------------------------------------------------------
# running schedules (in worker processes)
# --------------------------------------------------------------------------------------------------


@dataclass
class Failure:
    scenario: str
    seed: int
    problems: list[str]
    faults: list[str]


@dataclass
class Chunk:
    failures: list[Failure]
    schedules: int
    refused: int  # proposals the coordinator refused (validation found problems)
    seconds: float
    #: schedules in which fewer than half the drawn faults could strike (they prove too little)
    too_few: int = 0


_refused = 0


def _counting(join, proposal):
    global _refused
    problems = validate_proposal(join, proposal)
    _refused += bool(problems)
    return problems


def _worker_init() -> None:
    # refused proposals are logged as warnings by design: thousands of them here, not worth formatting
    logging.getLogger("controller").setLevel(logging.ERROR)
    logging.getLogger("broker_sim").setLevel(logging.ERROR)
    controller.protocol.group.join_round.validate_proposal = _counting  # (the join round validates proposals)


def run_chunk(name: str, seeds: range) -> Chunk:
    global _refused
    _refused = 0
    scenario = CONFIGS[name]
    failures: list[Failure] = []
    too_few = 0
    start = time.perf_counter()
    for seed in seeds:
        sim = scenario.make(seed)
        try:
            result: SimResult = sim.run()
        except Exception:
            failures.append(Failure(name, seed, [traceback.format_exc(limit=-6)], list(sim.fault_log)))
            continue
        if result.violations:
            problems = [f"invariant {v.invariant} at {v.time:.3f}: {v.detail}" for v in result.violations]
            failures.append(Failure(name, seed, problems, result.faults))
        too_few += not result.injection.enough
    return Chunk(failures, len(seeds), _refused, time.perf_counter() - start, too_few)


def _run_chunk_args(args: tuple[str, range]) -> Chunk:
    return run_chunk(*args)


def run_scenario(name: str) -> Chunk:
    seeds = sampled(CONFIGS[name].seeds)
    jobs = [(name, range(lo, min(lo + CHUNK, seeds))) for lo in range(0, seeds, CHUNK)]
    workers = max(1, min(os.cpu_count() or 1, 4, len(jobs)))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers, initializer=_worker_init) as pool:
        chunks = pool.map(_run_chunk_args, jobs, chunksize=1)
    return Chunk(
        [f for c in chunks for f in c.failures],
        sum(c.schedules for c in chunks),
        sum(c.refused for c in chunks),
        sum(c.seconds for c in chunks),
        sum(c.too_few for c in chunks),
    )


def report(name: str, failures: list[Failure], total: int) -> str:
    lines = [
        f"{len(failures)} of {total} {name!r} schedules failed. Replay one with",
        f"    from tests.unit.sim.test_protosim import CONFIGS; CONFIGS[{name!r}].make(SEED).run()",
    ]
    for f in failures[:5]:
        lines.append(f"seed {f.seed}:")
        lines += [f"    {p}" for p in f.problems[:4]]
        lines.append(f"    faults: {', '.join(f.faults) or '(none)'}")
    if len(failures) > 5:
        lines.append(f"... and seeds {[f.seed for f in failures[5:25]]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# the CI run
# --------------------------------------------------------------------------------------------------


def test_enough_schedules():
    assert sum(s.seeds for s in CONFIGS.values() if not s.reconcile) >= MIN_SCHEDULES
    assert sum(s.seeds for s in CONFIGS.values() if s.reconcile) >= MIN_RECONCILE_SCHEDULES


@pytest.mark.parametrize("name", list(CONFIGS))
def test_seeded_schedules_keep_every_invariant(name: str):
    scenario = CONFIGS[name]
    outcome = run_scenario(name)
    assert outcome.schedules == sampled(scenario.seeds)
    if outcome.failures:
        pytest.fail(report(name, outcome.failures, outcome.schedules), pytrace=False)
    if scenario.faulty:
        # faulty leaders did propose double-owning shuffles (under eager nothing is owned at join time, so
        # there a shuffle is harmless), and the coordinator refused them
        assert outcome.refused >= outcome.schedules // 20, outcome.refused
    # a schedule whose faults mostly found nothing to strike (a restart with no member down) proves too little:
    # judged all the same, and few, or the suite would test less than it says
    assert outcome.too_few <= outcome.schedules // 20, f"{outcome.too_few} schedules with too few faults injected"
    print(
        f"{name}: {outcome.schedules} schedules, {outcome.seconds / outcome.schedules * 1000:.2f} ms each, "
        f"{outcome.refused} proposals refused, {outcome.too_few} with fewer than half their faults injected"
    )


# --------------------------------------------------------------------------------------------------
# the checker is not vacuous; a seed replays
# --------------------------------------------------------------------------------------------------


def test_without_the_still_owns_check_faulty_leaders_break_invariant_2(monkeypatch, caplog):
    def lax(join, proposal):
        return [p for p in validate_proposal(join, proposal) if "still owns" not in p]

    monkeypatch.setattr(controller.protocol.group.join_round, "validate_proposal", lax)
    caplog.set_level(logging.ERROR, logger="controller")
    config = SimConfig(faulty_leader_probability=0.3)
    broken = {}
    for seed in range(20):
        result = ProtocolSim(seed, config).run()
        if any(v.invariant == 2 for v in result.violations):
            broken[seed] = result.violations
    assert broken, "the simulation did not notice a coordinator that lets leaders double-assign"
    # and with the real check, the same seeds are clean
    monkeypatch.undo()
    for seed in list(broken)[:3]:
        assert ProtocolSim(seed, config).run().violations == []


def test_without_waiting_for_releases_reconcile_breaks_invariant_2(monkeypatch, caplog):
    """The planted bug of the reconcile protocol: a coordinator that counts only what it published as
    held (not revocations still unconfirmed, not what members report) hands tasks on too early."""
    monkeypatch.setattr(
        controller.protocol.group.reconcile,
        "holders",
        lambda published, unreleased, requests: {m: set(published.get(m, ())) for m in requests},
    )
    caplog.set_level(logging.ERROR, logger="controller")
    config = CONFIGS["reconcile"].config
    broken = [seed for seed in range(20) if any(v.invariant == 2 for v in ProtocolSim(seed, config).run().violations)]
    assert broken, "the simulation did not notice a reconcile coordinator that hands tasks on before their release"
    monkeypatch.undo()
    for seed in broken[:3]:
        assert ProtocolSim(seed, config).run().violations == []


def test_a_coordinator_that_counts_published_as_running_breaks_invariant_5(monkeypatch, caplog):
    """The planted bug of "Stable means running": a coordinator that takes every member's assignment for
    acknowledged as soon as it is published says Stable while tasks are still being taken."""
    publish = controller.protocol.group.reconcile.ReconcileGroup.publish

    def publish_and_forget(self, draft, changed):
        out = publish(self, draft, changed)
        self.acks.waiting.clear()
        return out

    monkeypatch.setattr(controller.protocol.group.acks.Acks, "acked", lambda self, m, placed=None: True)
    monkeypatch.setattr(controller.protocol.group.reconcile.ReconcileGroup, "publish", publish_and_forget)
    caplog.set_level(logging.ERROR, logger="controller")
    config = CONFIGS["reconcile"].config
    broken = [seed for seed in range(10) if any(v.invariant == 5 for v in ProtocolSim(seed, config).run().violations)]
    assert broken, "the simulation did not notice a Stable group whose tasks were not yet taken"
    monkeypatch.undo()
    for seed in broken[:3]:
        assert ProtocolSim(seed, config).run().violations == []


def test_a_coordinator_that_believes_rewritten_reports_breaks_the_hostile_schedules(monkeypatch, caplog):
    """The planted bug of hostile reports: a coordinator that takes every report as written (no bounds, no
    check of claims) hands tasks on that are still running, or waits forever for a release it was told of."""
    monkeypatch.setattr(
        controller.protocol.group.reconcile.ReconcileGroup,
        "_screen",
        lambda self, draft, snap, everyone=False: (dict(snap), []),
    )
    caplog.set_level(logging.ERROR, logger="controller")
    config = CONFIGS["reconcile-hostile"].config
    broken = [seed for seed in range(80) if ProtocolSim(seed, config).run().violations]
    assert broken, "the simulation did not notice a coordinator that believes rewritten reports"
    monkeypatch.undo()
    for seed in broken[:3]:
        assert ProtocolSim(seed, config).run().violations == []


def test_reconcile_scenarios_really_reconcile_and_switch_both_ways(monkeypatch):
    """The reconcile schedules run the new protocol (no join round once in it), and the mixed ones enter
    and leave it."""
    import controller.protocol.group.coordinator
    import controller.protocol.group.reconcile

    entered, left = [], []
    enter, prepare = (
        controller.protocol.group.reconcile.ReconcileGroup.enter,
        controller.protocol.group.coordinator.GroupCoordinator.prepare_rebalance,
    )

    def counting_enter(self, reason):
        entered.append(reason)
        return enter(self, reason)

    def counting_prepare(self, reason):
        if self.reconcile.active() and not self.reconcile.all_prefer(self.members):
            left.append(reason)
        return prepare(self, reason)

    monkeypatch.setattr(controller.protocol.group.reconcile.ReconcileGroup, "enter", counting_enter)
    monkeypatch.setattr(controller.protocol.group.coordinator.GroupCoordinator, "prepare_rebalance", counting_prepare)
    for seed in range(20):
        sim = CONFIGS["reconcile"].make(seed)
        sim.run()
        assert sim.coordinator.protocol == RECONCILE
        assert sim.coordinator.join_result is None
    assert entered and not left
    entered.clear()
    upgraded = 0
    for seed in range(40):
        sim = CONFIGS["upgrade-cooperative-to-reconcile"].make(seed)
        sim.run()
        upgraded += sim.coordinator.protocol == RECONCILE
    assert upgraded and entered
    entered.clear()
    for seed in range(60):
        CONFIGS["mixed-reconcile-cooperative"].make(seed).run()
    assert entered and left


def test_planned_move_scenarios_really_hand_tasks_off(monkeypatch):
    """The planned-move schedules exercise the handoff: receivers are handed tasks in the round that revokes
    them, and start some of them before the generation that assigns them (the owner znode decides when)."""
    handed: set[tuple[str, int, str]] = set()
    early: set[tuple[str, int, str]] = set()
    assignment_to = ProtocolSim._assignment_to
    started = ProtocolSim.started

    def spy_assignment(self, mid, a):
        handed.update((mid, a.generation, t) for t in a.handoff)
        return assignment_to(self, mid, a)

    def spy_started(self, mid, t, session, hold):
        node = self.nodes.get(mid)
        if node is not None and (mid, node.member.generation, t) in handed:
            early.add((mid, node.member.generation, t))
        return started(self, mid, t, session, hold)

    monkeypatch.setattr(ProtocolSim, "_assignment_to", spy_assignment)
    monkeypatch.setattr(ProtocolSim, "started", spy_started)
    for seed in range(40):
        result = CONFIGS["planned-moves"].make(seed).run()
        assert not result.violations, (seed, result.violations)
    assert len(handed) >= 20 and len(early) >= 10, (len(handed), len(early))


def test_a_seed_replays_the_same_schedule():
    def fingerprint(result: SimResult):
        return (
            result.faults,
            result.events,
            result.rebalances,
            result.converged_at,
            [(v.invariant, v.detail) for v in result.violations],
        )

    for name in ("cooperative", "upgrade-eager-to-cooperative", "faulty-leaders", "reconcile"):
        first = CONFIGS[name].make(12345).run()
        again = CONFIGS[name].make(12345).run()
        assert fingerprint(first) == fingerprint(again)
        assert first.faults  # a schedule with faults in it
    assert fingerprint(CONFIGS["cooperative"].make(1).run()) != fingerprint(CONFIGS["cooperative"].make(2).run())


def test_upgrade_scenario_really_mixes_protocols():
    """The initial members are eager-only; whoever starts later supports cooperative too."""
    seen = set()
    for seed in range(40):
        sim = CONFIGS["upgrade-eager-to-cooperative"].make(seed)
        assert all(n.member.protocols == (EAGER,) for n in sim.nodes.values())
        sim.run()
        seen |= {n.member.protocols for n in sim.nodes.values()}
        if sim.coordinator.protocol == COOPERATIVE:
            seen.add("went cooperative")
    assert {(EAGER,), (COOPERATIVE, EAGER), "went cooperative"} <= seen


def test_a_member_that_does_not_report_its_tasks_starting_again_breaks_invariant_5(monkeypatch, caplog):
    """The planted bug of a fence that lifts: a member that does not report the tasks its fence stopped as
    starting again leaves the group Stable while they start (the partitions that heal inside the session)."""
    monkeypatch.setattr(
        controller.protocol.group.member.Member, "_starting_again", lambda self, last, taken: frozenset()
    )
    caplog.set_level(logging.ERROR, logger="controller")
    config = CONFIGS["reconcile"].config
    broken = [seed for seed in range(40) if any(v.invariant == 5 for v in ProtocolSim(seed, config).run().violations)]
    assert broken, "the simulation did not notice a member silent about tasks starting again after its fence"
    monkeypatch.undo()
    for seed in broken[:3]:
        assert ProtocolSim(seed, config).run().violations == []
