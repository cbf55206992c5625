"""The no-op runner: simulated work with configurable start/stop latency, for scale tests and the fast demo.

A NoopPipeline spec may make the task fail (``fail_after_s``) or complete (``complete_after_s``) after a
while, measured from its start, which is how restart-with-backoff and COMPLETED are tested.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from broker_sim.runners.base import RunState, RunStatus, TaskRunner
from controller.protocol.clock import Clock, SystemClock
from controller.protocol.taskspec import NoopPipeline, TaskSpec


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
    ) -> None:
        self.start_latency_s = start_latency_s
        self.stop_latency_s = stop_latency_s
        self.stop_budget_s = stop_latency_s  # the worker stops its tasks in parallel: one latency
        #: a wedged runner, for failure injection: every stop blocks until ``kill``/``close`` (or ``wedge``
        #: toggled off); the broker's deadline watchdog has to escalate
        self.stop_hang = stop_hang
        self._unwedged = threading.Event()
        self.clock = clock or SystemClock()
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()

    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        if self.start_latency_s:
            time.sleep(self.start_latency_s)
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
            time.sleep(self.stop_latency_s)
        with self._lock:
            self._runs.pop(task_id, None)

    def status(self, task_id: str) -> RunStatus:
        with self._lock:
            run = self._runs.get(task_id)
        if run is None:
            return RunStatus(RunState.STOPPED)
        pipeline = run.spec.pipeline
        age = self.clock.now() - run.started
        if isinstance(pipeline, NoopPipeline):
            if pipeline.fail_after_s is not None and age >= pipeline.fail_after_s:
                return RunStatus(
                    RunState.FAILED,
                    error=pipeline.fail_message,
                    trace=f"NoopFailure: {pipeline.fail_message} (after {pipeline.fail_after_s}s)",
                )
            if pipeline.complete_after_s is not None and age >= pipeline.complete_after_s:
                return RunStatus(RunState.COMPLETED, metrics={"uptime_s": round(age, 3)})
        return RunStatus(RunState.RUNNING, metrics={"uptime_s": round(age, 3)})

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

    def close(self) -> None:
        self._unwedged.set()
        with self._lock:
            self._runs.clear()
