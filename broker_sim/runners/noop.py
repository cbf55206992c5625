"""The no-op runner: simulated work with configurable start/stop latency, for scale tests and the fast demo.

A NoopPipeline spec may make the task fail (``fail_after_s``) or complete (``complete_after_s``) after a
while, measured from its start, which is how restart-with-backoff and COMPLETED are tested.

``prepare`` pays ``prepare_share`` of the start latency in advance (a planned roll's warm-up): a start of the
same spec then sleeps the rest. The default share is the part of a Spark pipeline's start its own ``prepare``
takes off (docs/benchmarks.md § "The planned roll").
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_sim.runners.base import RunState, RunStatus, TaskRunner
from controller.protocol.clock import Clock, SystemClock
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

#: the share of ``start_latency_s`` a prepare pays in advance by default (what a Spark pipeline's prepare saves
#: of its start, measured in docs/benchmarks.md § "The planned roll")
DEFAULT_PREPARE_SHARE = 0.7


@dataclass
class _Run:
    spec: TaskSpec
    started: float
    generation: int
    stopped: bool = False


class NoopRunner(TaskRunner):
    name = "noop"

    def __init__(
        self,
        start_latency_s: float = 0.0,
        stop_latency_s: float = 0.0,
        clock: Clock | None = None,
        stop_hang: bool = False,
        prepare_share: float = DEFAULT_PREPARE_SHARE,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0.0 <= prepare_share <= 1.0:
            raise ValueError(f"prepare_share {prepare_share!r} is not within 0..1")
        self.start_latency_s = start_latency_s
        self._sleep = sleep  # how a latency is spent (a test hands a recorder: what is slept, not how long it took)
        self.prepare_share = prepare_share
        #: task -> the spec prepared for it (its start then sleeps only the rest of the latency)
        self._prepared: dict[str, TaskSpec] = {}
        #: the latest tasks started from what was prepared (what a test or a benchmark reads)
        self.warm_starts: collections.deque[str] = collections.deque(maxlen=10_000)
        self.stop_latency_s = stop_latency_s
        self.stop_budget_s = stop_latency_s  # the worker stops its tasks in parallel: one latency
        #: a wedged runner, for failure injection: every stop blocks until ``kill``/``close`` (or ``wedge``
        #: toggled off); the broker's deadline watchdog has to escalate
        self.stop_hang = stop_hang
        self._unwedged = threading.Event()
        self.clock = clock or SystemClock()
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def prepare(self, task_id: str, spec: TaskSpec) -> bool:
        if self.prepare_share <= 0:
            return False
        if self.start_latency_s:
            self._sleep(self.start_latency_s * self.prepare_share)
        with self._lock:
            if task_id in self._runs:
                return False  # it started meanwhile (cold): nothing to keep
            self._prepared[task_id] = spec
        return True

    def discard(self, task_id: str) -> None:
        with self._lock:
            self._prepared.pop(task_id, None)

    def prepared(self) -> set[str]:
        """Tasks prepared and not started (nor discarded)."""
        with self._lock:
            return set(self._prepared)

    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        with self._lock:
            warm = self._prepared.pop(task_id, None) == spec
            if warm:
                self.warm_starts.append(task_id)
        if self.start_latency_s:
            self._sleep(self.start_latency_s * ((1.0 - self.prepare_share) if warm else 1.0))
        with self._lock:
            self._runs[task_id] = _Run(spec=spec, started=self.clock.now(), generation=generation)

    def stop(self, task_id: str, timeout: float = 60.0) -> None:
        with self._lock:
            run = self._runs.get(task_id)
        if run is None:
            return
        if self.stop_hang:
            self._unwedged.wait()  # never returns while wedged: bounded only by kill/close
            if self.stop_hang:
                return  # killed: the task did not stop gracefully, and the process ends now
        if self.stop_latency_s:
            self._sleep(self.stop_latency_s)
        with self._lock:
            self._runs.pop(task_id, None)

    def status(self, task_id: str) -> RunStatus:
        with self._lock:
            run = self._runs.get(task_id)
        if run is None:
            return RunStatus(RunState.STOPPED)
        pipeline = run.spec.pipeline
        age = self.clock.now() - run.started
        metrics: dict[str, float] = {"uptime_s": round(age, 3)}
        if isinstance(pipeline, NoopPipeline) and pipeline.cost is not None:
            metrics["load_share"] = pipeline.cost  # its declared cost, reported as a measured one would be
        if isinstance(pipeline, NoopPipeline):
            if pipeline.fail_after_s is not None and age >= pipeline.fail_after_s:
                return RunStatus(
                    RunState.FAILED,
                    error=pipeline.fail_message,
                    trace=f"NoopFailure: {pipeline.fail_message} (after {pipeline.fail_after_s}s)",
                    error_type="NoopFailure",
                )
            if pipeline.complete_after_s is not None and age >= pipeline.complete_after_s:
                return RunStatus(RunState.COMPLETED, metrics=metrics)
        return RunStatus(RunState.RUNNING, metrics=metrics)

    def running(self) -> set[str]:
        with self._lock:
            return set(self._runs)

    def wedge(self, on: bool) -> None:
        """Failure injection at run time: stops hang from now on (or no longer)."""
        self.stop_hang = on
        if on:
            self._unwedged.clear()
        else:
            self._unwedged.set()

    def kill(self) -> None:
        self._unwedged.set()  # a hung stop's thread returns (the broker is halting)
        with self._lock:
            self._runs.clear()
            self._prepared.clear()

    def close(self) -> None:
        self._unwedged.set()
        with self._lock:
            self._runs.clear()
            self._prepared.clear()
