"""What the members of a reconciling group owe the coordinator, sans-IO, and what happens when it is late: a
member acknowledges each assignment published to it (a report at its member epoch listing every task it was
given, written once it holds their owner znodes) and reports the tasks it took. A task not taken within the
rebalance timeout fences its member from it (``barred``: it is placed elsewhere); a report owed past it has the
member's assignment published again. A part of :class:`~controller.protocol.group.reconcile.ReconcileGroup`, which
owns one (``acks``), tells it of every assignment it publishes, and decides what a late member's fence moves.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controller.protocol.group.probation import BackoffPolicy, Probation
from controller.protocol.group.vocabulary import GroupView
from controller.protocol.records.group_messages import JoinRequest

log = logging.getLogger(__name__)


class AcksCore(GroupView, Protocol):
    """What the acknowledgements need of their group beyond ``GroupView``: the members' reports, what each
    was published, and who is leaving (given no task a fence moves)."""

    @property
    def members(self) -> Mapping[str, JoinRequest]: ...
    @property
    def assignment(self) -> Mapping[str, tuple[str, ...]]: ...
    @property
    def shutting_down(self) -> Collection[str]: ...


@dataclass(eq=False)
class Acks:
    """The member epochs a reconciling group's members must acknowledge, the tasks they have not taken yet,
    and the fences of those that did not take them in time."""

    core: AcksCore = field(repr=False)
    #: member -> the member epoch of its last published assignment
    epochs: dict[str, int] = field(default_factory=dict)
    #: member -> when its assignment was last published (or asked again): the rebalance timeout of what it
    #: owes (an acknowledgement, a release) runs from there
    published_at: dict[str, float] = field(default_factory=dict)
    #: member -> task -> when it was published to the member and not yet reported taken (owner znode held)
    waiting: dict[str, dict[str, float]] = field(default_factory=dict)
    #: task -> the members fenced from it (published, not taken within the rebalance timeout)
    barred: dict[str, set[str]] = field(default_factory=dict)
    #: members whose assignment is published again at the next step (a refused member that rewrote its request,
    #: a report owed too long)
    republish: set[str] = field(default_factory=set)
    #: tasks fenced from a member since the coordinator started (the controller's metric)
    fenced_total: int = 0
    #: members whose acknowledgements ZooKeeper keeps contradicting, kept from new work for a back-off
    probation: Probation = field(default_factory=Probation)

    def __post_init__(self) -> None:
        c = self.core.config
        self.probation.policy = BackoffPolicy(c.backoff_refusals, c.backoff_initial_s, c.backoff_max_s)

    def epoch_of(self, member: str) -> int:
        """The member epoch of the member's last published assignment (-1: none yet)."""
        return self.epochs.get(member, -1)

    # ---- what the members reported ------------------------------------------------------------------
    def acked(self, member: str, placed: Mapping[str, tuple[str, ...]] | None = None) -> bool:
        """Whether the member acknowledged its published assignment (``placed``: the group's, when not yet
        taken by the coordinator): a report at its member epoch (or later) listing every task published to
        it, written once it holds their owner znodes."""
        r = self.core.members.get(member)
        if r is None or not r.acknowledges:
            return True  # (a broker of a release before acknowledgements: what it was published counts)
        if r.generation < self.epochs.get(member, -1):
            return False
        mine = (self.core.assignment if placed is None else placed).get(member, ())
        return not mine or (not r.pending and (r.owned == mine or set(mine) <= set(r.owned)))

    def newly_taken(self, member: str, report: JoinRequest) -> tuple[str, ...]:
        """The tasks a report says the member took that the coordinator waits for it to take: what the IO
        layer checks against their owner znodes (ZooKeeper's word) before the report counts."""
        w = self.waiting.get(member)
        if not w or not report.owned:
            return ()
        return tuple(sorted(set(report.owned).difference(report.pending).intersection(w)))

    def unacked(self) -> tuple[str, ...]:
        """The members that have not acknowledged their current assignment (shown with the group state)."""
        return tuple(m for m in sorted(self.core.members) if not self.acked(m))

    def starting(self, placed: Mapping[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
        """The members whose report says tasks placed with them (``placed``: as ``acked``) are still starting
        (held, not running yet): the group is not Stable until they run (shown with the group state)."""
        placed = self.core.assignment if placed is None else placed
        return tuple(
            m
            for m, r in sorted(self.core.members.items())
            if r.starting and not set(r.starting).isdisjoint(placed.get(m, ()))
        )

    def taken(self, member: str, report: JoinRequest) -> None:
        """The member's report lists what it holds now: those tasks wait for it no longer (and no member is
        fenced from a task that runs)."""
        w = self.waiting.get(member)
        if not report.owned:
            return
        owned = set(report.owned).difference(report.pending)
        if w and owned & w.keys():
            self.probation.confirmed(member)  # (the IO layer checked them against their owner znodes)
        if w:
            for t in owned & w.keys():
                del w[t]
            if not w:
                del self.waiting[member]
        if self.barred:
            for t in owned & self.barred.keys():
                del self.barred[t]

    # ---- what they owe, and by when -----------------------------------------------------------------
    def owing(self, unreleased: Collection[str]) -> list[str]:
        """Members that owe a report: one at their member epoch, or (``unreleased``: the members with a
        revocation not yet confirmed) one confirming a release."""
        return [
            m
            for m, r in self.core.members.items()
            if m in self.published_at
            and (m in unreleased or (r.acknowledges and r.generation < self.epochs.get(m, -1)))
        ]

    def due(self, unreleased: Collection[str]) -> float | None:
        """When the oldest task published and not yet taken, or the oldest report owed, overruns the rebalance
        timeout (None: nothing is owed)."""
        firsts = [min(w.values()) for w in self.waiting.values() if w]
        firsts += [self.published_at[m] for m in self.owing(unreleased)]
        return min(firsts) + self.core.config.rebalance_timeout_s if firsts else None

    def overdue(self, now: float, unreleased: Collection[str]) -> tuple[dict[str, list[str]], list[str]]:
        """What the rebalance timeout has run out on: member -> the tasks published and not taken, from which
        it is fenced now (it may not be given them again while another member can take them); and the members
        that owe a report (a release never confirmed, an epoch never acknowledged: the member's request may
        have been rewritten behind its back), whose assignment is published to them again, at a new epoch."""
        timeout = self.core.config.rebalance_timeout_s
        fenced: dict[str, list[str]] = {}
        for m, w in self.waiting.items():
            late = sorted(t for t, since in w.items() if since + timeout <= now)
            for t in late:
                del w[t]
                self.barred.setdefault(t, set()).add(m)
            if late:
                fenced[m] = late
                # (what it was given and never took counts as an acknowledgement contradicted: ``probation``)
                if self.probation.contradicted(m, now, f"did not take {', '.join(late[:3])} within {timeout:g}s"):
                    log.warning("group %s: %s kept from new work: %s", self.core.group, m, self.probation.why[m])
        self.waiting = {m: w for m, w in self.waiting.items() if w}
        asked = [m for m in self.owing(unreleased) if self.published_at[m] + timeout <= now and m not in fenced]
        if asked:
            log.warning(
                "group %s: no report from %s within %gs: publishing to them again", self.core.group, asked, timeout
            )
            self.republish.update(asked)
            for m in asked:
                self.published_at[m] = now
        self.fenced_total += sum(len(ts) for ts in fenced.values())
        return fenced, asked

    # ---- the fences ---------------------------------------------------------------------------------
    def apply_bars(self, target: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """The target with every task moved off the members fenced from it, to the least loaded member that
        is not (a task every member is fenced from is tried again where the assignor put it), then off the
        members kept from work (``probation``)."""
        core = self.core
        open_members = sorted(
            m for m, r in core.members.items() if m in target and not r.leaving and m not in core.shutting_down
        )
        return self.probation.apply(self._bar(target), open_members, core.clock.now())

    def _bar(self, target: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        if not self.barred:
            return target
        core = self.core
        out = {m: list(ts) for m, ts in target.items()}
        where = {t: m for m, ts in target.items() for t in ts}
        open_members = sorted(
            m for m, r in core.members.items() if m in out and not r.leaving and m not in core.shutting_down
        )
        for t in sorted(self.barred):
            bar = self.barred[t]
            m = where.get(t)
            if m is None or m not in bar:
                continue
            others = [x for x in open_members if x not in bar]
            if not others:
                del self.barred[t]  # fenced everywhere: every member gets another chance
                continue
            to = min(others, key=lambda x: (len(out[x]), x))
            out[m].remove(t)
            out[to].append(t)
        return {m: tuple(sorted(ts)) for m, ts in out.items()}

    def let_go(self, held_by: Mapping[str, set[str]]) -> None:
        """A member fenced from a task it never took, or kept from work (``probation``) with tasks it never
        took, holds them no more (if it does after all, its owner znode keeps the next member waiting until it
        lets go)."""
        now = self.core.clock.now()
        for m, held in held_by.items():
            r = self.core.members.get(m)
            if self.probation.kept(m, now):
                held.difference_update({t for t in held if r is None or t in r.pending or t not in r.owned})
        for t, bar in self.barred.items():
            for m in bar:
                r = self.core.members.get(m)
                if m in held_by and (r is None or t in r.pending or t not in r.owned):
                    held_by[m].discard(t)

    def fenced_from(self, member: str, task: str) -> bool:
        return member in self.barred.get(task, ())

    # ---- publications -------------------------------------------------------------------------------
    def published(
        self, member: str, epoch: int, now: float, assigned: tuple[str, ...], owned: Collection[str], acks: bool
    ) -> None:
        """An assignment published to the member at ``epoch``: it owes its acknowledgement from ``now``, and
        (a member that reports what it takes: ``acks``) the tasks it was given and does not hold yet."""
        self.republish.discard(member)
        self.published_at[member] = now
        w = {t: since for t, since in self.waiting.get(member, {}).items() if t in assigned}
        if acks:  # (an older broker's taking is not reported: not waited for)
            w.update({t: now for t in assigned if t not in owned and t not in w})
        if w:
            self.waiting[member] = w
        else:
            self.waiting.pop(member, None)
        self.epochs[member] = epoch

    def resumed(self, member: str, epoch: int, now: float, waiting: Collection[str]) -> None:
        """After a failover: the member's assignment read back at ``epoch``; what it has not reported taken
        (``waiting``) waits from ``now``."""
        self.epochs[member] = epoch
        self.published_at[member] = now
        if waiting:
            self.waiting[member] = {t: now for t in waiting}

    def forget(self, member: str) -> None:
        """The member left (its session ended, and with it every owner znode it held): it owes nothing."""
        self.waiting.pop(member, None)
        self.published_at.pop(member, None)
        self.republish.discard(member)
        for bar in self.barred.values():
            bar.discard(member)
        self.epochs.pop(member, None)

    def abandon(self) -> None:
        """The group leaves reconcile (or empties): nothing is owed, nobody is fenced (the epochs stay)."""
        self.waiting.clear()
        self.published_at.clear()
        self.barred.clear()
        self.republish.clear()
