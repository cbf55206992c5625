"""Deterministic simulation of the protocol core: the real sans-IO GroupCoordinator and Members, a
simulated ZooKeeper (ephemeral nodes, owner locks, watches delivered per client in order with seeded
delays), seeded faults, and invariant checks. One seed = one reproducible schedule.

Faults: member crash (session gone at once), member freeze longer or shorter than the session timeout,
member partition (the worker fences itself before its session can expire), controller failover,
task create/delete/pause churn, and optionally a faulty leader that skips the cooperative adjustment
(which the coordinator's validation must refuse). With ``hostile``: ghost member znodes (no broker of the
same session behind them) claiming live members' tasks with a huge member epoch, and live members' reports
rewritten (an epoch never published, or claims of every task), which the coordinator must neither obey nor
drop the member for.

Invariants checked (independent of the coordinator's own bookkeeping):
 1. no task ever runs on two members at once (from recorded run intervals);
 2. no published assignment gives a task to a member while another live member of the generation
    holds it (the protocol's own safety, not just the owner-lock fence);
 3. generations and controller epochs seen by every member only grow;
 4. after the last fault, the group is Stable and every runnable task runs on exactly one live member
    within the stated bound;
 5. reconcile: whenever the group state says Stable, every task placed with a live member is held by it (its
    owner lock): Stable means running, never "published".
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from controller.protocol.clock import FakeClock
from controller.protocol.codecs import Assignment, GroupStateInfo, JoinRequest, JoinResult, SyncProposal, TaskDescriptor
from controller.protocol.group import GroupCoordinator
from controller.protocol.group_state import GroupState
from controller.protocol.group_types import (
    Decision,
    DeleteGenerationsBelow,
    GroupConfig,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.member import Exit, Member, ReadJoinResult, SetDesired, WriteJoin, WriteProposal
from controller.protocol.reports import ghost_reason
from controller.protocol.rules import COOPERATIVE, EAGER, RECONCILE, run_assignor

GROUP = "g"


@dataclass(frozen=True)
class SimConfig:
    members: int = 3
    tasks: int = 8
    protocol_mix: tuple[tuple[str, ...], ...] = ((COOPERATIVE, EAGER),)
    assignor: str = "cooperative-sticky"
    min_delay: float = 0.001
    max_delay: float = 0.05
    start_latency: float = 0.05
    stop_latency: float = 0.02
    session_timeout: float = 2.0
    fence_after: float = 1.2
    rebalance_timeout: float = 3.0
    scheduled_delay: float = 0.0
    faults: int = 4
    fault_window: float = 10.0
    settle_bound: float = 20.0
    faulty_leader_probability: float = 0.0
    #: ghost members and rewritten reports among the faults (reconcile groups)
    hostile: bool = False


@dataclass
class Violation:
    invariant: int
    time: float
    detail: str


@dataclass
class SimResult:
    seed: int
    violations: list[Violation]
    faults: list[str]
    rebalances: int
    events: int
    converged_at: float | None


@dataclass
class _Node:
    """A simulated worker: a Member, its task manager, and its ZooKeeper session."""

    member: Member
    alive: bool = True
    frozen_until: float = 0.0
    partitioned_until: float = 0.0
    session: int = 0
    running: dict[str, float] = field(default_factory=dict)  # task -> start time
    holding: set[str] = field(default_factory=set)  # owner locks held
    stopping: set[str] = field(default_factory=set)
    acquiring: set[str] = field(default_factory=set)
    #: released with the member's report in one write, the answer not back yet: still "held" to the member
    #: (the worker's slot is busy), but its owner lock is free and nothing of it runs
    releasing: set[str] = field(default_factory=set)
    last_gen_seen: int = -1
    last_epoch_seen: int = -1
    inbox_time: float = 0.0
    #: the group state's watch is armed (as the worker's: not while the member follows its assignment alone)
    state_watched: bool = True
    backlog: list[Callable[[], None]] = field(default_factory=list)  # held while frozen/partitioned, in order


class ProtocolSim:
    def __init__(self, seed: int, config: SimConfig = SimConfig()) -> None:
        self.seed = seed
        self.cfg = config
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.queue: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.events = 0
        self.violations: list[Violation] = []
        self.fault_log: list[str] = []
        self.intervals: list[tuple[str, str, float, float]] = []  # task, member, start, end
        # simulated ZooKeeper
        self.epoch = 1
        self.members_zk: dict[str, JoinRequest] = {}
        self.member_session: dict[str, int] = {}
        self.assignments_zk: dict[str, Assignment] = {}
        self.state_zk: GroupStateInfo | None = None
        self.joins_zk: dict[int, JoinResult] = {}
        self.proposals_zk: dict[int, SyncProposal] = {}
        self.locks: dict[str, str] = {}
        self.tasks: dict[str, TaskDescriptor] = {f"t{i}": TaskDescriptor(task_id=f"t{i}") for i in range(config.tasks)}
        self.next_task = config.tasks
        self.coordinator = self._new_coordinator()
        self.coordinator.on_tasks(self._runnable())
        self.controller_busy_until = 0.0
        self.controller_inbox = 0.0
        self.rebalances_before = 0
        self.nodes: dict[str, _Node] = {}
        for i in range(config.members):
            self._spawn(f"m{i}")
        self.last_fault_at = 0.0

    # ---- scheduling -------------------------------------------------------------------------------
    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (when, self.seq, fn))

    def _delay(self) -> float:
        return self.rng.uniform(self.cfg.min_delay, self.cfg.max_delay)

    def _to_controller(self, fn: Callable[[], None]) -> None:
        # watches reach the controller in order (one session): monotone delivery times
        self.controller_inbox = max(self.controller_inbox, self.clock.now()) + self._delay()
        epoch = self.epoch

        def deliver() -> None:  # a watch of an earlier controller's session is lost with it
            if self.epoch == epoch:
                fn()

        self._at(self.controller_inbox, deliver)

    def _to_member(self, mid: str, fn: Callable[[], None]) -> None:
        node = self.nodes.get(mid)
        if node is None:
            return
        node.inbox_time = max(node.inbox_time, self.clock.now()) + self._delay()
        session = node.session

        def deliver() -> None:
            n = self.nodes.get(mid)
            if n is None or not n.alive or n.session != session:
                return
            if n.backlog or n.frozen_until > self.clock.now() or n.partitioned_until > self.clock.now():
                # held until the member runs / reconnects again, then delivered in the same order
                n.backlog.append(fn)
                if len(n.backlog) == 1:
                    self._at(max(n.frozen_until, n.partitioned_until) + 0.001, lambda: self._drain(mid, n))
                return
            fn()

        self._at(node.inbox_time, deliver)

    def _drain(self, mid: str, n: _Node) -> None:
        if self.nodes.get(mid) is not n or not n.alive:
            return
        if n.frozen_until > self.clock.now() or n.partitioned_until > self.clock.now():
            self._at(max(n.frozen_until, n.partitioned_until) + 0.001, lambda: self._drain(mid, n))
            return
        while n.backlog and self.nodes.get(mid) is n and n.alive:
            n.backlog.pop(0)()

    # ---- controller ------------------------------------------------------------------------------
    def _new_coordinator(self) -> GroupCoordinator:
        return GroupCoordinator(
            group=GROUP,
            controller_epoch=self.epoch,
            clock=self.clock,
            config=GroupConfig(
                rebalance_timeout_s=self.cfg.rebalance_timeout,
                scheduled_rebalance_delay_s=self.cfg.scheduled_delay,
                default_assignor=self.cfg.assignor,
            ),
        )

    def _apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, WriteGroupState):
                self.state_zk = d.info
                self._check_stable_means_running(d.info)
                for mid, node in list(self.nodes.items()):
                    if node.state_watched:
                        self._to_member(mid, partial(self._group_state_to, mid, d.info))
            elif isinstance(d, WriteJoinResult):
                self.joins_zk[d.result.generation] = d.result
            elif isinstance(d, WriteAssignments):
                self._check_publish(d)
                for mid, a in d.assignments:
                    self.assignments_zk[mid] = a
                    self._to_member(mid, partial(self._assignment_to, mid, a))
            elif isinstance(d, WatchSync):
                gen = d.generation
                if gen in self.proposals_zk:
                    p = self.proposals_zk[gen]
                    self._to_controller(partial(self._proposal_arrives, p))
            elif isinstance(d, DeleteGenerationsBelow):
                for g in [g for g in self.joins_zk if g < d.generation]:
                    del self.joins_zk[g]
                for g in [g for g in self.proposals_zk if g < d.generation]:
                    del self.proposals_zk[g]
        self._schedule_tick()

    def _controller(self, step: Callable[[], list[Decision]]) -> None:
        self.events += 1
        self._apply(step())

    def _proposal_arrives(self, p: SyncProposal) -> None:
        self._controller(lambda: self.coordinator.on_proposal(p))

    def _assignment_to(self, mid: str, a: Assignment) -> None:
        self._member_do(mid, self.nodes[mid].member.on_assignment(a))

    def _join_result_to(self, mid: str, gen: int) -> None:
        if gen in self.joins_zk:
            self._member_do(mid, self.nodes[mid].member.on_join_result(self.joins_zk[gen]))

    def _schedule_tick(self) -> None:
        deadline = self.coordinator.next_deadline()
        if deadline is not None:
            epoch = self.epoch

            def tick() -> None:
                if self.epoch == epoch:
                    self._controller(self.coordinator.on_tick)

            self._at(max(deadline, self.clock.now()) + 0.0001, tick)

    def _runnable(self) -> dict[str, TaskDescriptor]:
        return dict(self.tasks)

    def _members_changed(self) -> None:
        # the snapshot as of this change: the controller sees every membership change in order (the real
        # one tells a bounced member's new znode from the old by its czxid even when the data is equal);
        # a member znode with no live broker of the same session behind it is a ghost, set apart as the
        # controller's IO layer does (the same rule)
        snapshot = self._live_members()
        self._to_controller(lambda: self._controller(lambda: self.coordinator.on_members(dict(snapshot))))

    def _live_members(self) -> dict[str, JoinRequest]:
        """The member znodes with a live broker of the same session behind them (no ghosts)."""
        brokers = {m: n.session for m, n in self.nodes.items() if n.alive}
        return {
            m: r
            for m, r in self.members_zk.items()
            if not ghost_reason(m, self.member_session.get(m), brokers.get(m), m in brokers)
        }

    def _check_stable_means_running(self, info: GroupStateInfo) -> None:
        """Invariant 5: a reconciling group says Stable only when every task placed with a live member is held
        by that member (a member that crashed meanwhile is not the coordinator's to know yet)."""
        if info.protocol != RECONCILE or info.state != GroupState.STABLE.value:
            return
        for m, ts in self.coordinator.assignment.items():
            node = self.nodes.get(m)
            r = self.coordinator.members.get(m)
            if node is None or not node.alive or r is None or r.incarnation != node.member.incarnation:
                continue  # (a member gone or restarted since: not the coordinator's to know yet)
            for t in ts:
                if self.locks.get(t) != m and t in self.tasks:
                    self.violations.append(
                        Violation(
                            5, self.clock.now(), f"Stable while {t}, placed with {m}, is held by {self.locks.get(t)}"
                        )
                    )

    def _check_publish(self, d: WriteAssignments) -> None:
        """Invariant 2: nothing handed to X while a live generation member Y holds it."""
        gen_members = set(self.coordinator.generation_members)
        for mid, a in d.assignments:
            for t in a.assigned:
                holder = self.locks.get(t)
                if holder is None or holder == mid or holder not in gen_members:
                    continue
                node = self.nodes.get(holder)
                if node is None or not node.alive:
                    continue
                holder_assignment = dict(d.assignments).get(holder)
                if holder_assignment is not None and t in holder_assignment.assigned:
                    continue
                if holder_assignment is not None and t in holder_assignment.revoked:
                    self.violations.append(
                        Violation(
                            2,
                            self.clock.now(),
                            f"{t} given to {mid} while {holder} still holds it (revoked in the same generation)",
                        )
                    )
                    continue
                self.violations.append(Violation(2, self.clock.now(), f"{t} given to {mid} while {holder} holds it"))

    # ---- members ----------------------------------------------------------------------------------
    def _spawn(self, mid: str) -> None:
        prefs = self.rng.choice(self.cfg.protocol_mix)
        old = self.nodes.get(mid)
        session = (old.session + 1) if old else 1

        member = Member(
            member_id=mid,
            assign=run_assignor,
            protocols=prefs,
            assignors=(self.cfg.assignor,),
            incarnation=f"{mid}.{session}",
        )
        node = _Node(member=member, session=session)
        self.nodes[mid] = node
        self._member_do(mid, member.start(self.state_zk))

    def _respawn(self, mid: str, dead: _Node) -> None:
        """The process behind a lost session starts over, unless it was restarted meanwhile."""
        if self.nodes.get(mid) is dead:
            self._spawn(mid)

    def _faulty_assign(self, jr: JoinResult) -> dict[str, tuple[str, ...]]:
        """A buggy leader: shuffles every task to a random member, ignoring who owns what."""
        members = sorted(m.member_id for m in jr.members if not m.leaving) or [jr.leader]
        out: dict[str, list[str]] = {m.member_id: [] for m in jr.members}
        held = set(jr.held)
        for t in jr.tasks:
            if t.task_id not in held:
                out[self.rng.choice(members)].append(t.task_id)
        return {m: tuple(ts) for m, ts in out.items()}

    def _member_do(self, mid: str, actions: Sequence[object]) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive:
            return
        m = node.member
        if m.generation >= 0:
            if m.generation < node.last_gen_seen:
                self.violations.append(
                    Violation(3, self.clock.now(), f"{mid} generation went back {node.last_gen_seen}->{m.generation}")
                )
            node.last_gen_seen = max(node.last_gen_seen, m.generation)
        if m.epoch_seen < node.last_epoch_seen:
            self.violations.append(Violation(3, self.clock.now(), f"{mid} epoch went back"))
        node.last_epoch_seen = max(node.last_epoch_seen, m.epoch_seen)
        for act in actions:
            if isinstance(act, WriteJoin):
                self.members_zk[mid] = act.request
                self.member_session[mid] = node.session
                self._members_changed()
            elif isinstance(act, ReadJoinResult):
                gen = act.generation
                self._to_member(mid, partial(self._join_result_to, mid, gen))
            elif isinstance(act, WriteProposal):
                p = act.proposal
                if self.cfg.faulty_leader_probability and self.rng.random() < self.cfg.faulty_leader_probability:
                    # a buggy leader: proposes a shuffle, ignoring who still owns what
                    jr = self.joins_zk.get(p.generation)
                    if jr is not None:
                        p = SyncProposal(generation=p.generation, leader=p.leader, assigned=self._faulty_assign(jr))
                self.proposals_zk[p.generation] = p
                if self.coordinator.state is GroupState.AWAITING_SYNC and self.coordinator.generation == p.generation:
                    self._to_controller(partial(self._proposal_arrives, p))
            elif isinstance(act, SetDesired):
                self._reconcile(mid)
                if m.reconcile_mode:  # the worker reports what it holds once its stops and starts are under way
                    session = node.session
                    self._at(self.clock.now() + 0.0001, partial(self._report_owned, mid, session))
            elif isinstance(act, Exit):
                self._crash(mid, clean=True)
        if not node.state_watched and not m.follows_assignment_alone and node.alive and self.nodes.get(mid) is node:
            self._reread_group_state(mid, node)

    def _group_state_to(self, mid: str, info: GroupStateInfo) -> None:
        """The group state's watch fired at the member: as the worker does, a member that follows its
        assignment alone does not read it, and its watch stays disarmed until it reads the state again."""
        node = self.nodes[mid]
        if node.member.follows_assignment_alone:
            node.state_watched = False
            return
        self._member_do(mid, node.member.on_group_state(info))

    def _reread_group_state(self, mid: str, node: _Node) -> None:
        """The member stopped following its assignment alone: the worker reads the group state again (its
        current value, when the read arrives), which arms the watch."""
        node.state_watched = True

        def read() -> None:
            if self.state_zk is not None:
                self._member_do(mid, self.nodes[mid].member.on_group_state(self.state_zk))

        self._to_member(mid, read)

    def _reconcile(self, mid: str) -> None:
        node = self.nodes[mid]
        desired = node.member.desired
        for t in sorted(node.holding - desired - node.stopping):
            node.stopping.add(t)
            session = node.session
            self._at(self.clock.now() + self.cfg.stop_latency, partial(self._stopped, mid, t, session))
        for t in sorted(desired - node.holding - node.acquiring - node.releasing):
            node.acquiring.add(t)
            self._acquire(mid, t, node.session)

    def _report_owned(self, mid: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive or node.session != session:
            return
        self._member_do(
            mid,
            node.member.on_owned(frozenset(node.holding | node.acquiring | node.releasing), frozenset(node.holding)),
        )

    def _acquire(self, mid: str, t: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive or node.session != session:
            return
        if t not in node.member.desired or node.partitioned_until > self.clock.now() or t not in self.tasks:
            node.acquiring.discard(t)  # given up: no longer "may hold any moment"
            self._report_owned(mid, session)
            return
        if t in self.locks:
            self._at(self.clock.now() + 0.02, lambda: self._acquire(mid, t, session))  # watch on the owner znode
            return
        self.locks[t] = mid
        node.acquiring.discard(t)
        node.holding.add(t)
        self._at(self.clock.now() + self.cfg.start_latency, lambda: self._started(mid, t, session))

    def _started(self, mid: str, t: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive or t not in node.holding:
            return
        if node.frozen_until > self.clock.now():
            self._at(node.frozen_until, lambda: self._started(mid, t, session))
            return
        node.running[t] = self.clock.now()
        self._member_do(
            mid,
            node.member.on_owned(frozenset(node.holding | node.acquiring | node.releasing), frozenset(node.holding)),
        )
        if t not in node.member.desired:
            self._reconcile(mid)

    def _stopped(self, mid: str, t: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive:
            return
        if node.frozen_until > self.clock.now():
            self._at(node.frozen_until, lambda: self._stopped(mid, t, session))
            return
        self._end_run(node, mid, t)
        if node.member.follows_assignment_alone and self.rng.random() < 0.8:
            # the worker's release multi carries the member's report (else, as when a status version is not
            # known, it releases first and reports after): the owner znode goes and the request is rewritten
            # in one write; the task counts as held (``releasing``) until the answer reaches the member
            request = node.member.release_report(
                frozenset({t}), frozenset(node.holding | node.acquiring | node.releasing)
            )
            if request is not None:
                node.stopping.discard(t)
                node.holding.discard(t)
                node.releasing.add(t)
                if self.locks.get(t) == mid:
                    del self.locks[t]
                self.members_zk[mid] = request
                self.member_session[mid] = node.session
                self._members_changed()
                self._at(self.clock.now() + self._delay(), lambda: self._released(mid, t, request, session))
                return
        node.stopping.discard(t)
        node.holding.discard(t)
        if self.locks.get(t) == mid:
            del self.locks[t]
        self._member_do(
            mid,
            node.member.on_owned(frozenset(node.holding | node.acquiring | node.releasing), frozenset(node.holding)),
        )
        if t in node.member.desired:
            self._reconcile(mid)

    def _released(self, mid: str, t: str, request: JoinRequest, session: int) -> None:
        """The answer to a release that carried the member's report."""
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive:
            return
        if node.frozen_until > self.clock.now():
            self._at(node.frozen_until, lambda: self._released(mid, t, request, session))
            return
        node.releasing.discard(t)
        self._member_do(
            mid,
            node.member.on_released(
                frozenset(node.holding | node.acquiring | node.releasing), request, frozenset(node.holding)
            ),
        )
        if t in node.member.desired:
            self._reconcile(mid)

    def _end_run(self, node: _Node, mid: str, t: str) -> None:
        start = node.running.pop(t, None)
        if start is not None:
            self.intervals.append((t, mid, start, self.clock.now()))

    # ---- faults -----------------------------------------------------------------------------------
    def _session_gone(self, mid: str) -> None:
        """Ephemeral znodes of the member's session disappear: membership and owner locks."""
        self.members_zk.pop(mid, None)
        for t in [t for t, h in self.locks.items() if h == mid]:
            del self.locks[t]
        self._members_changed()

    def _crash(self, mid: str, clean: bool = False) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive:
            return
        for t in list(node.running):
            self._end_run(node, mid, t)
        node.alive = False
        node.holding.clear()
        node.releasing.clear()
        self._session_gone(mid)

    def _freeze(self, mid: str, duration: float) -> None:
        node = self.nodes[mid]
        if not node.alive:
            return
        node.frozen_until = self.clock.now() + duration
        if duration >= self.cfg.session_timeout:
            # the session expires while frozen; a frozen process runs nothing, so its intervals end now
            for t in list(node.running):
                self._end_run(node, mid, t)
            self._at(self.clock.now() + self.cfg.session_timeout, lambda: self._expire_frozen(mid, node.session))

    def _expire_frozen(self, mid: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive:
            return
        for t in list(node.running):
            self._end_run(node, mid, t)
        node.alive = False
        node.holding.clear()
        node.releasing.clear()
        self._session_gone(mid)
        self._at(node.frozen_until, lambda: self._respawn(mid, node))  # it wakes up, sees LOST, starts over

    def _partition(self, mid: str, duration: float) -> None:
        """Cut off from ZooKeeper: the worker fences (stops its tasks) after fence_after < session timeout."""
        node = self.nodes[mid]
        if not node.alive:
            return
        node.partitioned_until = self.clock.now() + duration
        session = node.session

        def fence() -> None:
            n = self.nodes.get(mid)
            if n is None or n.session != session or not n.alive or n.partitioned_until <= self.clock.now():
                return
            for t in list(n.running):
                self._end_run(n, mid, t)

        self._at(self.clock.now() + self.cfg.fence_after, fence)
        if duration >= self.cfg.session_timeout:

            def expire() -> None:
                n = self.nodes.get(mid)
                if n is None or n.session != session or not n.alive:
                    return
                for t in list(n.running):  # fenced already; make sure
                    self._end_run(n, mid, t)
                n.alive = False
                n.holding.clear()
                n.releasing.clear()
                self._session_gone(mid)
                self._at(n.partitioned_until, lambda: self._respawn(mid, n))

            self._at(self.clock.now() + self.cfg.session_timeout, expire)
        else:

            def heal() -> None:
                n = self.nodes.get(mid)
                if n is None or n.session != session or not n.alive:
                    return
                if n.frozen_until > self.clock.now():
                    self._at(n.frozen_until, heal)
                    return
                # reconnected inside the session: tasks it fenced start again (it still holds their locks)
                for t in sorted(n.holding):
                    if t not in n.running and t not in n.stopping:
                        n.running[t] = self.clock.now()

            self._at(node.partitioned_until + 0.0005, heal)

    def _failover(self) -> None:
        self.epoch += 1
        self.coordinator.shutdown()
        self.coordinator = self._new_coordinator()
        load_at = self.clock.now() + self._delay()
        epoch = self.epoch
        # the new controller loads, registers its watches, then processes: no event reaches it before load
        self.controller_inbox = max(self.controller_inbox, load_at)

        def load() -> None:
            if self.epoch != epoch:
                return
            self._controller(
                lambda: self.coordinator.load(
                    self.state_zk, self._live_members(), self._runnable(), dict(self.assignments_zk)
                )
            )

        self._at(load_at, load)

    def _task_churn(self) -> None:
        if self.rng.random() < 0.5 or len(self.tasks) < 2:
            tid = f"t{self.next_task}"
            self.next_task += 1
            self.tasks[tid] = TaskDescriptor(task_id=tid)
        else:
            victim = self.rng.choice(sorted(self.tasks))
            del self.tasks[victim]
        tasks = self._runnable()
        self._to_controller(lambda: self._controller(lambda: self.coordinator.on_tasks(tasks)))

    def _schedule_faults(self) -> None:
        kinds = [
            "crash",
            "restart",
            "freeze_short",
            "freeze_long",
            "partition_short",
            "partition_long",
            "failover",
            "tasks",
            "join",
        ]
        if self.cfg.hostile:
            kinds += ["ghost", "rewrite"]
        for _ in range(self.cfg.faults):
            when = self.rng.uniform(0.5, self.cfg.fault_window)
            kind = self.rng.choice(kinds)
            self.last_fault_at = max(self.last_fault_at, when)
            self._at(when, partial(self._fault, kind))

    def _fault(self, kind: str) -> None:
        alive = sorted(m for m, n in self.nodes.items() if n.alive)
        dead = sorted(m for m, n in self.nodes.items() if not n.alive)
        self.fault_log.append(f"{self.clock.now():.3f} {kind}")
        if kind == "crash" and alive:
            self._crash(self.rng.choice(alive))
        elif kind == "restart" and dead:
            self._spawn(self.rng.choice(dead))
        elif kind == "freeze_short" and alive:
            self._freeze(self.rng.choice(alive), self.cfg.session_timeout * 0.4)
        elif kind == "freeze_long" and alive:
            self._freeze(self.rng.choice(alive), self.cfg.session_timeout * 1.5)
        elif kind == "partition_short" and alive:
            self._partition(self.rng.choice(alive), self.cfg.session_timeout * 0.8)
        elif kind == "partition_long" and alive:
            self._partition(self.rng.choice(alive), self.cfg.session_timeout * 1.5)
        elif kind == "failover":
            self._failover()
        elif kind == "tasks":
            self._task_churn()
        elif kind == "join":
            self._spawn(f"m{len(self.nodes)}")
        elif kind == "ghost":
            self._ghost(alive)
        elif kind == "rewrite" and alive:
            # (a member letting tasks go, when there is one: what a false report would hand on too early)
            releasing = [m for m in alive if self.nodes[m].member.pending_revocation or self.nodes[m].stopping]
            self._rewrite(self.rng.choice(releasing or alive))

    def _ghost(self, alive: list[str]) -> None:
        """A member znode with no broker behind it (another session), claiming a live member's tasks with a huge
        member epoch; gone again when its session ends."""
        victim = self.rng.choice(alive) if alive else None
        claimed = tuple(sorted(self.nodes[victim].member.desired)) if victim else ()
        name = f"ghost{len(self.fault_log)}"
        self.members_zk[name] = JoinRequest(
            member_id=name,
            join_generation=2**40,
            generation=2**40,
            protocols=(RECONCILE, COOPERATIVE),
            assignors=(self.cfg.assignor,),
            owned=claimed,
            incarnation="ghost",
        )
        self.member_session[name] = 1_000_000 + len(self.fault_log)
        self._members_changed()
        session = self.member_session[name]

        def gone() -> None:
            if self.member_session.get(name) == session:
                self.members_zk.pop(name, None)
                self.member_session.pop(name, None)
                self._members_changed()

        self._at(self.clock.now() + self.rng.uniform(0.5, 3.0), gone)

    def _rewrite(self, mid: str) -> None:
        """Someone rewrites a live member's request: a member epoch never published, or claims of every task.
        The member does not know; the coordinator must answer it (INVALID_REPORT) or narrow the claims."""
        r = self.members_zk.get(mid)
        if r is None:
            return
        if self.rng.random() < 0.5:  # releases it never made, at an epoch never published
            bad = dataclasses.replace(r, generation=2**60, owned=(), pending=())
        else:
            bad = dataclasses.replace(r, owned=tuple(sorted(self.tasks)))
        self.members_zk[mid] = bad
        self._members_changed()

    # ---- run & check ------------------------------------------------------------------------------
    def run(self, max_events: int = 200_000) -> SimResult:
        self._schedule_faults()
        end = self.cfg.fault_window + self.cfg.settle_bound
        steps = 0
        converged_at = None
        next_check = self.cfg.fault_window + 0.5
        while self.queue and steps < max_events:
            when, _, fn = heapq.heappop(self.queue)
            if when > end:
                break
            self.clock.set(max(when, self.clock.now()))
            fn()
            steps += 1
            if self.clock.now() >= next_check and self.clock.now() > self.last_fault_at + 6 * self.cfg.max_delay:
                if self._converged():
                    converged_at = self.clock.now()
                    break
                next_check = self.clock.now() + 0.25
        if converged_at is None and not self.queue:
            # nothing left to happen: let pending freezes/partitions end, then check once more
            wake = max(
                [n.frozen_until for n in self.nodes.values()]
                + [n.partitioned_until for n in self.nodes.values()]
                + [self.clock.now()]
            )
            self.clock.set(wake + 0.001)
            converged_at = self.clock.now() if self._converged() else None
        self._check_intervals()
        if converged_at is None:
            self.violations.append(
                Violation(
                    4,
                    self.clock.now(),
                    f"not converged within {self.cfg.settle_bound}s after faults "
                    f"(state {self.coordinator.state.value}, gen {self.coordinator.generation})",
                )
            )
        return SimResult(self.seed, self.violations, self.fault_log, self.coordinator.rebalances, steps, converged_at)

    def _converged(self) -> bool:
        live = {
            m
            for m, n in self.nodes.items()
            if n.alive and n.frozen_until <= self.clock.now() and n.partitioned_until <= self.clock.now()
        }
        if not live:
            return not self.tasks or True
        if self.coordinator.state is not GroupState.STABLE:
            return False
        running: dict[str, list[str]] = {}
        for m in live:
            for t in self.nodes[m].running:
                running.setdefault(t, []).append(m)
        return set(running) == set(self.tasks) and all(len(v) == 1 for v in running.values())

    def _check_intervals(self) -> None:
        """Invariant 1 from recorded intervals only (plus those still open at the end)."""
        closed = list(self.intervals)
        for mid, n in self.nodes.items():
            for t, start in n.running.items():
                closed.append((t, mid, start, self.clock.now()))
        by_task: dict[str, list[tuple[float, float, str]]] = {}
        for t, mid, s, e in closed:
            by_task.setdefault(t, []).append((s, e, mid))
        for t, runs in by_task.items():
            runs.sort()
            for (s1, e1, m1), (s2, e2, m2) in zip(runs, runs[1:]):
                if s2 < e1 - 1e-9:
                    self.violations.append(
                        Violation(1, s2, f"{t} ran on {m1} [{s1:.3f},{e1:.3f}] and {m2} [{s2:.3f},{e2:.3f}]")
                    )
