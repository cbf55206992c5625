"""The broker simulator's vocabulary: its options, the scenarios it plays, a step's result and a run's summary,
and the error of a cluster that never converged.

Kept apart so that the simulation (``simulator``), its scenarios (``scenarios``) and its broker farms
(``farm_brokers``) share one definition of each."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from broker_sim.runners.noop import DEFAULT_PREPARE_SHARE
from controller.protocol.cluster.roll_plan import DEFAULT_WARMUP_S, DEFAULT_WAVE
from controller.protocol.errors import ZkcError
from controller.protocol.group.rules import COOPERATIVE, protocols_for

SCENARIOS = (
    "steady",
    "rolling-bounce",
    "add-broker",
    "kill-broker",
    "expire-session",
    "pause-broker",
    "partition-broker",
    "controlled-shutdown",
    "kill-controller",
    "roll",
)


class NotConverged(ZkcError, RuntimeError):
    """The simulated cluster never reached its steady state: the run measured nothing."""


@dataclass(frozen=True)
class SimOptions:
    brokers: int = 3
    tasks: int = 30
    protocol: str = COOPERATIVE
    assignor: str = "cooperative-sticky"
    scenario: str = "steady"
    restart_gap_s: float = 1.0
    seed: int = 0
    start_latency_s: float = 0.0
    stop_latency_s: float = 0.0
    session_timeout_s: float = 6.0
    rebalance_timeout_s: float = 20.0
    scheduled_delay_s: float = 0.0
    static_membership: bool = False
    controlled_shutdown: bool = False
    zk_hosts: str | None = None
    root: str | None = None
    converge_timeout_s: float = 60.0
    use_proxies: bool = False
    intervals_out: str | None = None
    #: broker farm processes the brokers are spread over (0: every broker in this process)
    farms: int = 0
    #: seconds between a task's metric-only status writes (the no-op runner's uptime changes at every poll)
    metrics_interval_s: float = 5.0
    #: seconds the converged cluster runs before the scenario (its steps are measured from a steady cluster)
    settle_s: float = 0.0
    #: a one-step scenario's step taken this many times on the same cluster, each from where the one before
    #: started (an unmeasured step between puts it back: the broker added shut down, the broker killed or
    #: shut down started again, a new standby controller), each after ``settle_s``
    repeat: int = 1
    #: brokers down at a time in the ``roll`` scenario (the controller's planned roll)
    roll_batch: int = 1
    #: tasks in flight at once in the roll scenario (0: a step's moves all at once)
    roll_wave: int = DEFAULT_WAVE
    #: seconds each roll step's first wave waits for its receivers to prepare (``zkctl broker roll --warmup``)
    roll_warmup_s: float = DEFAULT_WARMUP_S
    #: the share of the start latency a no-op task's prepare pays in advance (brokers in this process; a
    #: farm's brokers keep the runner's default)
    prepare_share: float = DEFAULT_PREPARE_SHARE
    #: the roll scenario's first batch restarts in place (False, the default: its tasks move away first)
    roll_in_place: bool = False
    #: load-balanced groups: the controller's window (an imbalance lasts it before anything moves for load)
    load_window_s: float = 60.0
    #: seconds between a broker's load samples (brokers in this process)
    load_interval_s: float = 10.0

    def protocols(self) -> tuple[str, ...]:
        return protocols_for(self.protocol)


@dataclass
class StepResult:
    step: str
    broker: str
    started: float
    left_converged_s: float | None = None
    #: from the step to the instant the cluster converged (see ``Simulation.settled_at``)
    converged_s: float | None = None
    #: from the step to the poll that saw it converged
    detected_s: float | None = None
    #: False for a step that only puts the cluster back between repeats (not a figure of the scenario)
    measured: bool = True


@dataclass
class SimSummary:
    scenario: str
    protocol: str
    brokers: int
    tasks: int
    task_downtime_s: float
    double_ownership: int
    moved_tasks: int
    step_convergence_s: list[float]
    steps: list[dict[str, Any]]
    rebalances: int
    wall_s: float
    window_s: float
    overlaps: list[str] = field(default_factory=list)
    farms: int = 0
    halts: int = 0  # brokers that halted at their fence deadline (restarted, as a supervisor would)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
