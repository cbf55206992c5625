"""``WorkerConfig``: what a broker is told at its start (its id, group, protocols, runner, timings), checked
before anything starts rather than on its event thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.protocol.cluster.layout import check_name
from controller.protocol.group.rules import COOPERATIVE, EAGER
from controller.zk.client import ZkSettings


@dataclass(frozen=True)
class WorkerConfig:
    broker_id: str
    settings: ZkSettings
    group: str = "default"
    instance_id: str | None = None
    capacity: int = 1
    rack: str | None = None
    protocols: tuple[str, ...] = (COOPERATIVE, EAGER)
    assignors: tuple[str, ...] = ("cooperative-sticky",)
    runner: str = "noop"
    runner_options: dict[str, Any] = field(default_factory=dict)
    fence_fraction: float = 1 / 6
    status_interval_s: float = 0.5
    #: a status whose metrics alone changed is rewritten at most this often (state changes: every status tick)
    metrics_interval_s: float = 5.0
    #: the broker samples its load (CPU, memory, tasks' load shares) this often (0: never reports it)
    load_interval_s: float = 10.0
    owner_wait_s: float = 120.0
    pool_size: int = 16
    intervals_flush_s: float = 2.0
    #: each stop's own budget (default: ``deadline.stop_timeout`` of the runner's stop budget)
    stop_timeout_s: float | None = None
    #: how a broker halts at its fence deadline: "exit" the process with ``EXIT_HALTED`` (a broker process,
    #: restarted by its supervisor) or "kill" this worker in-process (embedded workers: simulator, tests)
    on_halt: str = "exit"
    #: this broker's checkpoint root, already decided and scoped (``controller.protocol.tasks.storage.checkpoint_root``):
    #: the storage requests of its tasks are carried out there; None: it answers none
    checkpoint_root: str | None = None
    #: where each pipeline's own log is written (``zkctl task logs``); None: no per-task logs
    task_logs_dir: str | None = None

    def __post_init__(self) -> None:
        check_name("broker id", self.broker_id)  # refused before anything starts, not on the event thread
        check_name("group", self.group)
        if self.instance_id is not None:
            check_name("instance id", self.instance_id)
        if self.on_halt not in ("exit", "kill"):
            raise ValueError(f"on_halt must be 'exit' or 'kill', not {self.on_halt!r}")
        if self.metrics_interval_s < 0:
            raise ValueError("metrics_interval_s must not be negative")
        if self.load_interval_s < 0:
            raise ValueError("load_interval_s must not be negative")
        if self.stop_timeout_s is not None and self.stop_timeout_s <= 0:
            raise ValueError("stop_timeout_s must be positive")
