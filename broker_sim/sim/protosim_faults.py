"""The deterministic simulation's faults, seeded: when each strikes and what it does to the simulated world.

Faults: member crash (session gone at once), member freeze longer or shorter than the session timeout,
member partition (the worker fences itself before its session can expire), controller failover,
task create/delete/pause churn, a new member joining, and optionally a faulty leader that skips the
cooperative adjustment (which the coordinator's validation must refuse). With ``hostile``: ghost member znodes (no broker of the same session behind them)
claiming live members' tasks with a huge member epoch, and live members' reports rewritten (an epoch never
published, or claims of every task), which the coordinator must neither obey nor drop the member for.

A part of ``ProtocolSim``: each fault is a function of the part of the world it reaches (a small
Protocol: ``MemberFaults``, ``TaskChurn``, ``HostileFaults``), the injector sees their union
(``FaultHost``); the schedule draws from the simulation's one random generator, so a seed replays the
same faults. A drawn fault the world
cannot take when it strikes (a crash with no member alive, a restart with none dead, a rewrite of a report
that is gone) is recorded as not injected, with why, as every chaos harness does (``injection``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Protocol

from broker_sim.sim.injection import NotInjected
from broker_sim.sim.protosim_types import SimConfig, SimNode
from broker_sim.worker.phases import TaskPhase
from controller.protocol.clock import FakeClock
from controller.protocol.group.rules import COOPERATIVE, RECONCILE
from controller.protocol.records.group_messages import JoinRequest, JoinResult, SyncProposal, TaskDescriptor

FAULT_KINDS = (
    "crash",
    "restart",
    "freeze_short",
    "freeze_long",
    "partition_short",
    "partition_long",
    "failover",
    "tasks",
    "join",
)
HOSTILE_KINDS = ("ghost", "rewrite")
#: planned moves (``cfg.planned``): an operator's reassign or a roll's step pins tasks to live members, and each
#: moves in a round that hands it to its receiver at once (``Assignment.handoff``)
PLANNED_KINDS = ("reassign", "roll_step")


class Timeline(Protocol):
    """The seeded state every fault draws from, and the simulation's queue of events."""

    @property
    def cfg(self) -> SimConfig: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def clock(self) -> FakeClock: ...

    def at(self, when: float, fn: Callable[[], None]) -> None: ...


class MemberFaults(Timeline, Protocol):
    """What a member's freeze or partition reaches: the member's node and its runs, session and report."""

    @property
    def nodes(self) -> dict[str, SimNode]: ...

    def respawn(self, mid: str, dead: SimNode) -> None: ...
    def lose_session(self, mid: str, node: SimNode) -> None: ...
    def end_run(self, node: SimNode, mid: str, t: str, fence: bool = False) -> None: ...
    def started(self, mid: str, t: str, session: int, hold: int) -> None: ...
    def move(self, node: SimNode, mid: str, t: str, to: TaskPhase) -> None: ...
    def report_owned(self, mid: str, session: int) -> None: ...
    def check_stable(self) -> None: ...


class TaskChurn(Protocol):
    """What the task churn reaches: the tasks, created or deleted."""

    @property
    def rng(self) -> random.Random: ...
    @property
    def tasks(self) -> Mapping[str, TaskDescriptor]: ...

    def add_task(self) -> None: ...
    def remove_task(self, tid: str) -> None: ...


class PlannedMoves(Protocol):
    """What a planned move reaches: the tasks, the live members, the controller's pins."""

    @property
    def rng(self) -> random.Random: ...
    @property
    def tasks(self) -> Mapping[str, TaskDescriptor]: ...

    def pin(self, placement: Mapping[str, str], whole_step: bool) -> None: ...


class HostileFaults(Timeline, Protocol):
    """What a ghost member or a rewritten report reaches: the member znodes as ZooKeeper holds them."""

    @property
    def nodes(self) -> dict[str, SimNode]: ...
    @property
    def tasks(self) -> Mapping[str, TaskDescriptor]: ...
    @property
    def members_zk(self) -> dict[str, JoinRequest]: ...
    @property
    def member_session(self) -> dict[str, int]: ...
    @property
    def fault_log(self) -> list[str]: ...

    def members_changed(self) -> None: ...


class FaultHost(MemberFaults, TaskChurn, HostileFaults, PlannedMoves, Protocol):
    """What the injector sees of the simulation: all the faults' parts, and the crash, restart, join and
    failover it begins itself."""

    def spawn(self, mid: str) -> None: ...
    def crash(self, mid: str) -> None: ...
    def failover(self) -> None: ...


class FaultInjector:
    """Schedules the run's faults and carries each out on the host."""

    def __init__(self, host: FaultHost) -> None:
        self.host = host
        self.last_fault_at = 0.0
        self.not_injected: list[NotInjected] = []

    def schedule(self) -> None:
        """Draw the run's faults (``cfg.faults`` of them within ``cfg.fault_window``) and queue them."""
        h = self.host
        kinds = list(FAULT_KINDS)
        if h.cfg.hostile:
            kinds += HOSTILE_KINDS
        if h.cfg.planned:
            kinds += PLANNED_KINDS * 2  # (as likely as the other kinds together, about)
        for _ in range(h.cfg.faults):
            when = h.rng.uniform(0.5, h.cfg.fault_window)
            kind = h.rng.choice(kinds)
            self.last_fault_at = max(self.last_fault_at, when)
            h.at(when, partial(self.inject, kind))

    def inject(self, kind: str) -> None:
        h = self.host
        alive = sorted(m for m, n in h.nodes.items() if n.alive)
        dead = sorted(m for m, n in h.nodes.items() if not n.alive)
        h.fault_log.append(f"{h.clock.now():.3f} {kind}")
        if (
            kind in ("crash", "freeze_short", "freeze_long", "partition_short", "partition_long", "rewrite")
            and not alive
        ):
            self._refused(kind, "no member is alive")
        elif kind == "restart" and not dead:
            self._refused(kind, "no member is down")
        if kind == "crash" and alive:
            h.crash(h.rng.choice(alive))
        elif kind == "restart" and dead:
            h.spawn(h.rng.choice(dead))
        elif kind == "freeze_short" and alive:
            freeze(h, h.rng.choice(alive), h.cfg.session_timeout * 0.4)
        elif kind == "freeze_long" and alive:
            freeze(h, h.rng.choice(alive), h.cfg.session_timeout * 1.5)
        elif kind == "partition_short" and alive:
            partition(h, h.rng.choice(alive), h.cfg.session_timeout * 0.8)
        elif kind == "partition_long" and alive:
            partition(h, h.rng.choice(alive), h.cfg.session_timeout * 1.5)
        elif kind == "failover":
            h.failover()
        elif kind == "tasks":
            task_churn(h)
        elif kind == "join":
            h.spawn(f"m{len(h.nodes)}")
        elif kind in PLANNED_KINDS:
            if not alive or not h.tasks:
                self._refused(kind, "no member is alive" if not alive else "no task")
            else:
                planned_move(h, alive, whole_step=kind == "roll_step")
        elif kind == "ghost":
            ghost(h, alive)
        elif kind == "rewrite" and alive:
            # (a member letting tasks go, when there is one: what a false report would hand on too early)
            releasing = [m for m in alive if h.nodes[m].member.pending_revocation or h.nodes[m].stopping]
            refused = rewrite(h, h.rng.choice(releasing or alive))
            if refused:
                self._refused(kind, refused)

    def _refused(self, kind: str, why: str) -> None:
        self.not_injected.append(NotInjected(f"{self.host.clock.now():.3f} {kind}", why))

    def leader_proposal(self, p: SyncProposal, joins: Mapping[int, JoinResult]) -> SyncProposal:
        """The leader's proposal as written: with ``cfg.faulty_leader_probability``, a buggy leader's shuffle
        that ignores who still owns what (the coordinator's validation must refuse it)."""
        h = self.host
        if h.cfg.faulty_leader_probability and h.rng.random() < h.cfg.faulty_leader_probability:
            jr = joins.get(p.generation)
            if jr is not None:
                return SyncProposal(generation=p.generation, leader=p.leader, assigned=self._faulty_assign(jr))
        return p

    def _faulty_assign(self, jr: JoinResult) -> dict[str, tuple[str, ...]]:
        """A buggy leader: shuffles every task to a random member, ignoring who owns what."""
        members = sorted(m.member_id for m in jr.members if not m.leaving) or [jr.leader]
        out: dict[str, list[str]] = {m.member_id: [] for m in jr.members}
        held = set(jr.held)
        for t in jr.tasks:
            if t.task_id not in held:
                out[self.host.rng.choice(members)].append(t.task_id)
        return {m: tuple(ts) for m, ts in out.items()}


# ---- the faults, each on the part of the simulation it reaches ----------------------------------------
def freeze(h: MemberFaults, mid: str, duration: float) -> None:
    """Stopped for ``duration``: past the session timeout its session expires and it starts over."""
    node = h.nodes[mid]
    if not node.alive:
        return
    # (a process frozen already stays frozen until the later of the two ends: a second freeze cannot thaw it)
    node.frozen_until = max(node.frozen_until, h.clock.now() + duration)
    if duration >= h.cfg.session_timeout:
        # the session expires while frozen; a frozen process runs nothing, so its intervals end now
        for t in list(node.running):
            h.end_run(node, mid, t)
        h.at(h.clock.now() + h.cfg.session_timeout, lambda: _expire_frozen(h, mid, node.session))


def _expire_frozen(h: MemberFaults, mid: str, session: int) -> None:
    node = h.nodes.get(mid)
    if node is None or node.session != session or not node.alive:
        return
    h.lose_session(mid, node)
    h.at(node.frozen_until, lambda: h.respawn(mid, node))  # it wakes up, sees LOST, starts over


def partition(h: MemberFaults, mid: str, duration: float) -> None:
    """Cut off from ZooKeeper: the worker fences (stops its tasks) after fence_after < session timeout."""
    node = h.nodes[mid]
    if not node.alive:
        return
    node.partitioned_until = h.clock.now() + duration
    session = node.session

    def fence() -> None:
        n = h.nodes.get(mid)
        if n is None or n.session != session or not n.alive or n.partitioned_until <= h.clock.now():
            return
        for t in list(n.running):
            h.end_run(n, mid, t, fence=True)

    h.at(h.clock.now() + h.cfg.fence_after, fence)
    if duration >= h.cfg.session_timeout:

        def expire() -> None:
            n = h.nodes.get(mid)
            if n is None or n.session != session or not n.alive:
                return
            h.lose_session(mid, n)  # fenced already; its runs end here to make sure
            h.at(n.partitioned_until, lambda: h.respawn(mid, n))

        h.at(h.clock.now() + h.cfg.session_timeout, expire)
    else:

        def heal() -> None:
            n = h.nodes.get(mid)
            if n is None or n.session != session or not n.alive:
                return
            if n.frozen_until > h.clock.now():
                h.at(n.frozen_until, heal)
                return
            # reconnected inside the session: the fence lifts and what it stopped starts again (it still holds
            # their locks), each start taking its time; the worker tells its member, whose report says them
            # starting (the group is not Stable on them until they run)
            for t in sorted(n.holding):
                # (a start still under way from an earlier lift is not started twice: the worker's is busy)
                if t not in n.running and t not in n.stopping and n.phases.get(t) is not TaskPhase.STARTING:
                    h.move(n, mid, t, TaskPhase.STARTING)
                    h.at(h.clock.now() + h.cfg.start_latency, partial(h.started, mid, t, session, n.holds.get(t, 0)))
            h.report_owned(mid, session)
            h.at(h.clock.now() + h.cfg.start_latency * 0.6, h.check_stable)  # while they start: not Stable

        h.at(node.partitioned_until + 0.0005, heal)


def task_churn(h: TaskChurn) -> None:
    if h.rng.random() < 0.5 or len(h.tasks) < 2:
        h.add_task()
    else:
        h.remove_task(h.rng.choice(sorted(h.tasks)))


def planned_move(h: PlannedMoves, alive: list[str], whole_step: bool) -> None:
    """An operator reassigns one task to a live member, or a roll's step pins every task: a third of them to
    live members drawn at random, the rest where the controller last placed them (``whole_step``)."""
    tasks = sorted(h.tasks)
    if not whole_step:
        h.pin({h.rng.choice(tasks): h.rng.choice(alive)}, whole_step=False)
        return
    moving = h.rng.sample(tasks, max(1, len(tasks) // 3))
    h.pin({t: h.rng.choice(alive) for t in moving}, whole_step=True)


def ghost(h: HostileFaults, alive: list[str]) -> None:
    """A member znode with no broker behind it (another session), claiming a live member's tasks with a huge
    member epoch; gone again when its session ends."""
    victim = h.rng.choice(alive) if alive else None
    claimed = tuple(sorted(h.nodes[victim].member.desired)) if victim else ()
    name = f"ghost{len(h.fault_log)}"
    h.members_zk[name] = JoinRequest(
        member_id=name,
        join_generation=2**40,
        generation=2**40,
        protocols=(RECONCILE, COOPERATIVE),
        assignors=(h.cfg.assignor,),
        owned=claimed,
        incarnation="ghost",
    )
    h.member_session[name] = 1_000_000 + len(h.fault_log)
    h.members_changed()
    session = h.member_session[name]

    def gone() -> None:
        if h.member_session.get(name) == session:
            h.members_zk.pop(name, None)
            h.member_session.pop(name, None)
            h.members_changed()

    h.at(h.clock.now() + h.rng.uniform(0.5, 3.0), gone)


def rewrite(h: HostileFaults, mid: str) -> str | None:
    """Someone rewrites a live member's request: a member epoch never published, or claims of every task.
    The member does not know; the coordinator must answer it (INVALID_REPORT) or narrow the claims. Returns why not, when there is no report to rewrite."""
    r = h.members_zk.get(mid)
    if r is None:
        return f"{mid} has no report to rewrite"
    if h.rng.random() < 0.5:  # releases it never made, at an epoch never published
        bad = dataclasses.replace(r, generation=2**60, owned=(), pending=())
    else:
        bad = dataclasses.replace(r, owned=tuple(sorted(h.tasks)))
    h.members_zk[mid] = bad
    h.members_changed()
    return None
