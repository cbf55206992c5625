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
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

from controller.protocol.assignors import get_assignor
from controller.protocol.codecs import Assignment, JoinRequest, MemberMetadata
from controller.protocol.errors import ProtocolError
from controller.protocol.group_types import (
    FOREVER,
    Decision,
    GroupState,
    WatchMoves,
    WriteAssignments,
    WriteGroupState,
    Held,
)
from controller.protocol.rules import RECONCILE, choose_assignor, choose_protocol, cooperative_adjust
from controller.protocol.throttle import Wave, plan_wave

if TYPE_CHECKING:  # the mixin's host
    from controller.protocol.group import GroupCoordinator

log = logging.getLogger(__name__)


def holders(
    published: Mapping[str, tuple[str, ...]],
    unreleased: Mapping[str, Mapping[str, int]],
    requests: Mapping[str, JoinRequest],
) -> dict[str, set[str]]:
    """Member -> every task it may still run: published to it, revoked from it but not confirmed released,
    or reported by it as owned. A member that is gone holds nothing (its session, and with it every owner
    znode it held, ended)."""
    out: dict[str, set[str]] = {}
    for m, r in requests.items():
        mine, pending = published.get(m, ()), unreleased.get(m)
        if not pending and r.owned == mine:  # (most members, most steps: one set, not three and two unions)
            out[m] = set(mine)
        else:
            out[m] = set(mine) | set(pending or ()) | set(r.owned)
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


class ReconcileMixin:
    """The reconcile half of :class:`~controller.protocol.group.GroupCoordinator` (its fields live there)."""

    def epoch_of(self: "GroupCoordinator", member: str) -> int:
        """The member epoch of the member's last published assignment (-1: none yet)."""
        return self.epochs.get(member, -1)

    # ---- mode -------------------------------------------------------------------------------------
    def reconciling(self: "GroupCoordinator") -> bool:
        """Whether the group runs the reconcile protocol now (Reconciling or Stable under it)."""
        return self.protocol == RECONCILE and self.state in (GroupState.RECONCILING, GroupState.STABLE)

    def _all_prefer_reconcile(self: "GroupCoordinator", requests: Mapping[str, JoinRequest]) -> bool:
        """Every member supports reconcile and the members' vote picks it."""
        if not requests:
            return False
        choice = choose_protocol({m: r.protocols for m, r in requests.items()}, self.leader)
        return choice.protocol == RECONCILE and not choice.incompatible

    # ---- entering and leaving ---------------------------------------------------------------------
    def _r_enter(self: "GroupCoordinator", reason: str) -> list[Decision]:
        """A join round ended with every member for reconcile (or a failover found it): from now on the
        coordinator places tasks itself. What the members listed as owned counts as held."""
        self.protocol = RECONCILE
        self.leader = None
        self.join_deadline = self.sync_deadline = None
        self.join_result = None
        self.excluded.clear()
        self.static_returned.clear()
        self.assignor = choose_assignor({m: r.assignors for m, r in self.members.items()}, min(self.members),
                                        self.config.default_assignor)
        self.assignment = {m: ts for m, ts in self.assignment.items() if m in self.members}
        self.generation_members = tuple(sorted(self.members))
        if self.state is not GroupState.RECONCILING:
            self._transition(GroupState.RECONCILING)
        log.info("group %s: reconcile protocol (%s)", self.group, reason)
        nothing_runs = not any(self.assignment.values()) and not any(r.owned for r in self.members.values())
        if nothing_runs and self.config.initial_delay_s > 0:
            # a group forming: wait for the brokers starting with this one (every member learns the protocol now)
            now = self.clock.now()
            self.forming_until = now + self.config.rebalance_timeout_s
            self.retarget_due = min(now + self.config.initial_delay_s, self.forming_until)
            self.retarget_reason = reason
            self.target = {}
            self.reason = f"forming: waiting {self.config.initial_delay_s:g}s for more members ({reason})"
            return self._r_step(write_state=True, everyone=True)
        return self._r_retarget(reason, everyone=True)

    # ---- inputs -----------------------------------------------------------------------------------
    def _r_on_members(self: "GroupCoordinator", snapshot: Mapping[str, JoinRequest]) -> list[Decision]:
        """Members joined, left, or reported releases (rewrote their requests)."""
        now = self.clock.now()
        old, new = self.members, dict(snapshot)
        self.members = new
        need = ""
        quiet_exit = False  # a member that was to run nothing and ran nothing left: no one's target changes
        for m in sorted(old.keys() & new.keys()):
            if old[m].incarnation != new[m].incarnation:  # a restart seen as one change: it left, then joined
                self.members = old
                return self.on_members({k: r for k, r in new.items() if k != m}) + self.on_members(new)
        for m in sorted(old.keys() - new.keys()):
            self.shutting_down.discard(m)
            tasks = self.assignment.pop(m, ())
            self.unreleased.pop(m, None)  # (its session ended, and with it every owner znode it held)
            targeted = self.target.pop(m, ())
            self.epochs.pop(m, None)
            for t in [t for t, mv in self.moving.items() if mv.dest == m]:
                del self.moving[t]
            key = self.identity(m, old[m])
            if tasks and self.maintenance:
                kept = self.held[key].tasks if key in self.held else ()
                self.held[key] = Held(tuple(sorted(set(kept) | set(tasks))), FOREVER)
                log.info("group %s: %s left in maintenance mode; its %d tasks wait", self.group, m, len(tasks))
            elif tasks and self.config.scheduled_rebalance_delay_s > 0 and not old[m].leaving:
                self.held[key] = Held(tasks, now + self.config.scheduled_rebalance_delay_s)
                log.info("group %s: %s left; holding %d tasks for %.1fs", self.group, m, len(tasks),
                         self.config.scheduled_rebalance_delay_s)
            if not tasks and not targeted:
                # the end of a controlled shutdown (its tasks already re-targeted away): a new target would be
                # the one there is, and asking for one while tasks still move would hold the group Reconciling
                # until the retarget interval is over, for nothing
                quiet_exit = True
                continue
            need = need or f"member {m} left"
        for m in sorted(new.keys() - old.keys()):
            if self.maintenance:
                self.postponed = self.postponed or f"member {m} joined"
                continue
            need = need or f"member {m} joined"
        for m in sorted(new.keys() & old.keys()):
            before, after = old[m], new[m]
            if before == after:
                continue
            leaving = self._newly_leaving(m, before, after)
            need = need or leaving
            if after.protocols != before.protocols or after.capacity != before.capacity or after.rack != before.rack:
                need = need or f"member {m} changed"
            if m in self.unreleased:
                self.unreleased[m] = confirm_releases(self.unreleased[m], after)
                if not self.unreleased[m]:
                    del self.unreleased[m]
        self.generation_members = tuple(sorted(self.members))
        if not self.members:
            return self._to_empty("all members left")
        if need:
            return self._prepare_rebalance(need)  # re-targets (or leaves reconcile for a cooperative round)
        return self._r_step(write_state=quiet_exit)  # (the state lists the members)

    def _r_retarget_soon(self: "GroupCoordinator", reason: str) -> list[Decision]:
        """A new target now, or, while the group is still reconciling towards one computed less than
        ``retarget_interval_s`` ago, at that interval's end (a step now for what changed meanwhile)."""
        now = self.clock.now()
        if self.forming_until is not None:
            if self.retarget_due is not None and now < self.retarget_due:
                # still forming: another member (or change) moves the first target back, within the bound
                self.retarget_due = min(now + self.config.initial_delay_s, self.forming_until)
                self.retarget_reason = self.retarget_reason or reason
                return self._r_step(write_state=False)
            return self._r_retarget(self.retarget_reason or reason)
        due = self.last_retarget + self.config.retarget_interval_s
        if self.state is GroupState.RECONCILING and now < due:
            self.retarget_due = due
            self.retarget_reason = self.retarget_reason or reason
            return self._r_step(write_state=False)
        return self._r_retarget(self.retarget_reason or reason)

    def _r_retarget(self: "GroupCoordinator", reason: str, everyone: bool = False) -> list[Decision]:
        """Compute every member's target with the group's assignor, then take a step towards it."""
        self.last_retarget = self.clock.now()
        self.retarget_due, self.retarget_reason, self.forming_until = None, "", None
        self.reason = reason
        self.rebalances += 1
        self.generation_members = tuple(sorted(self.members))
        # sticky to where tasks are heading (the current target), not to where they still run: a target
        # computed from a half-reached one would move again what is already on its way (KIP-848 likewise
        # gives its assignors the current target assignment)
        previous = {m: self.target[m] if m in self.target else self.assignment[m]
                    for m in self.members if m in self.target or m in self.assignment}
        for m, r in sorted(self.members.items()):
            key = self.identity(m, r)
            if key in self.held and not r.leaving:  # a static member back within the delay: its tasks again
                previous[m] = tuple(sorted(set(previous.get(m, ())) | set(self.held.pop(key).tasks)))
                log.info("group %s: %s returned as %s within the delay", self.group, key, m)
        members = [MemberMetadata(member_id=m, owned=previous.get(m, ()), capacity=r.capacity, rack=r.rack,
                                  instance_id=r.instance_id, leaving=r.leaving or m in self.shutting_down)
                   for m, r in sorted(self.members.items())]
        descriptors = self._descriptors(self.members, skip=self.held_tasks())
        try:
            target = get_assignor(self.assignor or self.config.default_assignor).assign(members, descriptors, previous)
        except (KeyError, ValueError) as exc:
            log.warning("group %s: cannot compute a target (%s); keeping the last one", self.group, exc)
            target = dict(self.target)
        self.target = {m: tuple(sorted(target.get(m, ()))) for m in self.members}
        return self._r_step(write_state=True, everyone=everyone)

    def _r_step(self: "GroupCoordinator", write_state: bool, everyone: bool = False) -> list[Decision]:
        """Publish to each member what it may have now; write only the members whose assignment changes
        (``everyone``: all of them, when the group has just entered the protocol)."""
        held_by = holders(self.assignment, self.unreleased, self.members)
        assigned, revoked = step(self.target, held_by)
        moving_before = dict(self.moving)
        if self.throttled():
            wave: Wave = plan_wave(assigned, revoked, held_by, self.tasks, self.moving, self.limits, self.clock.now(),
                                   frozen=self.maintenance, room=self.cluster_room,
                                   leaving=[m for m, r in self.members.items() if r.leaving or m in self.shutting_down])
            assigned, revoked = wave.assigned, wave.revoked
            self.moving, self.deferred = wave.moving, wave.deferred
        else:
            self.moving, self.deferred = {}, ()
        changed: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []
        for m in sorted(self.members):
            now_assigned = tuple(sorted(assigned.get(m, ())))
            pending = self.unreleased.get(m, {})
            if pending:
                for t in pending.keys() & set(now_assigned):
                    del pending[t]  # revoked, then given back before it was let go: it simply stays
            to_revoke = tuple(sorted(t for t in revoked[m] if t not in pending)) if m in revoked else ()
            if now_assigned != self.assignment.get(m) or to_revoke or everyone:
                changed.append((m, now_assigned, to_revoke))
        decisions: list[Decision] = []
        if changed:
            self.generation += 1
            self.join_generation = self.generation
            writes = []
            for m, now_assigned, to_revoke in changed:
                gone = (set(self.assignment.get(m, ())) - set(now_assigned)) | set(to_revoke)
                pending = self.unreleased.setdefault(m, {})
                pending.update({t: self.generation for t in gone if t not in pending})
                if not pending:
                    del self.unreleased[m]
                self.assignment[m] = now_assigned
                self.epochs[m] = self.generation
                # every revocation not yet confirmed, not only this step's: the assignment znode alone tells
                # a new controller what the member may still be stopping
                writes.append((m, Assignment(generation=self.generation, controller_epoch=self.controller_epoch,
                                             assigned=now_assigned, revoked=tuple(sorted(pending)),
                                             protocol=RECONCILE, incarnation=self.members[m].incarnation)))
            decisions.append(WriteAssignments(tuple(writes)))
        settled = (not self.unreleased and not self.deferred and self.retarget_due is None
                   and all(self.assignment.get(m, ()) == self.target.get(m, ()) for m in self.members))
        state = GroupState.STABLE if settled else GroupState.RECONCILING
        if state is not self.state:
            self._transition(state)
            write_state = True
        if settled and not self.reason.startswith("reconciled"):
            self.reason = f"reconciled ({self.reason})"
        for t_id, to in list(self.preferred.items()):
            if t_id in self.assignment.get(to, ()) or t_id not in self.tasks or to not in self.members:
                del self.preferred[t_id]  # there (or no longer possible): the pin has done its work
        if write_state or set(self.moving) != set(moving_before):
            decisions.append(WriteGroupState(self.info()))
        new_moves = tuple(sorted(t for t, mv in self.moving.items() if mv.dest is not None
                                 and (t not in moving_before or moving_before[t].dest != mv.dest)))
        if new_moves:
            decisions.append(WatchMoves(new_moves))
        return decisions

    def _r_leave_notices(self: "GroupCoordinator") -> tuple[tuple[str, Assignment], ...]:
        """Leaving reconcile for a join round: tell every member in its own assignment, the one znode a
        reconciling member reads (REBALANCE_IN_PROGRESS, at the round's generation, for this life of it).
        It keeps what it runs (a cooperative round) and joins; no task is given by a notice."""
        return tuple((m, Assignment(generation=self.join_generation, controller_epoch=self.controller_epoch,
                                    error=ProtocolError.REBALANCE_IN_PROGRESS.name, protocol=RECONCILE,
                                    incarnation=r.incarnation))
                     for m, r in sorted(self.members.items()))

    def _r_load(self: "GroupCoordinator", assignments: Mapping[str, Assignment]) -> list[Decision]:
        """Resume a reconciling group after a controller failover: the published assignments and their
        unconfirmed revocations come from ZooKeeper; the members' reports confirm what they can."""
        self.assignment, self.unreleased = {}, {}
        for m, a in assignments.items():
            if m not in self.members or a.error is not None or a.protocol != RECONCILE:
                continue
            if a.incarnation != self.members[m].incarnation:
                continue  # published to an earlier life of the member: that session, and all it held, is gone
            self.assignment[m] = tuple(a.assigned)
            self.epochs[m] = a.generation
            self.generation = max(self.generation, a.generation)
            pending = confirm_releases({t: a.generation for t in a.revoked}, self.members[m])
            if pending:
                self.unreleased[m] = pending
        self.join_generation = self.generation
        self.state = GroupState.RECONCILING
        return self._r_retarget("controller failover")
