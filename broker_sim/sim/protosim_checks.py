"""The deterministic simulation's invariants, checked independently of the coordinator's own bookkeeping:

 1. no task ever runs on two members at once (from recorded run intervals);
 2. no published assignment gives a task to a member while another live member of the generation
    holds it (the protocol's own safety, not just the owner-lock fence);
 3. generations and controller epochs seen by every member only grow (checked as members act, in
    ``protosim``);
 4. after the last fault, the group is Stable and every runnable task runs on exactly one live member
    within the stated bound (``converged``);
 5. reconcile: whenever the group state says Stable, every task placed with a live member is held by it (its
    owner lock) and has started there: Stable means running, never "published" nor "taken";
 6. every move of a task's phase on a member (start, run, stop, fence, release, a lost session) is one the
    worker's own table allows (``broker_sim.worker.phases``; checked as members act, in ``protosim``).

Pure functions over what the simulation holds: they return the violations they find, the simulation records
them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker_sim.sim.protosim_types import SimNode, Violation
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.rules import RECONCILE
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import WriteAssignments
from controller.protocol.records.group_messages import GroupStateInfo, JoinRequest, TaskDescriptor


def stable_means_running(
    info: GroupStateInfo,
    coordinator: GroupCoordinator,
    nodes: Mapping[str, SimNode],
    tasks: Mapping[str, TaskDescriptor],
    locks: Mapping[str, str],
    now: float,
    written: Mapping[str, JoinRequest],
) -> list[Violation]:
    """Invariant 5: a reconciling group says Stable only when every task placed with a live member is held
    by that member and runs there (a member that crashed meanwhile is not the coordinator's to know yet, nor
    what a member frozen or cut off has fenced, nor a start its member's report (``written``: the member
    znodes as they are now) says is under way while that report is on its way to the coordinator)."""
    found: list[Violation] = []
    if info.protocol != RECONCILE or info.state != GroupState.STABLE.value:
        return found

    def told(m: str, t: str) -> bool:
        """m's report says t is starting and the coordinator has not read that report yet."""
        w, r = written.get(m), coordinator.members.get(m)
        return w is not None and t in w.starting and (r is None or t not in r.starting)

    for m, ts in coordinator.assignment.items():
        node = nodes.get(m)
        r = coordinator.members.get(m)
        if node is None or not node.alive or r is None or r.incarnation != node.member.incarnation:
            continue  # (a member gone or restarted since: not the coordinator's to know yet)
        cut_off = node.frozen_until > now or node.partitioned_until > now  # (its fence is not the coordinator's to see)
        for t in ts:
            if locks.get(t) != m and t in tasks:
                found.append(Violation(5, now, f"Stable while {t}, placed with {m}, is held by {locks.get(t)}"))
            elif t in tasks and not cut_off and t not in node.running and not told(m, t):
                found.append(Violation(5, now, f"Stable while {t}, held by {m}, has not started there"))
    return found


def publish_is_safe(
    d: WriteAssignments,
    generation_members: Iterable[str],
    nodes: Mapping[str, SimNode],
    locks: Mapping[str, str],
    now: float,
) -> list[Violation]:
    """Invariant 2: nothing handed to X while a live generation member Y holds it."""
    found: list[Violation] = []
    gen_members = set(generation_members)
    for mid, a in d.assignments:
        for t in a.assigned:
            holder = locks.get(t)
            if holder is None or holder == mid or holder not in gen_members:
                continue
            node = nodes.get(holder)
            if node is None or not node.alive:
                continue
            holder_assignment = dict(d.assignments).get(holder)
            if holder_assignment is not None and t in holder_assignment.assigned:
                continue
            if holder_assignment is not None and t in holder_assignment.revoked:
                found.append(
                    Violation(
                        2, now, f"{t} given to {mid} while {holder} still holds it (revoked in the same generation)"
                    )
                )
                continue
            found.append(Violation(2, now, f"{t} given to {mid} while {holder} holds it"))
    return found


def converged(
    coordinator: GroupCoordinator, nodes: Mapping[str, SimNode], tasks: Mapping[str, TaskDescriptor], now: float
) -> bool:
    """Invariant 4's condition: the group is Stable and every task runs on exactly one live member."""
    live = {m for m, n in nodes.items() if n.alive and n.frozen_until <= now and n.partitioned_until <= now}
    if not live:
        return not tasks or True
    if coordinator.state is not GroupState.STABLE:
        return False
    running: dict[str, list[str]] = {}
    for m in live:
        for t in nodes[m].running:
            running.setdefault(t, []).append(m)
    return set(running) == set(tasks) and all(len(v) == 1 for v in running.values())


def no_overlaps(
    intervals: Iterable[tuple[str, str, float, float]], nodes: Mapping[str, SimNode], now: float
) -> list[Violation]:
    """Invariant 1 from recorded intervals only (plus those still open at the end)."""
    found: list[Violation] = []
    closed = list(intervals)
    for mid, n in nodes.items():
        for t, start in n.running.items():
            closed.append((t, mid, start, now))
    by_task: dict[str, list[tuple[float, float, str]]] = {}
    for t, mid, s, e in closed:
        by_task.setdefault(t, []).append((s, e, mid))
    for t, runs in by_task.items():
        runs.sort()
        for (s1, e1, m1), (s2, e2, m2) in zip(runs, runs[1:]):
            if s2 < e1 - 1e-9:
                found.append(Violation(1, s2, f"{t} ran on {m1} [{s1:.3f},{e1:.3f}] and {m2} [{s2:.3f},{e2:.3f}]"))
    return found
