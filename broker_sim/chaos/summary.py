"""What a chaos run reports: samples, verdicts, the summary and its text form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    t: float
    epoch: int | None
    state: str | None
    generation: int | None


@dataclass
class Verdict:
    invariant: int
    name: str
    ok: bool
    details: list[str] = field(default_factory=list)


@dataclass
class ChaosSummary:
    seed: int
    process_brokers: bool
    brokers: int
    tasks_initial: int
    tasks_final: int
    duration_s: float
    schedule: list[str]
    faults_injected: dict[str, int]
    faults_failed: list[str]
    rebalances: int
    controller_epochs: list[int]
    converge_s: float | None
    convergence_bound_s: float
    longest_unstable_s: float
    stable_bound_s: float
    intervals: int
    samples: int
    verdicts: list[Verdict]
    wall_s: float
    pipelines: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # per pipeline: expected, held, duplicates, missing
    halts: dict[str, int] = field(default_factory=dict)  # broker -> times it halted at its fence deadline

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def format_summary(s: ChaosSummary) -> str:
    lines = [
        f"chaos seed {s.seed} · {'process' if s.process_brokers else 'in-process'} brokers · {s.brokers} brokers · "
        f"tasks {s.tasks_initial} -> {s.tasks_final} · {s.wall_s:.0f}s",
        f"  faults injected    {sum(s.faults_injected.values())} "
        f"({', '.join(f'{k} {v}' for k, v in s.faults_injected.items()) or '-'})",
        f"  faults failed      {len(s.faults_failed)}" + "".join(f"\n    {x}" for x in s.faults_failed[:5]),
        f"  rebalances         {s.rebalances}",
        f"  controller epochs  {' -> '.join(map(str, s.controller_epochs)) or '-'}",
        f"  converged          {'-' if s.converge_s is None else f'{s.converge_s:.2f}s'} after the last fault "
        f"(bound {s.convergence_bound_s:.0f}s)",
        f"  longest unstable   {s.longest_unstable_s:.2f}s (bound {s.stable_bound_s:.0f}s)",
        f"  halted, restarted  {sum(s.halts.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in s.halts.items())})" if s.halts else ""),
    ]
    for v in s.verdicts:
        lines.append(f"  invariant {v.invariant} {'ok  ' if v.ok else 'FAIL'} {v.name}")
        lines += [f"      {d}" for d in v.details[:5]]
    for t, f in s.pipelines.items():
        lines.append(
            f"  pipeline {t}: {f['held']} records held of {f['expected']}, {f['duplicates']} duplicates, "
            f"{f['missing']} missing"
        )
    lines.append("  verdict            " + ("OK" if s.ok else "VIOLATION"))
    return "\n".join(lines)
