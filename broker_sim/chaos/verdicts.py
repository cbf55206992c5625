"""The invariants' verdicts, pure: each is a function of what the run recorded (run intervals, samples of
the epoch and the group, maintenance windows) and of the bounds, so each can be shown failing on data that
breaks it without a cluster."""

from __future__ import annotations

from collections.abc import Sequence

from broker_sim.chaos.summary import Placement, Sample, Verdict
from broker_sim.sim.checker import concurrent_moves, double_ownership, move_runs
from controller.protocol.records.task_records import RunInterval


def no_two_running_owners(intervals: Sequence[RunInterval]) -> Verdict:
    """Invariant 1: no task ever had two running owners (the run intervals never overlap)."""
    overlaps = double_ownership(intervals)
    details = [str(x) for x in overlaps[:10]] or [f"{len(intervals)} run intervals, no overlap"]
    if len(overlaps) > 10:
        details.append(f"... {len(overlaps)} overlaps in all")
    return Verdict(1, "no task ever had two running owners", not overlaps, details)


def converged(converge_s: float | None, last_problems: Sequence[str], hold_s: float, bound_s: float) -> Verdict:
    """Invariant 2: every RUNNING task on exactly one live broker, reached within ``bound_s`` of the last
    fault and held ``hold_s`` (``converge_s``: when it was reached; None: it was not)."""
    if converge_s is None:
        details = [f"not reached and held {hold_s:g}s within {bound_s:.0f}s: " + "; ".join(last_problems[:8])]
    else:
        details = [f"reached {converge_s:.2f}s after the last fault and held {hold_s:g}s (bound {bound_s:.0f}s)"]
    return Verdict(2, "every RUNNING task on exactly one live broker", converge_s is not None, details)


def epoch_and_generations_only_grow(samples: Sequence[Sample]) -> Verdict:
    """Invariant 3: the controller epoch and the group's generation never go down, over every sample."""
    bad: list[str] = []
    last_epoch = last_gen = None
    for s in samples:
        if s.epoch is not None:
            if last_epoch is not None and s.epoch < last_epoch:
                bad.append(f"epoch {last_epoch} -> {s.epoch} at {s.t:.3f}")
            last_epoch = s.epoch if last_epoch is None else max(last_epoch, s.epoch)
        if s.generation is not None:
            if last_gen is not None and s.generation < last_gen:
                bad.append(f"generation {last_gen} -> {s.generation} at {s.t:.3f}")
            last_gen = s.generation if last_gen is None else max(last_gen, s.generation)
    return Verdict(
        3,
        "controller epoch and generations only grow",
        not bad,
        bad[:10] or [f"{len(samples)} samples; epoch up to {last_epoch}, generation up to {last_gen}"],
    )


def stable_within_bound(samples: Sequence[Sample], faults_end: float, bound_s: float) -> tuple[Verdict, float]:
    """Invariant 4: once the faults stopped (``faults_end``: the end of the last fault, or the expiry of the
    session of a broker that halted after it, whichever is later), the group is never out of Stable at one
    generation longer than ``bound_s``, and it ends Stable; also the longest time out of Stable."""
    after = [s for s in samples if s.t >= faults_end and s.state is not None]
    longest = 0.0
    bad: list[str] = []
    run_start: Sample | None = None
    for s in [*after, None]:
        unstable = s is not None and s.state != "Stable"
        if run_start is not None and (s is None or not unstable or s.generation != run_start.generation):
            prev_t = s.t if s is not None else after[-1].t
            length = prev_t - max(run_start.t, faults_end)
            longest = max(longest, length)
            if length > bound_s:
                bad.append(f"{run_start.state} at generation {run_start.generation} for {length:.1f}s")
            run_start = None
        if unstable and run_start is None:
            run_start = s
    if not after:
        bad.append("no samples after the faults stopped")
    elif after[-1].state != "Stable":
        last = after[-1]
        since = next((s.t for s in reversed(after) if s.state == "Stable"), faults_end)
        bad.append(f"ends {last.state} at generation {last.generation}, out of Stable for {last.t - since:.1f}s")
    return Verdict(
        4,
        "no group out of Stable longer than rebalance timeout + delay after the faults",
        not bad,
        bad[:10] or [f"longest out of Stable {longest:.2f}s (bound {bound_s:.0f}s)"],
    ), longest


def moves_within_throttle(
    intervals: Sequence[RunInterval], since: float, max_moves: int | None, max_moves_per_broker: int | None
) -> Verdict:
    """Invariant 7 (with a move throttle): from the brokers' own run intervals, never more moves in flight
    (owner taken, runner not yet started) than ``max_moves`` at once, nor more than ``max_moves_per_broker``
    starting on one broker."""
    moves = move_runs(intervals, (since, float("inf")))
    most, per = concurrent_moves(moves)
    busiest = max(per.items(), key=lambda kv: kv[1]) if per else ("-", 0)
    ok = (max_moves is None or most <= max_moves) and (
        max_moves_per_broker is None or busiest[1] <= max_moves_per_broker
    )
    return Verdict(
        7,
        "no more moves in flight than the throttle allows, in all and per broker",
        ok,
        [
            f"{len(moves)} moves; at most {most} in flight at once (max_moves {max_moves}), "
            f"at most {busiest[1]} starting on {busiest[0]} (max_moves_per_broker {max_moves_per_broker})"
        ],
    )


def nothing_moves_in_maintenance(
    intervals: Sequence[RunInterval], windows: Sequence[Sequence[float | None]], grace_s: float = 3.0
) -> Verdict:
    """Invariant 8 (with maintenance windows, each [on, off]): nothing moves while maintenance mode is on. A
    move counts when a task that ran somewhere after the window opened (plus ``grace_s``, for a move decided
    just before it) starts on another broker before the window closes; moves under way when it opened finish."""
    bad: list[str] = []
    for on, off in windows:
        if on is None:
            continue
        end = off if off is not None else float("inf")
        for m in move_runs(intervals, (on + grace_s, end)):
            if m.source is None:
                continue
            left = max(
                (i.released or i.end or float("inf"))
                for i in intervals
                if i.task_id == m.task_id and i.broker == m.source and (i.acquired or i.start) < m.acquired
            )
            if left > on + grace_s:
                bad.append(f"{m.task_id}: {m.source} -> {m.broker} at {m.acquired:.2f} in [{on:.2f}, {end:.2f}]")
    return Verdict(
        8,
        "nothing moves while maintenance mode is on",
        not bad,
        bad[:10] or [f"{len(windows)} windows, no move inside"],
    )


def _stretch(tasks: Sequence[str], member: str, length: float, since: float) -> str:
    """One line of invariant 9: the tasks placed on ``member`` that had no running owner over one stretch."""
    what = tasks[0] if len(tasks) == 1 else f"{len(tasks)} tasks"
    line = (
        f"{what}: placed on {member} with no running owner for {length:.1f}s while the group said Stable "
        f"(from t+{since:.1f}s)"
    )
    if len(tasks) > 1:
        named = ", ".join(sorted(tasks)[:5])
        line += f": {named}" + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    return line


def placed_tasks_run_while_stable(
    placements: Sequence[Placement], bound_s: float, t0: float = 0.0
) -> tuple[Verdict, float, float]:
    """Invariant 9: no task is placed (in a member's assignment) for longer than ``bound_s`` without a running
    owner while its group says Stable. A stretch runs from the first sample that shows it to the first that
    does not (or the last sample); the placement may change within it. While no controller can act (the
    harness killed or froze the active one) the group's state is stale: such a sample ends a stretch, and the
    clock starts again once a controller can act. Also returns the longest time a placed
    task had no running owner in any state, and the longest while Stable. Times are said as t+ from ``t0``
    (the start of the fault phase, as the schedule says them); the tasks of one member over one stretch are
    one line (a broker's tasks stop together)."""
    # (member, start, end) -> the tasks of one stretch: a broker's tasks stopped together are one line
    bad: dict[tuple[str, float, float], list[str]] = {}
    longest_any = longest_stable = 0.0
    since_any: dict[str, float] = {}
    since_stable: dict[str, tuple[float, str]] = {}
    last_t = placements[-1].t if placements else 0.0
    for p in [*placements, None]:
        now = p.t if p is not None else last_t
        unowned = dict(p.unowned) if p is not None else {}
        stable = p is not None and p.state == "Stable" and p.controller_up
        for task in [x for x in since_any if x not in unowned]:
            longest_any = max(longest_any, now - since_any.pop(task))
        for task in [x for x in since_stable if x not in unowned or not stable]:
            start, member = since_stable.pop(task)
            length = now - start
            longest_stable = max(longest_stable, length)
            if length > bound_s:
                bad.setdefault((member, start, now), []).append(task)
        for task, member in unowned.items():
            since_any.setdefault(task, now)
            if stable:
                since_stable.setdefault(task, (now, member))
    lines = [_stretch(tasks, member, end - start, start - t0) for (member, start, end), tasks in bad.items()]
    details = lines[:10] or [
        f"{len(placements)} samples; longest without a running owner {longest_any:.2f}s, "
        f"{longest_stable:.2f}s of it while Stable (bound {bound_s:.0f}s)"
    ]
    if len(lines) > 10:
        details.append(f"... {len(lines) - 10} more")
    return (
        Verdict(
            9, "no task placed longer than the rebalance timeout without a running owner while Stable", not bad, details
        ),
        longest_any,
        longest_stable,
    )


def no_work_for_strangers(placements: Sequence[Placement], ghosts: Sequence[str], t0: float = 0.0) -> Verdict:
    """Invariant 10 (with ghost members): a member that is no broker of the run (a ghost's znode) is never
    given a task."""
    given: dict[str, tuple[int, float]] = {}
    for p in placements:
        for member, n in p.strangers:
            most, first = given.get(member, (0, p.t))
            given[member] = (max(most, n), first)
    bad = [f"{m}: given {n} task(s) (first seen at t+{first - t0:.1f}s)" for m, (n, first) in sorted(given.items())]
    return Verdict(
        10,
        "a member with no broker behind it is never given work",
        not bad,
        bad[:10] or [f"{len(ghosts)} ghost member(s), none given a task"],
    )


def tasks_back_after_quorum(returns: Sequence[float | None], bound_s: float) -> Verdict:
    """Invariant 12 (with quorum losses): each time the ensemble's quorum came back, every RUNNING task ran
    again on exactly one live broker within ``bound_s`` (``returns``: the seconds it took, None: not within)."""
    late = [i for i, r in enumerate(returns) if r is None or r > bound_s]
    longest = max((r for r in returns if r is not None), default=0.0)
    details = [f"quorum return {i + 1}: tasks not all running again within {bound_s:.0f}s" for i in late] or [
        f"{len(returns)} quorum return(s); every task running again within {longest:.2f}s (bound {bound_s:.0f}s)"
    ]
    return Verdict(12, "every task running again within the bound after the quorum returns", not late, details)
