"""The ``reconcile`` protocol, sans-IO: the coordinator computes every member's target itself, and each
member reconciles towards its own target alone (the shape of KIP-848, Kafka 4.0's consumer group protocol).

No join barrier, no sync phase, no leader member. Whenever members, tasks, weights or operator requests
change, the coordinator runs the group's assignor (sticky by default) over the live members and gets a
*target*. It then publishes, per member, the part of that target it may have now: a task is handed to its
new owner only once its previous owner has released it (revocation before assignment, as KIP-848 does, on
top of the owner-znode fence). A member whose published assignment changes gets it with a new *member
epoch*; members whose assignment does not change are not written to, so one broker joining or leaving
touches only the brokers that gain or lose tasks.

Who may still run a task (``holders``) is the union of three pieces of evidence, per member: what the
coordinator last published to it, what it revoked from it and has not yet seen released, and what the
member itself last reported as owned (its request znode). A member reports (rewrites its request) only
after it has let go of revoked tasks, naming the member epoch it reconciled to; a report at or above the
epoch of a revocation that no longer lists the task confirms the release.

The group is Stable when every member's published assignment is its target and nothing revoked is still
unconfirmed; otherwise Reconciling. A member that does not support ``reconcile`` joining a reconciling
group sends the group back through one cooperative rebalance (and a group whose members all prefer
``reconcile`` enters it at the end of a join round): the rolling upgrade path, both ways.

What the members owe of each assignment published (an acknowledgement, the tasks taken, in time) is kept by
the part ``acks.py``; the tasks held for a member that left, by the coordinator's ``holds.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.errors import ProtocolError
from controller.protocol.group.acks import Acks
from controller.protocol.group.assignors import get_assignor
from controller.protocol.group.reports import report_problem
from controller.protocol.group.rules import (
    RECONCILE,
    all_prefer_reconcile,
    cooperative_adjust,
    identity,
    newly_leaving,
    rewritten,
)
from controller.protocol.group.state import GroupState
from controller.protocol.group.vocabulary import Decision, GroupCore, MembersTaken, WriteAssignments
from controller.protocol.records.group_messages import Assignment, JoinRequest, MemberMetadata

log = logging.getLogger(__name__)


def holders(
    published: Mapping[str, tuple[str, ...]],
    unreleased: Mapping[str, Mapping[str, int]],
    requests: Mapping[str, JoinRequest],
) -> dict[str, set[str]]:
    """Member -> every task it may still run: published to it, revoked from it but not confirmed released,
    or reported by it as owned, unless the coordinator placed that task with another member: a report narrows
    what a member holds, it never takes a task from another live owner (``reports.narrow_owned``; the owner
    znodes fence a task that really runs elsewhere). A member that is gone holds nothing (its session, and
    with it every owner znode it held, ended)."""
    out: dict[str, set[str]] = {}
    claims: dict[str, tuple[str, ...]] = {}
    for m, r in requests.items():
        mine, pending = published.get(m, ()), unreleased.get(m)
        if not pending and r.owned == mine:  # (most members, most steps: one set, not three and two unions)
            out[m] = set(mine)
        else:
            out[m] = set(mine) | set(pending or ())
            if r.owned:
                claims[m] = r.owned
    if claims:
        placed = {t: m for m, ts in out.items() for t in ts}
        for m, owned in claims.items():
            out[m].update(t for t in owned if placed.get(t, m) == m or t in out[m])
    return out


def confirm_releases(pending: Mapping[str, int], report: JoinRequest) -> dict[str, int]:
    """What stays unconfirmed after a member's report: a revocation of epoch ``e`` is confirmed by a report
    of member epoch >= ``e`` that no longer lists the task (an older report may predate the revocation)."""
    return {t: e for t, e in pending.items() if report.generation < e or t in report.owned}


def step(
    target: Mapping[str, tuple[str, ...]],
    held_by: Mapping[str, set[str]],
) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """One reconciliation step: per member, the part of its target nobody else holds (assigned now), and
    per member what it holds that its target no longer names (to revoke). The cooperative adjustment is
    exactly this rule, applied to the members' holdings instead of a join round's ``owned`` lists."""
    return cooperative_adjust(target, held_by)


@dataclass(frozen=True)
class Reconciled:
    """What one call of the reconcile part means for the coordinator's record, for it to take: the decisions
    so far (refusals, the assignments published), the new member epoch (None: none taken), the placement
    published, the reason shown, the rebalances counted, the states moved through, whether the group state
    is written, and the moves to watch (both after the coordinator took the rest)."""

    decisions: tuple[Decision, ...]
    generation: int | None
    assignment: Mapping[str, tuple[str, ...]]
    reason: str
    rebalances: int = 0
    states: tuple[GroupState, ...] = ()
    show_state: bool = False
    watch: tuple[str, ...] = ()
    #: (a re-target) the generation members: every live member
    generation_members: tuple[str, ...] | None = None


@dataclass
class Draft:
    """The coordinator's record as one call of the reconcile part changes it: the part's working copy, which
    the coordinator takes (``Reconciled``) once the call returns."""

    generation: int
    assignment: dict[str, tuple[str, ...]]
    reason: str
    #: the state the group is in once the coordinator took the draft (each move checked by its state machine then)
    state_after: GroupState
    generation_taken: bool = False
    rebalances: int = 0
    states: list[GroupState] = field(default_factory=list)
    show_state: bool = False
    watch: tuple[str, ...] = ()
    generation_members: tuple[str, ...] | None = None

    def next_epoch(self) -> int:
        """A new member epoch, from the group's one counter (epochs only grow)."""
        self.generation += 1
        self.generation_taken = True
        return self.generation

    def transition(self, state: GroupState) -> None:
        self.states.append(state)
        self.state_after = state

    def result(self, decisions: list[Decision]) -> Reconciled:
        return Reconciled(
            tuple(decisions),
            self.generation if self.generation_taken else None,
            self.assignment,
            self.reason,
            self.rebalances,
            tuple(self.states),
            self.show_state,
            self.watch,
            self.generation_members,
        )


class ReconcileCore(GroupCore, Protocol):
    """What the reconcile part needs of its group beyond ``GroupCore``: the generation record it keeps (member
    epochs come from ``generation``) and the members it places."""

    @property
    def join_generation(self) -> int: ...
    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def shutting_down(self) -> Collection[str]: ...


@dataclass(eq=False)
class ReconcileGroup:
    """The reconcile protocol of one group (Kafka's ``ConsumerGroup`` beside the join round's ``ClassicGroup``):
    its targets, the revocations not yet confirmed, and when the next target is due; what the members owe of
    what it publishes (acknowledgements, tasks taken, the fences of the late) is its part ``acks``."""

    core: ReconcileCore = field(repr=False)
    #: member -> the tasks the assignor gives it
    target: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: member -> task -> the member epoch of a revocation not yet confirmed released
    unreleased: dict[str, dict[str, int]] = field(default_factory=dict)
    last_retarget: float = float("-inf")
    #: a new target put off by ``retarget_interval_s`` (when, and why)
    retarget_due: float | None = None
    retarget_reason: str = ""
    #: while a new group forms (nothing runs yet), the latest its first target may wait until
    forming_until: float | None = None
    #: member -> (why, the request refused): answered with INVALID_REPORT once per request
    refused: dict[str, tuple[str, JoinRequest]] = field(default_factory=dict)
    #: the members last shown as starting: the group state is written again when that changes
    shown_starting: tuple[str, ...] = ()
    #: member -> the tasks its last published assignment announced as incoming (a planned roll's next moves)
    announced: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # ---- the part it owns ----
    acks: Acks = field(init=False)

    def __post_init__(self) -> None:
        self.acks = Acks(self.core)

    def draft(self) -> Draft:
        """A working copy of the coordinator's record for one call."""
        core = self.core
        return Draft(core.generation, dict(core.assignment), core.reason, core.state)

    # ---- acknowledgements (kept by the acks part) -----------------------------------------------------
    def ack_due(self) -> float | None:
        """When the oldest task published and not yet taken, or the oldest report owed (an acknowledgement, a
        release), overruns the rebalance timeout (None: nothing is owed)."""
        return self.acks.due(self.unreleased)

    def fence_overdue(self, now: float) -> Reconciled:
        """Tasks published and not taken within the rebalance timeout: their member is fenced from them and
        the group is re-targeted; a member that owes a report that long is published its assignment again. The
        revocation needs no confirmation: the member never reported them, and should it hold an owner znode
        after all, that znode keeps the next member waiting until it lets go."""
        d = self.draft()
        fenced, asked = self.acks.overdue(now, self.unreleased)
        if not fenced:
            return d.result(self._step(d, write_state=False) if asked else [])
        why = "; ".join(
            f"{m} fenced from {len(ts)} task(s) ({', '.join(ts[:5])}{', ...' if len(ts) > 5 else ''})"
            for m, ts in sorted(fenced.items())
        )
        reason = f"{why}: not taken within the rebalance timeout ({self.core.config.rebalance_timeout_s:g}s)"
        log.warning("group %s: %s", self.core.group, reason)
        return d.result(self._retarget(d, reason))

    def refuse(self, member: str, reason: str, incarnation: str | None) -> Reconciled:
        """A member's request or report is out of bounds: answer it in its own assignment (INVALID_REPORT, at
        a new member epoch, so the member reads it), and it rewrites its request. What it was published
        stands meanwhile: its tasks are neither dropped nor handed on."""
        d = self.draft()
        return d.result(self._refuse(d, member, reason, incarnation))

    def _refuse(self, d: Draft, member: str, reason: str, incarnation: str | None) -> list[Decision]:
        core = self.core
        log.warning("group %s: refused the request of %s (%s): it rewrites it", core.group, member, reason)
        answer = Assignment(
            generation=d.next_epoch(),
            controller_epoch=core.controller_epoch,
            error=ProtocolError.INVALID_REPORT.name,
            protocol=RECONCILE,
            incarnation=incarnation,
        )
        return [WriteAssignments(((member, answer),))]

    def screen(self, snapshot: Mapping[str, JoinRequest]) -> tuple[dict[str, JoinRequest], Reconciled]:
        """The members' requests as the coordinator takes them: a report out of bounds (``report_problem``) is
        refused, once per request, and the member's last good request stands in for it (a new member with
        none is not admitted until it writes one)."""
        d = self.draft()
        out, answers = self._screen(d, snapshot)
        return out, d.result(answers)

    def _screen(
        self, d: Draft, snapshot: Mapping[str, JoinRequest], everyone: bool = False
    ) -> tuple[dict[str, JoinRequest], list[Decision]]:
        core = self.core
        out: dict[str, JoinRequest] = dict(snapshot)
        answers: list[Decision] = []
        for m in sorted(snapshot):
            r = snapshot[m]
            if not everyone and m not in self.refused and core.members.get(m) == r:
                continue  # screened already
            problem = report_problem(r, d.generation)
            last = core.members.get(m)
            if not problem and last is not None and last.acknowledges and not r.acknowledges:
                if last.incarnation == r.incarnation:  # a life does not change its release: a rewrite would
                    problem = "stopped acknowledging within one life"  # have its assignments trusted unchecked
            if not problem:
                if m in self.refused:
                    del self.refused[m]
                    self.acks.republish.add(m)
                continue
            if m in core.members and core.members[m] != r:
                out[m] = core.members[m]
            elif m in d.assignment:  # (a failover: no good request of it seen, but it was given tasks)
                out[m] = self.stand_in(d, m, r)
            else:
                del out[m]
            before = self.refused.get(m)
            if before is None or before[1] != r:
                incarnation = r.incarnation if m not in core.members else core.members[m].incarnation
                answers += self._refuse(d, m, problem, incarnation)
            self.refused[m] = (problem, r)
        return out, answers

    # ---- mode -------------------------------------------------------------------------------------
    def active(self) -> bool:
        """Whether the group runs the reconcile protocol now (Reconciling or Stable under it)."""
        return self.core.protocol == RECONCILE and self.core.state in (GroupState.RECONCILING, GroupState.STABLE)

    def all_prefer(self, requests: Mapping[str, JoinRequest]) -> bool:
        """Every member supports reconcile and the members' vote picks it."""
        return all_prefer_reconcile(requests, self.core.leader)

    # ---- entering and leaving ---------------------------------------------------------------------
    def enter(self, reason: str) -> Reconciled:
        """A join round ended with every member for reconcile (the coordinator took the protocol, the assignor
        and the members): from now on the coordinator places tasks itself. What the members listed as owned
        counts as held."""
        core, d = self.core, self.draft()
        if d.state_after is not GroupState.RECONCILING:
            d.transition(GroupState.RECONCILING)
        log.info("group %s: reconcile protocol (%s)", core.group, reason)
        nothing_runs = not any(d.assignment.values()) and not any(r.owned for r in core.members.values())
        if nothing_runs and core.config.initial_delay_s > 0:
            # a group forming: wait for the brokers starting with this one (every member learns the protocol now)
            now = core.clock.now()
            self.forming_until = now + core.config.rebalance_timeout_s
            self.retarget_due = min(now + core.config.initial_delay_s, self.forming_until)
            self.retarget_reason = reason
            self.target = {}
            d.reason = f"forming: waiting {core.config.initial_delay_s:g}s for more members ({reason})"
            return d.result(self._step(d, write_state=True, everyone=True))
        return d.result(self._retarget(d, reason, everyone=True))

    def reset(self) -> None:
        """The group emptied: no target, nothing to confirm, no epochs, nothing due."""
        self.abandon()
        self.acks.epochs.clear()

    def abandon(self) -> None:
        """The group leaves reconcile for a join round (or empties): its target and what it waited for are void
        (a deadline kept from them would come due forever in a group that no longer reconciles)."""
        self.target.clear()
        self.unreleased.clear()
        self.acks.abandon()
        self.announced.clear()
        self.refused.clear()
        self.shown_starting = ()
        self.retarget_due, self.retarget_reason, self.forming_until = None, "", None

    def leave_notices(self) -> tuple[tuple[str, Assignment], ...]:
        """Leaving reconcile for a join round: tell every member in its own assignment, the one znode a
        reconciling member reads (REBALANCE_IN_PROGRESS, at the round's generation, for this life of it).
        It keeps what it runs (a cooperative round) and joins; no task is given by a notice."""
        core = self.core
        return tuple(
            (
                m,
                Assignment(
                    generation=core.join_generation,
                    controller_epoch=core.controller_epoch,
                    error=ProtocolError.REBALANCE_IN_PROGRESS.name,
                    protocol=RECONCILE,
                    incarnation=r.incarnation,
                ),
            )
            for m, r in sorted(core.members.items())
        )

    def load(self, assignments: Mapping[str, Assignment]) -> tuple[dict[str, JoinRequest], Reconciled]:
        """Resume a reconciling group after a controller failover: the published assignments and their
        unconfirmed revocations come from ZooKeeper; the members' reports confirm what they can. The caller
        has restored the group's state (Reconciling), takes the members as screened here, then re-targets."""
        core, d = self.core, self.draft()
        d.assignment, self.unreleased = {}, {}
        newest = max([core.generation] + [a.generation for a in assignments.values()])
        for m, a in assignments.items():
            if m not in core.members or a.error is not None or a.protocol != RECONCILE:
                continue
            if a.incarnation != core.members[m].incarnation:
                continue  # published to an earlier life of the member: that session, and all it held, is gone
            d.assignment[m] = tuple(a.assigned)
            d.generation = max(d.generation, a.generation)
            revoked = {t: a.generation for t in a.revoked}
            # a report refused below confirms nothing
            pending = revoked if report_problem(core.members[m], newest) else confirm_releases(revoked, core.members[m])
            if pending:
                self.unreleased[m] = pending
            owned = set(core.members[m].owned).difference(core.members[m].pending)
            # not reported taken yet: the rebalance timeout runs from now
            waiting = [t for t in a.assigned if t not in owned] if core.members[m].acknowledges else []
            self.acks.resumed(m, a.generation, core.clock.now(), waiting)
        d.generation_taken = True
        # what the previous controller had not yet refused is screened now (a report rewritten meanwhile)
        members, answers = self._screen(d, core.members, everyone=True)
        for m in [m for m in d.assignment if m not in members]:
            del d.assignment[m]
            self.unreleased.pop(m, None)
            self.acks.epochs.pop(m, None)
        return members, d.result(answers)

    def stand_in(self, d: Draft, member: str, refused: JoinRequest) -> JoinRequest:
        """What the coordinator takes for a member whose only request it refused: it may hold what it was
        published and what was revoked from it unconfirmed, and it acknowledged nothing."""
        return JoinRequest(
            member_id=member,
            join_generation=-1,
            generation=-1,
            protocols=(RECONCILE,),
            assignors=(),
            owned=tuple(sorted(set(d.assignment.get(member, ())) | set(self.unreleased.get(member, {})))),
            incarnation=refused.incarnation,
            acknowledges=True,  # (owed, not trusted: nothing it says was read)
        )

    # ---- inputs -----------------------------------------------------------------------------------
    @staticmethod
    def restarted(old: Mapping[str, JoinRequest], new: Mapping[str, JoinRequest]) -> str | None:
        """A member present before and after under a new incarnation (a restart, seen as one change): the
        coordinator takes it as a departure, then a join."""
        return next((m for m in sorted(old.keys() & new.keys()) if old[m].incarnation != new[m].incarnation), None)

    def take_members(self, old: Mapping[str, JoinRequest]) -> MembersTaken:
        """The members as screened (the coordinator's now; ``old``: before): who joined, who left, what each
        report confirms, and whether that needs a new target (the coordinator takes it, then asks for one or
        for a step)."""
        core, ops = self.core, self.core.operations
        new = core.members
        need = ""
        quiet_exit = False  # a member that was to run nothing and ran nothing left: no one's target changes
        for m in sorted(new.keys() - old.keys()):
            if not new[m].acknowledges:
                log.warning(
                    "group %s: member %s does not acknowledge (a broker of an earlier release): what it is "
                    "published counts as taken, unchecked; upgrade it",
                    core.group,
                    m,
                )
        for m in sorted(old.keys() - new.keys()):
            tasks = core.assignment.get(m, ())
            self.unreleased.pop(m, None)  # (its session ended, and with it every owner znode it held)
            self.acks.forget(m)
            self.announced.pop(m, None)
            self.refused.pop(m, None)
            targeted = self.target.pop(m, ())
            ops.drop_moves(dest=m)
            core.holds.on_leave(m, identity(m, old[m]), tasks, old[m].leaving)
            if not tasks and not targeted:
                # the end of a controlled shutdown (its tasks already re-targeted away): a new target would be
                # the one there is, and asking for one while tasks still move would hold the group Reconciling
                # until the retarget interval is over, for nothing
                quiet_exit = True
                continue
            need = need or f"member {m} left"
        for m in sorted(new.keys() - old.keys()):
            if ops.maintenance:
                ops.postpone(f"member {m} joined")
                continue
            need = need or f"member {m} joined"
        shutdowns: list[str] = []
        for m, before, after in rewritten(old, new):
            if newly_leaving(core.shutting_down, m, before, after):
                shutdowns.append(m)
                need = need or f"controlled shutdown of {m}"
            if after.protocols != before.protocols or after.capacity != before.capacity or after.rack != before.rack:
                need = need or f"member {m} changed"
            if m in self.unreleased:
                self.unreleased[m] = confirm_releases(self.unreleased[m], after)
                if not self.unreleased[m]:
                    del self.unreleased[m]
            self.acks.taken(m, after)
        return MembersTaken(tuple(sorted(old.keys() - new.keys())), tuple(shutdowns), need, quiet=quiet_exit)

    def retarget_soon(self, reason: str) -> Reconciled:
        """A new target now, or, while the group is still reconciling towards one computed less than
        ``retarget_interval_s`` ago, at that interval's end (a step now for what changed meanwhile)."""
        core, d = self.core, self.draft()
        now = core.clock.now()
        if self.forming_until is not None:
            if self.retarget_due is not None and now < self.retarget_due:
                # still forming: another member (or change) moves the first target back, within the bound
                self.retarget_due = min(now + core.config.initial_delay_s, self.forming_until)
                self.retarget_reason = self.retarget_reason or reason
                return d.result(self._step(d, write_state=False))
            return d.result(self._retarget(d, self.retarget_reason or reason))
        due = self.last_retarget + core.config.retarget_interval_s
        if d.state_after is GroupState.RECONCILING and now < due:
            self.retarget_due = due
            self.retarget_reason = self.retarget_reason or reason
            return d.result(self._step(d, write_state=False))
        return d.result(self._retarget(d, self.retarget_reason or reason))

    def retarget(self, reason: str) -> Reconciled:
        """A new target now (a member kept from work, a failover)."""
        d = self.draft()
        return d.result(self._retarget(d, reason))

    def _retarget(self, d: Draft, reason: str, everyone: bool = False) -> list[Decision]:
        """Compute every member's target with the group's assignor, then take a step towards it."""
        core = self.core
        self.last_retarget = core.clock.now()
        self.retarget_due, self.retarget_reason, self.forming_until = None, "", None
        d.reason = reason
        d.rebalances += 1
        d.generation_members = tuple(sorted(core.members))
        # sticky to where tasks are heading (the current target), not to where they still run: a target
        # computed from a half-reached one would move again what is already on its way (KIP-848 likewise
        # gives its assignors the current target assignment)
        previous = {
            m: self.target[m] if m in self.target else d.assignment[m]
            for m in core.members
            if m in self.target or m in d.assignment
        }
        for m, r in sorted(core.members.items()):
            key = identity(m, r)
            if key in core.holds.held and not r.leaving:  # a static member back within the delay: its tasks again
                previous[m] = tuple(sorted(set(previous.get(m, ())) | set(core.holds.take(key))))
                log.info("group %s: %s returned as %s within the delay", core.group, key, m)
        members = [
            MemberMetadata(
                member_id=m,
                owned=previous.get(m, ()),
                capacity=r.capacity,
                rack=r.rack,
                instance_id=r.instance_id,
                leaving=r.leaving or m in core.shutting_down,
            )
            for m, r in sorted(core.members.items())
        ]
        descriptors = core.operations.descriptors(core.members, skip=core.holds.tasks())
        try:
            target = get_assignor(core.assignor or core.config.default_assignor).assign(members, descriptors, previous)
        except (KeyError, ValueError) as exc:
            log.warning("group %s: cannot compute a target (%s); keeping the last one", core.group, exc)
            target = dict(self.target)
        self.target = self.acks.apply_bars({m: tuple(sorted(target.get(m, ()))) for m in core.members})
        return self._step(d, write_state=True, everyone=everyone)

    def step(self, write_state: bool) -> Reconciled:
        """A step towards the target (``write_state``: the group state written even if nothing changed)."""
        d = self.draft()
        return d.result(self._step(d, write_state))

    def _step(self, d: Draft, write_state: bool, everyone: bool = False) -> list[Decision]:
        """Publish to each member what it may have now; write only the members whose assignment changes
        (``everyone``: all of them, when the group has just entered the protocol). The group state is shown
        (``d.show_state``) and new moves watched once the coordinator took the draft."""
        core, ops = self.core, self.core.operations
        held_by = holders(d.assignment, self.unreleased, core.members)
        self.acks.let_go(held_by)  # (fenced from a task it never took: it holds it no more)
        assigned, revoked = step(self.target, held_by)  # (the pure step above, then the throttle's share of it)
        moving_before = dict(ops.moving)
        wave = ops.wave(
            assigned,
            revoked,
            had=lambda: held_by,
            leaving=lambda: [m for m, r in core.members.items() if r.leaving or m in core.shutting_down],
        )
        changed = self.changes(d, wave.assigned, wave.revoked, everyone)
        decisions: list[Decision] = []
        if changed:
            decisions.append(WriteAssignments(self.publish(d, changed)))
        # Stable means running: every member runs its target (published, taken, acknowledged and started)
        starting = self.acks.starting(d.assignment)
        if starting != self.shown_starting:
            self.shown_starting = starting
            write_state = True
        settled = (
            not self.unreleased
            and not ops.deferred
            and self.retarget_due is None
            and not self.acks.waiting
            and not self.refused
            and all(d.assignment.get(m, ()) == self.target.get(m, ()) for m in core.members)
            and all(self.acks.acked(m, d.assignment) for m in core.members)
            and not starting
        )
        state = GroupState.STABLE if settled else GroupState.RECONCILING
        if state is not d.state_after:
            d.transition(state)
            write_state = True
        if settled and not d.reason.startswith("reconciled"):
            d.reason = f"reconciled ({d.reason})"
        ops.settle_preferred(d.assignment, core.members)
        d.show_state = write_state or set(ops.moving) != set(moving_before)
        d.watch = tuple(
            sorted(
                t
                for t, mv in ops.moving.items()
                if mv.dest is not None and (t not in moving_before or moving_before[t].dest != mv.dest)
            )
        )
        return decisions

    def changes(
        self, d: Draft, assigned: Mapping[str, tuple[str, ...]], revoked: Mapping[str, tuple[str, ...]], everyone: bool
    ) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        """The members whose published assignment changes: (member, assigned now, revoked now). A task revoked
        and given back before it was let go simply stays (its revocation is no longer pending)."""
        core = self.core
        changed: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        for m in sorted(core.members):
            now_assigned = tuple(sorted(assigned.get(m, ())))
            pending = self.unreleased.get(m, {})
            if pending:
                for t in pending.keys() & set(now_assigned):
                    del pending[t]
            to_revoke = tuple(sorted(t for t in revoked[m] if t not in pending)) if m in revoked else ()
            news = core.operations.incoming_for(m, now_assigned) != self.announced.get(m, ())
            if now_assigned != d.assignment.get(m) or to_revoke or everyone or m in self.acks.republish or news:
                changed.append((m, now_assigned, to_revoke))
        return changed

    def publish(
        self, d: Draft, changed: list[tuple[str, tuple[str, ...], tuple[str, ...]]]
    ) -> tuple[tuple[str, Assignment], ...]:
        """The changed members' assignments, under one new member epoch (from the group's one counter, so
        epochs only grow), each with every revocation not yet confirmed, not only this step's: the assignment
        znode alone tells a new controller what the member may still be stopping."""
        core = self.core
        epoch = d.next_epoch()
        now = core.clock.now()
        writes = []
        for m, now_assigned, to_revoke in changed:
            owned = set(core.members[m].owned).difference(core.members[m].pending)
            gone = (set(d.assignment.get(m, ())) - set(now_assigned)) | set(to_revoke)
            # a task the member was fenced from and never reported needs no confirmation (its owner znode,
            # should it hold one after all, keeps the next member waiting)
            gone = {t for t in gone if t in owned or not self.acks.fenced_from(m, t)}
            pending = self.unreleased.setdefault(m, {})
            pending.update({t: epoch for t in gone if t not in pending})
            self.acks.published(m, epoch, now, now_assigned, owned, core.members[m].acknowledges)
            if not pending:
                del self.unreleased[m]
            d.assignment[m] = now_assigned
            incoming = core.operations.incoming_for(m, now_assigned)
            if incoming:
                self.announced[m] = incoming
            else:
                self.announced.pop(m, None)
            writes.append(
                (
                    m,
                    Assignment(
                        generation=epoch,
                        controller_epoch=core.controller_epoch,
                        assigned=now_assigned,
                        revoked=tuple(sorted(pending)),
                        protocol=RECONCILE,
                        incarnation=core.members[m].incarnation,
                        incoming=incoming,
                    ),
                )
            )
        return tuple(writes)
