"""Task runners behind one interface (``base.TaskRunner``): ``noop`` and ``spark``."""

from __future__ import annotations

from typing import Any

from broker_sim.runners.base import RunState, RunStatus, TaskRunner

RUNNERS = ("noop", "spark")


def make_runner(name: str, **options: Any) -> TaskRunner:
    """Build the runner called ``name`` with its options (unknown options are an error)."""
    if name == "noop":
        from broker_sim.runners.noop import NoopRunner

        return NoopRunner(**options)
    if name == "spark":
        from broker_sim.runners.spark import SparkRunner

        return SparkRunner(**options)
    raise ValueError(f"unknown runner {name!r}: choose one of {', '.join(RUNNERS)}")


__all__ = ["RunState", "RunStatus", "TaskRunner", "make_runner", "RUNNERS"]
