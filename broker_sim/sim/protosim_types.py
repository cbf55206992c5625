"""The deterministic protocol simulation's vocabulary: its configuration, a simulated worker (a ``Member`` with
its task manager and ZooKeeper session), the violations it records and the result of a run.

Kept apart so that the simulation (``protosim``), its faults (``protosim_faults``) and its invariants
(``protosim_checks``) share one definition of each without importing one another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker_sim.sim.injection import Injection, judge
from broker_sim.worker.phases import TaskPhase
from controller.protocol.group.member import Member
from controller.protocol.group.rules import COOPERATIVE, EAGER

GROUP = "g"


@dataclass(frozen=True)
class SimConfig:
    members: int = 3
    tasks: int = 8
    protocol_mix: tuple[tuple[str, ...], ...] = ((COOPERATIVE, EAGER),)
    assignor: str = "cooperative-sticky"
    min_delay: float = 0.001
    max_delay: float = 0.05
    start_latency: float = 0.05
    stop_latency: float = 0.02
    session_timeout: float = 2.0
    fence_after: float = 1.2
    rebalance_timeout: float = 3.0
    scheduled_delay: float = 0.0
    faults: int = 4
    fault_window: float = 10.0
    settle_bound: float = 20.0
    faulty_leader_probability: float = 0.0
    #: ghost members and rewritten reports among the faults (reconcile groups)
    hostile: bool = False
    #: planned moves among the faults: reassigns and roll steps (pins), handed off in the round that revokes them
    planned: bool = False


@dataclass
class Violation:
    invariant: int
    time: float
    detail: str


@dataclass
class SimResult:
    seed: int
    violations: list[Violation]
    faults: list[str]
    rebalances: int
    events: int
    converged_at: float | None
    #: the faults drawn, and those the world could not take when they struck (``injection``)
    injection: Injection = Injection(0)

    @property
    def ok(self) -> bool:
        """No invariant broken, and at least half the drawn faults happened."""
        return judge(not self.violations, self.injection)[0]


@dataclass
class SimNode:
    """A simulated worker: a Member, its task manager, and its ZooKeeper session."""

    member: Member
    alive: bool = True
    frozen_until: float = 0.0
    partitioned_until: float = 0.0
    session: int = 0
    running: dict[str, float] = field(default_factory=dict)  # task -> start time
    holding: set[str] = field(default_factory=set)  # owner locks held
    stopping: set[str] = field(default_factory=set)
    acquiring: set[str] = field(default_factory=set)
    #: released with the member's report in one write, the answer not back yet: still "held" to the member
    #: (the worker's slot is busy), but its owner lock is free and nothing of it runs
    releasing: set[str] = field(default_factory=set)
    #: each task's phase, moved through the worker's own table (``phases``) as it starts, runs and stops here
    phases: dict[str, TaskPhase] = field(default_factory=dict)
    #: each task's hold here, counted: a start begun for an earlier hold (before a release) is not this one's
    holds: dict[str, int] = field(default_factory=dict)
    last_gen_seen: int = -1
    last_epoch_seen: int = -1
    inbox_time: float = 0.0
    #: the group state's watch is armed (as the worker's: not while the member follows its assignment alone)
    state_watched: bool = True
    backlog: list[Callable[[], None]] = field(default_factory=list)  # held while frozen/partitioned, in order
