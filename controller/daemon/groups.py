"""Groups: one sans-IO ``GroupCoordinator`` per group, fed with member, proposal and timer events;
its decisions (group state, join results, assignments, sync watches, old generations) written as
fenced multis."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from kazoo.exceptions import (
    NodeExistsError,
    NoNodeError,
)

from controller.daemon import events as ev
from controller.daemon.context import ControllerContext
from controller.daemon.grants import TaskGrants
from controller.daemon.host import Host, Watcher, context_of
from controller.daemon.metrics import ControllerMetrics
from controller.daemon.names import legal_children
from controller.daemon.operations import OperatorSettings
from controller.protocol.clock import Clock
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.readiness import placeable
from controller.protocol.group.reports import ghost_reason, request_problem
from controller.protocol.group.rules import RECONCILE
from controller.protocol.group.vocabulary import (
    DeleteGenerationsBelow,
    GroupConfig,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.protocol.records import codecs, group_messages
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest
from controller.protocol.records.payload_validation import PayloadError
from controller.zk import io as zkio
from controller.zk.io import FencedWriter, InterruptibleClient, WriteFailed, children_many, get_many
from controller.zk.multi_read import multi_read

log = logging.getLogger(__name__)


def record_member(ctx: ControllerContext, g: str, m: str, data: bytes, stat: Any, path: str) -> bool:
    """Record a member's join request (``path``: its znode); True if it comes from a new session (the member
    restarted, even if its request is byte-identical to the old one: the coordinator must see it leave and
    join). A znode not held by the session of the live broker of the same id is a ghost (``ghost_members``);
    garbage or a request out of bounds is set apart in ``invalid_members``: neither is handed to the
    coordinator, and a live member's last good request stands meanwhile (its tasks are not dropped)."""
    bounced = False
    if stat is not None:
        broker = ctx.brokers.get(m)
        ghost = ghost_reason(m, stat.ephemeralOwner, broker.session if broker else None, broker is not None)
        if ghost:
            if (g, m) not in ctx.ghost_members:
                # no registration yet is the usual race of a first start (the member znode read before the
                # broker's registration): not news; a znode held by another session is
                level = logging.INFO if broker is None else logging.WARNING
                log.log(level, "group %s: ignoring member znode %s: %s", g, m, ghost)
            ctx.ghost_members[(g, m)] = ghost
            ctx.members.setdefault(g, {}).pop(m, None)
            ctx.invalid_members.pop((g, m), None)
            ctx.member_sessions.pop((g, m), None)
            return False
        ctx.ghost_members.pop((g, m), None)
        previous = ctx.member_sessions.get((g, m))
        bounced = previous is not None and previous != stat.ephemeralOwner
        ctx.member_sessions[(g, m)] = stat.ephemeralOwner
    try:
        req = codecs.decode(JoinRequest, data, path)
        if req.member_id != m:
            raise PayloadError(path, f"member_id {req.member_id!r} does not match the znode name")
        problem = request_problem(req)
        if problem:
            raise PayloadError(path, problem)
        ctx.members.setdefault(g, {})[m] = req
        ctx.invalid_members.pop((g, m), None)
    except PayloadError as exc:
        log.warning("refusing the request of member %s: %s", m, exc)
        if bounced:
            ctx.members.setdefault(g, {}).pop(m, None)  # a new life: the old one's request is not its
        ctx.invalid_members[(g, m)] = str(exc)
    return bounced


def ignored_members(ctx: ControllerContext, g: str) -> dict[str, str]:
    """The group's member znodes given no work, and why (ghosts, refused requests)."""
    out = {m: f"ghost: {why}" for (gg, m), why in ctx.ghost_members.items() if gg == g}
    out.update({m: f"refused: {why}" for (gg, m), why in ctx.invalid_members.items() if gg == g})
    return out


def not_held_reason(tasks: Sequence[str]) -> str:
    return f"reports {len(tasks)} task(s) taken whose owner znode it does not hold ({', '.join(tasks[:3])})"


class GroupDriver:
    """Member and proposal handlers, and carrying out the coordinators' decisions."""

    def __init__(
        self,
        host: Host,
        zk: InterruptibleClient,
        layout: ZkLayout,
        clock: Clock,
        metrics: ControllerMetrics,
        controller_id: str,
        group_config: GroupConfig,
        grants: TaskGrants,
        operations: OperatorSettings,
    ) -> None:
        self._host = host
        self._zk = zk
        self._layout = layout
        self._clock = clock
        self._metrics = metrics
        self._id = controller_id
        self._config = group_config
        self._grants = grants
        self._operations = operations

    def ensure_paths(self, g: str) -> None:
        lay = self._layout
        for p in (lay.group_members(g), lay.group_joins(g), lay.group_syncs(g), lay.group_assignments(g)):
            self._zk.ensure_path(p)

    def new_coordinator(self, g: str) -> GroupCoordinator:
        ctx, epoch = context_of(self._host), self._host.epoch
        assert epoch is not None, "an active controller has an epoch"
        config = self._config
        if self._grants.per_broker():  # a receiver's right to a task comes with its assignment: no early handoff
            config = replace(config, handoff=False)
        coord = GroupCoordinator(group=g, controller_epoch=epoch, clock=self._clock, config=config)
        ctx.groups[g] = coord
        self._operations.configure(g, coord)
        ctx.members.setdefault(g, {})
        return coord

    def coordinator(self, g: str) -> GroupCoordinator:
        ctx = context_of(self._host)
        coord = ctx.groups.get(g)
        if coord is None:
            self.ensure_paths(g)
            coord = self.new_coordinator(g)
            coord.on_tasks(ctx.group_tasks(g))
            self._zk.get_children(self._layout.group_members(g), watch=self._members_watch(g))
            self._host.put(ev.MembersChange(self._host.token, g))
        return coord

    def _members_watch(self, g: str) -> Watcher:
        return self._host.watch(lambda t: ev.MembersChange(t, g))

    def members_watch(self, path: str) -> Watcher:
        """The children watch of a group's members (``path``: ``.../<group>/members``)."""
        return self._members_watch(path.split("/")[-2])

    def member_watch(self, path: str) -> Watcher:
        parts = path.split("/")
        g, m = parts[-3], parts[-1]
        return self._host.watch(lambda t: ev.MemberChange(t, g, m))

    def _set_member(self, ctx: ControllerContext, g: str, m: str, data: bytes, stat: Any = None) -> bool:
        return record_member(ctx, g, m, data, stat, self._layout.group_member(g, m))

    # ---- carrying out decisions -------------------------------------------------------------------
    def apply(self, g: str, decisions: list[Any]) -> None:
        """One event's decisions for a group become one ordered, fenced, batched write.

        What the members wait for (assignments, join result, group state) goes out at once, with no look-up
        first (see ``_write_items``). The watch on the leader's proposal is armed by a request sent just ahead
        of that write, so it costs no round trip of its own. Old generations' join results and proposals
        known to exist are deleted in the same multi as the assignments that make them obsolete; only
        housekeeping that needs a look-up runs after the write (``_cleanup_generations``).
        """
        ctx, writer = self._host.ctx, self._host.writer
        if not decisions or writer is None or ctx is None:
            return
        lay = self._layout
        items: list[tuple[str, bytes]] = []
        watches: list[int] = []
        cleanup_below: int | None = None
        moves: tuple[str, ...] = ()
        generations = ctx.generation_paths.setdefault(g, {})
        for d in decisions:
            if isinstance(d, WriteAssignments):
                items += [(lay.group_assignment(g, m), codecs.encode(a)) for m, a in d.assignments]
            elif isinstance(d, WriteJoinResult):
                items.append((lay.group_join(g, d.result.generation), codecs.encode(d.result)))
                generations[lay.group_join(g, d.result.generation)] = d.result.generation
            elif isinstance(d, WriteGroupState):
                items.append((lay.group_state(g), codecs.encode(d.info)))
                if d.info.state == "PreparingRebalance":
                    self._metrics.rebalances.labels(g).inc()
                self._metrics.moving.labels(g).set(len(d.info.moving))
                self._metrics.unacked.labels(g).set(len(d.info.unacked))
                self._metrics.fenced_tasks.labels(g).set(
                    ctx.groups[g].reconcile.acks.fenced_total if g in ctx.groups else 0
                )
                self._metrics.deferred.labels(g).set(d.info.deferred)
                if d.info.imbalance is not None:
                    self._metrics.imbalance.labels(g).set(d.info.imbalance)
            elif isinstance(d, WatchMoves):
                moves = d.tasks
            elif isinstance(d, WatchSync):
                watches.append(d.generation)
                generations[lay.group_sync(g, d.generation)] = d.generation
            elif isinstance(d, DeleteGenerationsBelow):
                cleanup_below = d.generation
                # emitted with the assignments of a generation whose proposal was just read: it exists
                ctx.known_paths.add(lay.group_sync(g, d.generation))
        deletes: list[str] = []
        lookup: list[str] = []
        if cleanup_below is not None:
            old = sorted(p for p, gen in generations.items() if gen < cleanup_below)
            for p in old:
                del generations[p]
                (deletes if p in ctx.known_paths else lookup).append(p)
        armed = [(gen, self._arm_sync_watch(g, gen)) for gen in watches]
        before = writer.requests
        self._grants.hand_over(decisions)  # per-broker identities: the new assignee's rights precede its assignment
        self._host.write(lambda: self._write_items(ctx.known_paths, writer, items, deletes))
        self._metrics.zk_writes.inc(writer.requests - before)
        for gen, pending in armed:
            if pending.get() is not None:
                self._host.put(ev.SyncProposalReady(self._host.token, g, gen))
        if cleanup_below is not None:
            self._cleanup_generations(g, cleanup_below, lookup)
        if moves:
            self._operations.watch_moves(g, moves)

    def _write_items(
        self, known: set[str], writer: FencedWriter, items: list[tuple[str, bytes]], deletes: list[str]
    ) -> None:
        """Write ``(path, data)`` items and delete ``deletes`` in fenced multis, without looking anything up
        first: a path in ``known_paths`` is set, any other is created. The controller's unknown paths are
        new ones (each generation's join result, a new member's assignment), so ``upsert``'s pipelined
        ``exists`` before every write that creates one was a round trip on the way to the members. Should
        ZooKeeper disagree (a znode created or deleted behind the controller's back), the items are written
        again through ``upsert``, which looks them up, and the deletes go through ``delete_if_present``.
        A rewrite of an item already written is harmless: the same bytes, the watchers read them again."""
        last = {p: d for p, d in items}  # a path written twice in one batch: once, its last value, first place
        items = [(p, last.pop(p)) for p, _ in items if p in last]
        ops: list[Any] = [zkio.SetData(p, d) if p in known else zkio.Create(p, d) for p, d in items]
        ops += [zkio.Delete(p) for p in deletes]
        try:
            writer.write(ops)
        except WriteFailed as exc:
            for op, err in exc.failures:
                if isinstance(err, NoNodeError):
                    known.discard(op.path)
                elif isinstance(err, NodeExistsError):
                    known.add(op.path)
            log.info("controller %s: %s; writing again after looking the paths up", self._id, exc)
            writer.upsert(items, known)
            if deletes:
                writer.delete_if_present(deletes)
        else:
            known.update(p for p, _ in items)
        known.difference_update(deletes)

    def _arm_sync_watch(self, g: str, generation: int) -> Any:
        """Send the ``exists`` that arms the watch on this generation's proposal, without waiting for it."""
        return self._zk.exists_async(
            self._layout.group_sync(g, generation),
            watch=self._host.watch(lambda t: ev.SyncProposalReady(t, g, generation)),
        )

    def _watch_sync(self, g: str, generation: int) -> None:
        """Watch for the leader's proposal of this generation (and read it now if it is already there)."""
        if self._arm_sync_watch(g, generation).get() is not None:
            self._host.put(ev.SyncProposalReady(self._host.token, g, generation))

    def _cleanup_generations(self, g: str, below: int, lookup: list[str]) -> None:
        """Delete what ``_apply`` could not delete blind: proposals of abandoned generations, which may never
        have been written, and, once per group and activation, the join results and proposals below ``below``
        that an earlier controller left behind (two listings, pipelined). One look-up, one multi; nothing
        when there is nothing unknown (the common case: every generation this controller saw completed)."""
        ctx, lay = context_of(self._host), self._layout
        old = list(lookup)
        listed: set[str] = set()
        if g not in ctx.swept_generations:
            ctx.swept_generations.add(g)
            parents = [(lay.group_joins(g), lay.group_join), (lay.group_syncs(g), lay.group_sync)]
            for (_parent, make), names in zip(parents, children_many(self._zk, [p for p, _ in parents])):
                listed.update(make(g, int(n)) for n in names or () if n.isdigit() and int(n) < below)
            old += sorted(listed - set(old))
        writer = self._host.writer
        if old and writer is not None:
            ctx.known_paths.difference_update(old)
            self._host.write(lambda: writer.delete_if_present(old, present=listed))

    def on_groups_change(self, token: int) -> None:
        if not self._host.current(token):
            return
        lay = self._layout
        listed = self._zk.get_children(lay.groups, watch=self._host.watch(ev.GroupsChange))
        for g in legal_children(self._host, lay, lay.groups, listed):
            if g not in context_of(self._host).groups:
                self.coordinator(g)

    def on_members_change(self, token: int, group: str) -> None:
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        coord = self.coordinator(group)
        try:
            parent = lay.group_members(group)
            children = set(
                legal_children(self._host, lay, parent, self._zk.get_children(parent, watch=self._members_watch(group)))
            )
        except NoNodeError:
            children = set()
        current = ctx.members.setdefault(group, {})
        invalid = {m for (g, m) in ctx.invalid_members if g == group} | {
            m for (g, m) in ctx.ghost_members if g == group
        }
        new = sorted(children - current.keys() - invalid)
        for m, res in zip(new, get_many(self._zk, [lay.group_member(group, m) for m in new], watch=self.member_watch)):
            if res is not None:
                self._set_member(ctx, group, m, res[0], res[1])
        for m in sorted(current.keys() - children):
            if current[m].leaving:
                ctx.clean_exits.add(m)  # a controlled shutdown: not a broker lost
            current.pop(m, None)
            ctx.member_sessions.pop((group, m), None)
        for key in [k for k in ctx.invalid_members if k[0] == group and k[1] not in children]:
            del ctx.invalid_members[key]
        for key in [k for k in ctx.ghost_members if k[0] == group and k[1] not in children]:
            del ctx.ghost_members[key]
        self.apply(group, coord.on_members(self.placeable(group)))
        self._refuse_and_show(group, coord, new)

    def on_member_changes(self, token: int, group: str, members: tuple[str, ...]) -> None:
        """Members rewrote their join requests or left: one pipelined re-read, one coordinator step."""
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        current = ctx.members.setdefault(group, {})
        ids = sorted(members)
        bounced = []
        for m, res in zip(ids, get_many(self._zk, [lay.group_member(group, m) for m in ids], watch=self.member_watch)):
            if res is None:
                if m in current and current[m].leaving:
                    ctx.clean_exits.add(m)
                current.pop(m, None)
                ctx.invalid_members.pop((group, m), None)
                ctx.ghost_members.pop((group, m), None)
                ctx.member_sessions.pop((group, m), None)
            elif self._set_member(ctx, group, m, res[0], res[1]):
                bounced.append(m)
        coord = self.coordinator(group)
        if coord.reconcile.active():
            self._check_taken(group, coord, [m for m in ids if m not in bounced])
        if bounced:  # a restart the watches saw as one change: first the departure, then the new member
            snapshot = {m: r for m, r in self.placeable(group).items() if m not in bounced}
            self.apply(group, coord.on_members(snapshot))
        self.apply(group, coord.on_members(self.placeable(group)))
        self._refuse_and_show(group, coord, ids)

    def placeable(self, group: str) -> dict[str, JoinRequest]:
        """The group's members the coordinator sees: those whose broker's session is ready (``readiness``)."""
        ctx = context_of(self._host)
        return placeable(ctx.members.get(group, {}), ctx.unready_brokers())

    def on_readiness(self, brokers: Sequence[str]) -> None:
        """Brokers' sessions became ready (or stopped being): the groups they are members of see their members
        again, so a member that waited for its session joins the next generation."""
        ctx = context_of(self._host)
        for g in sorted(ctx.members):
            if any(b in ctx.members[g] for b in brokers) and g in ctx.groups:
                self.apply(g, ctx.groups[g].on_members(self.placeable(g)))

    def _check_taken(self, group: str, coord: GroupCoordinator, read: list[str]) -> None:
        """ZooKeeper's word on an acknowledgement: the tasks a member's report says it took (and the coordinator
        waits for) must have an owner znode held by the member's session. One multiRead of their owner znodes
        per report (a request per 1,000 tasks, not one per task). A report that says otherwise is refused like one out of
        bounds: the member's last good request stands, and it is answered (it writes its request again)."""
        ctx = context_of(self._host)
        current = ctx.members.get(group, {})
        checks = [(m, t) for m in read if m in current for t in coord.reconcile.acks.newly_taken(m, current[m])]
        if not checks:
            return
        for (_g, m), ts in sorted(self._not_held([(group, m, t) for m, t in checks]).items()):
            why = not_held_reason(ts)
            log.warning("group %s: refusing the report of %s: %s", group, m, why)
            if m in coord.members:
                current[m] = coord.members[m]
            else:
                current.pop(m, None)
            ctx.invalid_members[(group, m)] = why
            self.apply(group, coord.contradicted(m, why))  # refused again and again: a back-off

    def check_loaded_reports(
        self, states: Mapping[str, GroupStateInfo | None], assignments: Mapping[str, Mapping[str, Assignment]]
    ) -> dict[str, list[str]]:
        """A failover loads the members' reports as it finds them, acknowledgements included, and no live
        check (``_check_taken``) saw one rewritten while no controller was active. So ZooKeeper is asked here
        too, in one multiRead for every reconciling group: a task that a report says taken (owned, not
        pending) and that its published assignment places with the member must have an owner znode held by
        the member's session. Each one that has not is counted pending (not running: the group is not Stable
        on it, and after the rebalance timeout the member is fenced from it), and the member is to be
        answered (``answer_refused``): it writes its report again. Returns the members to answer, by group."""
        ctx = context_of(self._host)
        checks: list[tuple[str, str, str]] = []
        for g, st in sorted(states.items()):
            if st is None or st.protocol != RECONCILE:
                continue
            for m, req in sorted(ctx.members.get(g, {}).items()):
                if not req.acknowledges:
                    continue  # a broker of an earlier release: its report is no acknowledgement
                a = assignments.get(g, {}).get(m)
                placed = set(a.assigned) if a is not None and a.error is None else set()
                checks += [(g, m, t) for t in sorted((set(req.owned) - set(req.pending)) & placed)]
        if not checks:
            return {}
        out: dict[str, list[str]] = {}
        for (g, m), ts in sorted(self._not_held(checks).items()):
            req = ctx.members[g][m]
            ctx.members[g][m] = replace(req, pending=tuple(sorted(set(req.pending) | set(ts))))
            why = not_held_reason(ts)
            log.warning("group %s: the report of %s loaded at failover is wrong: %s", g, m, why)
            ctx.invalid_members[(g, m)] = why
            out.setdefault(g, []).append(m)
        return out

    def stand_in_refused(
        self, states: Mapping[str, GroupStateInfo | None], assignments: Mapping[str, Mapping[str, Assignment]]
    ) -> dict[str, list[str]]:
        """A failover finds a live member of a reconciling group whose request it refuses (garbage, or out of
        bounds): the live path would keep its last good request, but a new controller has none. Left out, the
        member's tasks would be placed elsewhere while it still runs them (their owner znodes keep the next
        member waiting: no overlap, but tasks down until the member is stopped). So it is stood in for: what
        its published assignment gives or revokes and whose owner znode its session holds (ZooKeeper's word,
        one multiRead) counts as held, it acknowledged nothing (the group is not Stable on it), and it is to
        be answered (``answer_refused``). Returns the members stood in for, by group."""
        ctx = context_of(self._host)
        candidates: list[tuple[str, str, Assignment]] = []
        for g, m in sorted(ctx.invalid_members):
            st, a = states.get(g), assignments.get(g, {}).get(m)
            if st is None or st.protocol != RECONCILE or m in ctx.members.get(g, {}) or (g, m) in ctx.ghost_members:
                continue
            if a is None or a.error is not None or a.protocol != RECONCILE or not (a.assigned or a.revoked):
                continue
            candidates.append((g, m, a))
        checks = [(g, m, t) for g, m, a in candidates for t in sorted(set(a.assigned) | set(a.revoked))]
        if not checks:
            return {}
        not_held = self._not_held(checks)
        out: dict[str, list[str]] = {}
        for g, m, a in candidates:
            held = sorted((set(a.assigned) | set(a.revoked)) - set(not_held.get((g, m), ())))
            if not held:
                continue  # it runs nothing of what it was given: nothing to keep from anyone
            ctx.members.setdefault(g, {})[m] = JoinRequest(
                member_id=m,
                join_generation=-1,
                generation=-1,
                protocols=(RECONCILE,),
                assignors=(),
                owned=tuple(held),
                incarnation=a.incarnation,
                acknowledges=True,  # (owed, not trusted: nothing it says was read)
            )
            log.warning(
                "group %s: the request of %s is refused at failover; it stands for the %d task(s) its session holds",
                g,
                m,
                len(held),
            )
            out.setdefault(g, []).append(m)
        return out

    def _not_held(self, checks: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
        """(group, member) -> the tasks of ``checks`` (group, member, task) whose owner znode the member's
        session does not hold: ZooKeeper's word on what reports say was taken, in one multiRead."""
        ctx, lay = context_of(self._host), self._layout
        wrong: dict[tuple[str, str], list[str]] = {}
        for (g, m, t), res in zip(checks, multi_read(self._zk, [lay.task_owner(t) for _, _, t in checks])):
            if res is None or res[1].ephemeralOwner != ctx.member_sessions.get((g, m)):
                wrong.setdefault((g, m), []).append(t)
        return wrong

    def answer_refused(self, group: str, members: list[str]) -> None:
        """Members whose loaded report was found wrong are answered, as on the live path."""
        self._refuse_and_show(group, self.coordinator(group), members)

    def _refuse_and_show(self, group: str, coord: GroupCoordinator, read: list[str]) -> None:
        """Members just read whose request was refused are answered (they rewrite it); the member znodes set
        apart are shown with the group state (status, ``watch``) and counted (``zkc_controller_ignored_members``)."""
        ctx = context_of(self._host)
        for m in read:
            why = ctx.invalid_members.get((group, m))
            if why is not None and m in ctx.members.get(group, {}):
                self.apply(group, coord.refuse_report(m, why, ctx.members[group][m]))
        ignored = ignored_members(ctx, group)
        self._metrics.ignored_members.labels(group).set(len(ignored))
        self.apply(group, coord.set_ignored(ignored))

    def on_sync_proposal(self, token: int, group: str, generation: int) -> None:
        if not self._host.current(token):
            return
        coord = self.coordinator(group)
        if coord.generation != generation:
            return
        path = self._layout.group_sync(group, generation)
        try:
            data, _ = self._zk.get(path, watch=self._host.watch(lambda t: ev.SyncProposalReady(t, group, generation)))
        except NoNodeError:
            # not written yet (a held re-read after a connection loss): the watch must be armed again
            self._watch_sync(group, generation)
            return
        try:
            proposal = codecs.decode(group_messages.SyncProposal, data, path)
        except PayloadError as exc:
            log.warning("group %s: unreadable proposal; waiting for a rewrite or the sync timeout: %s", group, exc)
            return
        self._operations.refresh_room(group)
        self.apply(group, coord.on_proposal(proposal))

    def on_tick(self) -> None:
        """A protocol deadline passed: every coordinator looks at its timers."""
        for g, coord in sorted(context_of(self._host).groups.items()):
            self.apply(g, coord.on_tick())
