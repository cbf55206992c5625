"""What the chaos tests of both tiers share: the fault kinds an in-process run draws (every default kind but the
rolling bounce, which needs broker processes), and a run's summary built from its figures, for the tests of what
the summary says and how it judges (no run)."""

from __future__ import annotations

from typing import Any

from broker_sim.chaos import DEFAULT_FAULT_KINDS
from broker_sim.chaos.summary import ChaosSummary, Verdict

IN_PROCESS_KINDS = tuple(k for k in DEFAULT_FAULT_KINDS if k != "rolling-bounce")


def chaos_summary(verdicts: list[Verdict], **fields: Any) -> ChaosSummary:
    """A summary of a short process-broker run that judged ``verdicts``; ``fields`` override the defaults."""
    figures: dict[str, Any] = {
        "seed": 1,
        "process_brokers": True,
        "brokers": 2,
        "tasks_initial": 4,
        "tasks_final": 4,
        "duration_s": 10,
        "schedule": [],
        "faults_injected": {},
        "faults_failed": [],
        "rebalances": 1,
        "controller_epochs": [1, 2],
        "converge_s": 1.0,
        "convergence_bound_s": 30,
        "longest_unstable_s": 0.5,
        "stable_bound_s": 10,
        "intervals": 8,
        "samples": 50,
        "verdicts": verdicts,
        "wall_s": 12,
    }
    return ChaosSummary(**{**figures, **fields})
