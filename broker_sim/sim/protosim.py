"""Deterministic simulation of the protocol core: the real sans-IO GroupCoordinator and Members, a
simulated ZooKeeper (ephemeral nodes, owner locks, watches delivered per client in order with seeded
delays), seeded faults (``protosim_faults``), and invariant checks (``protosim_checks``). One seed = one
reproducible schedule.

``ProtocolSim`` is the world: the queue of timed steps, the controller's side (decisions applied to the
simulated ZooKeeper, watches delivered to it in order) and each member's (its actions, its owner locks, its
runs starting and stopping). Invariant 3 (generations and epochs only grow) is checked here, as members act.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from broker_sim.sim import protosim_checks as checks
from broker_sim.sim.injection import Injection
from broker_sim.sim.protosim_faults import FaultInjector
from broker_sim.sim.protosim_types import GROUP, SimConfig, SimNode, SimResult, Violation
from broker_sim.worker.phases import IllegalTaskTransition, TaskPhase, stop_begun, stop_ended, transition
from controller.protocol.clock import FakeClock
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.member import Exit, Member, ReadJoinResult, SetDesired, WriteJoin, WriteProposal
from controller.protocol.group.reports import ghost_reason
from controller.protocol.group.rules import run_assignor
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import (
    Decision,
    DeleteGenerationsBelow,
    GroupConfig,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.records.group_messages import (
    Assignment,
    GroupStateInfo,
    JoinRequest,
    JoinResult,
    SyncProposal,
    TaskDescriptor,
)


class ProtocolSim:
    """One seeded run: the world, its faults (a ``FaultInjector`` part) and its invariants."""

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
        self.nodes: dict[str, SimNode] = {}
        for i in range(config.members):
            self.spawn(f"m{i}")
        self.faults = FaultInjector(self)

    # ---- scheduling -------------------------------------------------------------------------------
    def at(self, when: float, fn: Callable[[], None]) -> None:
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

        self.at(self.controller_inbox, deliver)

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
                    self.at(max(n.frozen_until, n.partitioned_until) + 0.001, lambda: self._drain(mid, n))
                return
            fn()

        self.at(node.inbox_time, deliver)

    def _drain(self, mid: str, n: SimNode) -> None:
        if self.nodes.get(mid) is not n or not n.alive:
            return
        if n.frozen_until > self.clock.now() or n.partitioned_until > self.clock.now():
            self.at(max(n.frozen_until, n.partitioned_until) + 0.001, lambda: self._drain(mid, n))
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

    def check_stable(self) -> None:
        """Invariant 5 against the group state as it stands (also between writes of it: a state written Stable
        stays so while a member's tasks stop and start again under it)."""
        if self.state_zk is not None:
            self.violations += checks.stable_means_running(
                self.state_zk, self.coordinator, self.nodes, self.tasks, self.locks, self.clock.now(), self.members_zk
            )

    def _apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            if isinstance(d, WriteGroupState):
                self.state_zk = d.info
                self.check_stable()
                for mid, node in list(self.nodes.items()):
                    if node.state_watched:
                        self._to_member(mid, partial(self._group_state_to, mid, d.info))
            elif isinstance(d, WriteJoinResult):
                self.joins_zk[d.result.generation] = d.result
            elif isinstance(d, WriteAssignments):
                self.violations += checks.publish_is_safe(
                    d, self.coordinator.generation_members, self.nodes, self.locks, self.clock.now()
                )
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

            self.at(max(deadline, self.clock.now()) + 0.0001, tick)

    def _runnable(self) -> dict[str, TaskDescriptor]:
        return dict(self.tasks)

    def members_changed(self) -> None:
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

    # ---- members ----------------------------------------------------------------------------------
    def spawn(self, mid: str) -> None:
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
        node = SimNode(member=member, session=session)
        self.nodes[mid] = node
        self._member_do(mid, member.start(self.state_zk))

    def respawn(self, mid: str, dead: SimNode) -> None:
        """The process behind a lost session starts over, unless it was restarted meanwhile."""
        if self.nodes.get(mid) is dead:
            self.spawn(mid)

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
                self.members_changed()
            elif isinstance(act, ReadJoinResult):
                gen = act.generation
                self._to_member(mid, partial(self._join_result_to, mid, gen))
            elif isinstance(act, WriteProposal):
                p = self.faults.leader_proposal(act.proposal, self.joins_zk)
                self.proposals_zk[p.generation] = p
                if self.coordinator.state is GroupState.AWAITING_SYNC and self.coordinator.generation == p.generation:
                    self._to_controller(partial(self._proposal_arrives, p))
            elif isinstance(act, SetDesired):
                self._reconcile(mid)
                if m.reconcile_mode:  # the worker reports what it holds once its stops and starts are under way
                    session = node.session
                    self.at(self.clock.now() + 0.0001, partial(self.report_owned, mid, session))
            elif isinstance(act, Exit):
                self.crash(mid, clean=True)
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

    def _reread_group_state(self, mid: str, node: SimNode) -> None:
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
            if node.phases.get(t, TaskPhase.STOPPED).runs:
                self.move(node, mid, t, stop_begun(node.phases[t], fence=False))
            session = node.session
            self.at(self.clock.now() + self.cfg.stop_latency, partial(self._stopped, mid, t, session))
        for t in sorted(desired - node.holding - node.acquiring - node.releasing):
            node.acquiring.add(t)
            self._acquire(mid, t, node.session)

    def move(self, node: SimNode, mid: str, t: str, to: TaskPhase) -> None:
        """Move a task's phase on a member through the worker's table; a move it refuses is a violation (6)."""
        current = node.phases.get(t, TaskPhase.STOPPED)
        if to is current and to in (TaskPhase.STOPPING, TaskPhase.FENCE_STOPPING, TaskPhase.FINISHED):
            return  # (a second stop joins the first)
        try:
            node.phases[t] = transition(f"{t} on {mid}", current, to)
        except IllegalTaskTransition as exc:
            self.violations.append(Violation(6, self.clock.now(), str(exc)))

    def report_owned(self, mid: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive or node.session != session:
            return
        self._member_do(
            mid,
            node.member.on_owned(*self.owned_view(node)),
        )

    def _acquire(self, mid: str, t: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive or node.session != session:
            return
        if t not in node.member.desired or node.partitioned_until > self.clock.now() or t not in self.tasks:
            node.acquiring.discard(t)  # given up: no longer "may hold any moment"
            self.report_owned(mid, session)
            return
        if t in self.locks:
            self.at(self.clock.now() + 0.02, lambda: self._acquire(mid, t, session))  # watch on the owner znode
            return
        self.locks[t] = mid
        node.acquiring.discard(t)
        node.holding.add(t)
        node.holds[t] = hold = node.holds.get(t, 0) + 1
        self.move(node, mid, t, TaskPhase.STARTING)
        self.at(self.clock.now() + self.cfg.start_latency, lambda: self.started(mid, t, session, hold))

    def started(self, mid: str, t: str, session: int, hold: int) -> None:
        """A start (begun for the ``hold``-th hold of ``t`` here) returns."""
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive or t not in node.holding:
            return
        if node.holds.get(t) != hold:
            return  # begun before a release: its hold is over (the worker's slot was busy with it meanwhile)
        if node.frozen_until > self.clock.now():
            self.at(node.frozen_until, lambda: self.started(mid, t, session, hold))
            return
        node.running[t] = self.clock.now()
        self.move(node, mid, t, TaskPhase.RUNNING)
        self._member_do(
            mid,
            node.member.on_owned(*self.owned_view(node)),
        )
        if t not in node.member.desired:
            self._reconcile(mid)

    def _stopped(self, mid: str, t: str, session: int) -> None:
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive:
            return
        if node.frozen_until > self.clock.now():
            self.at(node.frozen_until, lambda: self._stopped(mid, t, session))
            return
        self.end_run(node, mid, t)
        self.move(node, mid, t, TaskPhase.STOPPED)  # (its release's last status)
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
                self.members_changed()
                self.at(self.clock.now() + self._delay(), lambda: self._released(mid, t, request, session))
                return
        node.stopping.discard(t)
        node.holding.discard(t)
        if self.locks.get(t) == mid:
            del self.locks[t]
        self._member_do(
            mid,
            node.member.on_owned(*self.owned_view(node)),
        )
        if t in node.member.desired:
            self._reconcile(mid)

    def _released(self, mid: str, t: str, request: JoinRequest, session: int) -> None:
        """The answer to a release that carried the member's report."""
        node = self.nodes.get(mid)
        if node is None or node.session != session or not node.alive:
            return
        if node.frozen_until > self.clock.now():
            self.at(node.frozen_until, lambda: self._released(mid, t, request, session))
            return
        node.releasing.discard(t)
        self._member_do(
            mid,
            node.member.on_released(*self._released_view(node, request)),
        )
        if t in node.member.desired:
            self._reconcile(mid)

    @staticmethod
    def owned_view(node: SimNode) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
        """What the worker tells its member: what it holds or may hold any moment, whose owner lock it holds,
        and of those whose start is not over (held, not running, or being stopped: the group is not Stable on
        them; a task given back while its stop is under way stops, is let go and is taken again)."""
        holding = frozenset(node.holding)
        settled = node.running.keys() - node.stopping
        return frozenset(node.holding | node.acquiring | node.releasing), holding, holding - settled

    def _released_view(
        self, node: SimNode, request: JoinRequest
    ) -> tuple[frozenset[str], JoinRequest, frozenset[str], frozenset[str]]:
        owned, holding, starting = self.owned_view(node)
        return owned, request, holding, starting

    def end_run(self, node: SimNode, mid: str, t: str, fence: bool = False) -> None:
        """A run of ``t`` ends (stopped, fenced, killed): its interval is recorded, its phase moves."""
        phase = node.phases.get(t, TaskPhase.STOPPED)
        if phase.runs:
            self.move(node, mid, t, stop_begun(phase, fence))
            self.move(node, mid, t, stop_ended(node.phases[t]))
        start = node.running.pop(t, None)
        if start is not None:
            self.intervals.append((t, mid, start, self.clock.now()))

    def session_gone(self, mid: str) -> None:
        """Ephemeral znodes of the member's session disappear: membership and owner locks."""
        self.members_zk.pop(mid, None)
        for t in [t for t, h in self.locks.items() if h == mid]:
            del self.locks[t]
        self.members_changed()

    def lose_session(self, mid: str, node: SimNode) -> None:
        """The member's process stops running anything and its session ends (a crash, an expiry)."""
        for t in list(node.running):
            self.end_run(node, mid, t)
        node.alive = False
        for t, phase in node.phases.items():
            if not phase.runs:
                self.move(node, mid, t, TaskPhase.STOPPED)
        node.holding.clear()
        node.releasing.clear()
        self.session_gone(mid)

    def crash(self, mid: str, clean: bool = False) -> None:
        node = self.nodes.get(mid)
        if node is None or not node.alive:
            return
        self.lose_session(mid, node)

    def failover(self) -> None:
        self.epoch += 1
        self.coordinator.machine.end()
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

        self.at(load_at, load)

    def add_task(self) -> None:
        tid = f"t{self.next_task}"
        self.next_task += 1
        self.tasks[tid] = TaskDescriptor(task_id=tid)
        self._tasks_changed()

    def remove_task(self, tid: str) -> None:
        del self.tasks[tid]
        self._tasks_changed()

    def pin(self, placement: Mapping[str, str], whole_step: bool) -> None:
        """A planned move reaches the controller: a reassign (one pin more), or a roll's step (every task
        pinned: those named to their member, the rest where the controller placed them)."""

        def step() -> list[Decision]:
            c = self.coordinator
            if not whole_step:
                (t, to), *_ = placement.items()
                return c.on_reassign(t, to)
            where = {t: m for m, ts in c.assignment.items() for t in ts}
            return c.on_roll_placement({**where, **placement}, "roll step (simulated)")

        self._to_controller(lambda: self._controller(step))

    def _tasks_changed(self) -> None:
        tasks = self._runnable()
        self._to_controller(lambda: self._controller(lambda: self.coordinator.on_tasks(tasks)))

    # ---- run & check ------------------------------------------------------------------------------
    def run(self, max_events: int = 200_000) -> SimResult:
        self.faults.schedule()
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
            if self.clock.now() >= next_check and self.clock.now() > self.faults.last_fault_at + 6 * self.cfg.max_delay:
                if checks.converged(self.coordinator, self.nodes, self.tasks, self.clock.now()):
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
            converged_at = (
                self.clock.now()
                if checks.converged(self.coordinator, self.nodes, self.tasks, self.clock.now())
                else None
            )
        self.violations += checks.no_overlaps(self.intervals, self.nodes, self.clock.now())
        if converged_at is None:
            self.violations.append(
                Violation(
                    4,
                    self.clock.now(),
                    f"not converged within {self.cfg.settle_bound}s after faults "
                    f"(state {self.coordinator.state.value}, gen {self.coordinator.generation})",
                )
            )
        injection = Injection(len(self.fault_log), tuple(self.faults.not_injected))
        return SimResult(
            self.seed, self.violations, self.fault_log, self.coordinator.rebalances, steps, converged_at, injection
        )
