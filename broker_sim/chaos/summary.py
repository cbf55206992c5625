"""What a chaos run reports: samples, verdicts, the summary and its text form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from broker_sim.sim.injection import Injection, NotInjected, judge


@dataclass(frozen=True)
class Sample:
    t: float
    epoch: int | None
    state: str | None
    generation: int | None


@dataclass(frozen=True)
class Placement:
    """What the placement sampler saw at ``t``: the group's state, the placed tasks with no running owner
    (task, member it is placed on) and members that are no broker of the run given tasks (member, count).
    Only placements on a member that can run them count: a broker the harness killed, froze or cut off, or a
    previous life whose session has not expired yet, is left to the session timeout."""

    t: float
    state: str | None
    unowned: tuple[tuple[str, str], ...] = ()
    strangers: tuple[tuple[str, int], ...] = ()
    #: an active controller that can act (not one the harness killed or froze, whose /controller znode
    #: stays until its session expires): a group's state is only as fresh as that
    controller_up: bool = True


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
    wedged_busy: int = 0  # wedged-stop faults whose broker ran a task when cut off: each must end in a halt
    #: the longest a placed task had no running owner (any group state; while the group said Stable)
    overlaps: int = 0  # two running owners of one task at once (verdict 1)
    longest_ownerless_s: float = 0.0
    longest_ownerless_stable_s: float = 0.0
    ownerless_bound_s: float = 0.0
    #: the faults the schedule drew, and those the engine refused at injection (fault, engine's message)
    faults_drawn: int = 0
    not_injected: list[tuple[str, str]] = field(default_factory=list)
    ensemble: int = 1  # ZooKeeper servers of the run's own
    #: per quorum loss: seconds from the quorum's return until every task ran again (None: not within the bound)
    quorum_returns: list[float | None] = field(default_factory=list)

    @property
    def injection(self) -> Injection:
        return Injection(self.faults_drawn, tuple(NotInjected(f, r) for f, r in self.not_injected))

    @property
    def ok(self) -> bool:
        """Every invariant holds, and at least half the drawn faults happened (refusals alone never fail it)."""
        return judge(all(v.ok for v in self.verdicts), self.injection)[0]

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
        f"  not injected       {len(s.not_injected)} of {s.faults_drawn} drawn (refused by the engine)"
        + "".join(f"\n    {f}: {r}" for f, r in s.not_injected[:10]),
        f"  faults failed      {len(s.faults_failed)}" + "".join(f"\n    {x}" for x in s.faults_failed[:5]),
        f"  rebalances         {s.rebalances}",
        f"  controller epochs  {' -> '.join(map(str, s.controller_epochs)) or '-'}",
        f"  converged          {'-' if s.converge_s is None else f'{s.converge_s:.2f}s'} after the last fault "
        f"(bound {s.convergence_bound_s:.0f}s)",
        f"  longest unstable   {s.longest_unstable_s:.2f}s (bound {s.stable_bound_s:.0f}s)",
        f"  longest ownerless  {s.longest_ownerless_s:.2f}s, {s.longest_ownerless_stable_s:.2f}s of it while Stable "
        f"(bound {s.ownerless_bound_s:.0f}s)",
        *(
            [
                "  quorum returns     "
                + (", ".join("-" if q is None else f"{q:.2f}s" for q in s.quorum_returns) or "-")
                + f" until every task ran again (ensemble of {s.ensemble}, bound {s.convergence_bound_s:.0f}s)"
            ]
            if s.ensemble > 1
            else []
        ),
        f"  halted, restarted  {sum(s.halts.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in s.halts.items())})" if s.halts else ""),
    ]
    for v in s.verdicts:
        lines.append(f"  invariant {v.invariant} {'ok  ' if v.ok else 'FAIL'} {v.name}")
        lines += [f"      {d}" for d in v.details[:5]]
        if len(v.details) > 5:  # (a verdict's own last line may say how many more it left out)
            lines.append(f"      ... {len(v.details) - 5} more line(s) in --json")
    lost = sum(f["missing"] for f in s.pipelines.values())
    twice = sum(f["duplicates"] for f in s.pipelines.values())
    lines.insert(
        3,
        f"  overlaps           {s.overlaps} (of {s.intervals} run intervals)"
        + (f" · records lost {lost}, duplicated {twice}" if s.pipelines else ""),
    )
    for t, f in s.pipelines.items():
        lines.append(
            f"  pipeline {t}: {f['held']} records held of {f['expected']}, {f['duplicates']} duplicates, "
            f"{f['missing']} missing"
        )
    lines.append("  verdict            " + judge(all(v.ok for v in s.verdicts), s.injection)[1])
    return "\n".join(lines)
