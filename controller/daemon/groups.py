"""Groups: one sans-IO ``GroupCoordinator`` per group, fed with member, proposal and timer events;
its decisions (group state, join results, assignments, sync watches, old generations) written as
fenced multis."""

from __future__ import annotations

import logging
from typing import Any, Callable

from kazoo.exceptions import (
    NodeExistsError,
    NoNodeError,
)

from controller.protocol import codecs

from controller.zk import io as zkio
from controller.daemon import events as ev
from controller.protocol.codecs import (
    JoinRequest,
    PayloadError,
)
from controller.daemon.context import ControllerContext
from controller.protocol.group import (
    DeleteGenerationsBelow,
    GroupCoordinator,
    WatchMoves,
    WatchSync,
    WriteAssignments,
    WriteGroupState,
    WriteJoinResult,
)
from controller.zk.io import WriteFailed, children_many, get_many

log = logging.getLogger(__name__)


class Groups:
    """Member and proposal handlers, and carrying out the coordinators' decisions."""

    def _new_coordinator(self, g: str) -> GroupCoordinator:
        assert self.ctx is not None and self.epoch is not None
        coord = GroupCoordinator(group=g, controller_epoch=self.epoch, clock=self.clock, config=self.config.group)
        self.ctx.groups[g] = coord
        self._configure(g, coord)
        self.ctx.members.setdefault(g, {})
        return coord

    def _coordinator(self, g: str) -> GroupCoordinator:
        assert self.ctx is not None
        coord = self.ctx.groups.get(g)
        if coord is None:
            self._ensure_group_paths(g)
            coord = self._new_coordinator(g)
            coord.on_tasks(self.ctx.group_tasks(g))
            self.zk.get_children(self.layout.group_members(g), watch=self._watch(lambda t: ev.MembersChange(t, g)))
            self.put(ev.MembersChange(self.token, g))
        return coord

    def _member_watch(self, path: str) -> Callable[[Any], None]:
        parts = path.split("/")
        g, m = parts[-3], parts[-1]
        return self._watch(lambda t: ev.MemberChange(t, g, m))

    def _set_member(self, ctx: ControllerContext, g: str, m: str, data: bytes, stat: Any = None) -> bool:
        """Record a member's join request; True if it comes from a new session (the member restarted,
        even if its request is byte-identical to the old one: the coordinator must see it leave and join)."""
        path = self.layout.group_member(g, m)
        bounced = False
        if stat is not None:
            previous = ctx.member_sessions.get((g, m))
            bounced = previous is not None and previous != stat.ephemeralOwner
            ctx.member_sessions[(g, m)] = stat.ephemeralOwner
        try:
            req = codecs.decode(JoinRequest, data, path)
            if req.member_id != m:
                raise PayloadError(path, f"member_id {req.member_id!r} does not match the znode name")
            ctx.members.setdefault(g, {})[m] = req
            ctx.invalid_members.pop((g, m), None)
        except PayloadError as exc:
            log.warning("ignoring member: %s", exc)
            ctx.members.setdefault(g, {}).pop(m, None)
            ctx.invalid_members[(g, m)] = str(exc)
        return bounced

    # ---- carrying out decisions -------------------------------------------------------------------
    def _write(self, fn: Callable[[], Any]) -> Any:
        if self.before_write is not None:
            self.before_write()
        return fn()

    def _apply(self, g: str, decisions: list[Any]) -> None:
        """One event's decisions for a group become one ordered, fenced, batched write.

        What the members wait for (assignments, join result, group state) goes out at once, with no look-up
        first (see ``_write_items``). The watch on the leader's proposal is armed by a request sent just ahead
        of that write, so it costs no round trip of its own. Old generations' join results and proposals
        known to exist are deleted in the same multi as the assignments that make them obsolete; only
        housekeeping that needs a look-up runs after the write (``_cleanup_generations``).
        """
        if not decisions or self.writer is None or self.ctx is None:
            return
        lay = self.layout
        items: list[tuple[str, bytes]] = []
        watches: list[int] = []
        cleanup_below: int | None = None
        moves: tuple[str, ...] = ()
        generations = self.ctx.generation_paths.setdefault(g, {})
        for d in decisions:
            if isinstance(d, WriteAssignments):
                items += [(lay.group_assignment(g, m), codecs.encode(a)) for m, a in d.assignments]
            elif isinstance(d, WriteJoinResult):
                items.append((lay.group_join(g, d.result.generation), codecs.encode(d.result)))
                generations[lay.group_join(g, d.result.generation)] = d.result.generation
            elif isinstance(d, WriteGroupState):
                items.append((lay.group_state(g), codecs.encode(d.info)))
                if d.info.state == "PreparingRebalance":
                    self.metrics.rebalances.labels(g).inc()
                self.metrics.moving.labels(g).set(len(d.info.moving))
                self.metrics.deferred.labels(g).set(d.info.deferred)
                if d.info.imbalance is not None:
                    self.metrics.imbalance.labels(g).set(d.info.imbalance)
            elif isinstance(d, WatchMoves):
                moves = d.tasks
            elif isinstance(d, WatchSync):
                watches.append(d.generation)
                generations[lay.group_sync(g, d.generation)] = d.generation
            elif isinstance(d, DeleteGenerationsBelow):
                cleanup_below = d.generation
                # emitted with the assignments of a generation whose proposal was just read: it exists
                self.ctx.known_paths.add(lay.group_sync(g, d.generation))
        deletes: list[str] = []
        lookup: list[str] = []
        if cleanup_below is not None:
            old = sorted(p for p, gen in generations.items() if gen < cleanup_below)
            for p in old:
                del generations[p]
                (deletes if p in self.ctx.known_paths else lookup).append(p)
        armed = [(gen, self._arm_sync_watch(g, gen)) for gen in watches]
        before = self.writer.requests
        self._hand_over(decisions)  # per-broker identities: the new assignee's rights precede its assignment
        self._write(lambda: self._write_items(items, deletes))
        self.metrics.zk_writes.inc(self.writer.requests - before)
        for gen, pending in armed:
            if pending.get() is not None:
                self.put(ev.SyncProposalReady(self.token, g, gen))
        if cleanup_below is not None:
            self._cleanup_generations(g, cleanup_below, lookup)
        if moves:
            self._watch_moves(g, moves)

    def _write_items(self, items: list[tuple[str, bytes]], deletes: list[str]) -> None:
        """Write ``(path, data)`` items and delete ``deletes`` in fenced multis, without looking anything up
        first: a path in ``known_paths`` is set, any other is created. The controller's unknown paths are
        new ones (each generation's join result, a new member's assignment), so ``upsert``'s pipelined
        ``exists`` before every write that creates one was a round trip on the way to the members. Should
        ZooKeeper disagree (a znode created or deleted behind the controller's back), the items are written
        again through ``upsert``, which looks them up, and the deletes go through ``delete_if_present``.
        A rewrite of an item already written is harmless: the same bytes, the watchers read them again."""
        known = self.ctx.known_paths
        last = {p: d for p, d in items}  # a path written twice in one batch: once, its last value, first place
        items = [(p, last.pop(p)) for p, _ in items if p in last]
        ops: list[Any] = [zkio.SetData(p, d) if p in known else zkio.Create(p, d) for p, d in items]
        ops += [zkio.Delete(p) for p in deletes]
        try:
            self.writer.write(ops)
        except WriteFailed as exc:
            for op, err in exc.failures:
                if isinstance(err, NoNodeError):
                    known.discard(op.path)
                elif isinstance(err, NodeExistsError):
                    known.add(op.path)
            log.info("controller %s: %s; writing again after looking the paths up", self.id, exc)
            self.writer.upsert(items, known)
            if deletes:
                self.writer.delete_if_present(deletes)
        else:
            known.update(p for p, _ in items)
        known.difference_update(deletes)

    def _arm_sync_watch(self, g: str, generation: int) -> Any:
        """Send the ``exists`` that arms the watch on this generation's proposal, without waiting for it."""
        return self.zk.exists_async(self.layout.group_sync(g, generation),
                                    watch=self._watch(lambda t: ev.SyncProposalReady(t, g, generation)))

    def _watch_sync(self, g: str, generation: int) -> None:
        """Watch for the leader's proposal of this generation (and read it now if it is already there)."""
        if self._arm_sync_watch(g, generation).get() is not None:
            self.put(ev.SyncProposalReady(self.token, g, generation))

    def _cleanup_generations(self, g: str, below: int, lookup: list[str]) -> None:
        """Delete what ``_apply`` could not delete blind: proposals of abandoned generations, which may never
        have been written, and, once per group and activation, the join results and proposals below ``below``
        that an earlier controller left behind (two listings, pipelined). One look-up, one multi; nothing
        when there is nothing unknown (the common case: every generation this controller saw completed)."""
        ctx, lay = self.ctx, self.layout
        old = list(lookup)
        listed: set[str] = set()
        if g not in ctx.swept_generations:
            ctx.swept_generations.add(g)
            parents = [(lay.group_joins(g), lay.group_join), (lay.group_syncs(g), lay.group_sync)]
            for (_parent, make), names in zip(parents, children_many(self.zk, [p for p, _ in parents])):
                listed.update(make(g, int(n)) for n in names or () if n.isdigit() and int(n) < below)
            old += sorted(listed - set(old))
        if old and self.writer is not None:
            ctx.known_paths.difference_update(old)
            self._write(lambda: self.writer.delete_if_present(old, present=listed))

    def on_groups_change(self, token: int) -> None:
        if not self._current(token):
            return
        for g in self.zk.get_children(self.layout.groups, watch=self._watch(ev.GroupsChange)):
            if g not in self.ctx.groups:
                self._coordinator(g)

    def on_members_change(self, token: int, group: str) -> None:
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        coord = self._coordinator(group)
        try:
            children = set(self.zk.get_children(lay.group_members(group), watch=self._watch(lambda t: ev.MembersChange(t, group))))
        except NoNodeError:
            children = set()
        current = ctx.members.setdefault(group, {})
        invalid = {m for (g, m) in ctx.invalid_members if g == group}
        new = sorted(children - current.keys() - invalid)
        for m, res in zip(new, get_many(self.zk, [lay.group_member(group, m) for m in new], watch=self._member_watch)):
            if res is not None:
                self._set_member(ctx, group, m, res[0], res[1])
        for m in sorted(current.keys() - children):
            if current[m].leaving:
                ctx.clean_exits.add(m)  # a controlled shutdown: not a broker lost
            current.pop(m, None)
            ctx.member_sessions.pop((group, m), None)
        for key in [k for k in ctx.invalid_members if k[0] == group and k[1] not in children]:
            del ctx.invalid_members[key]
        self._apply(group, coord.on_members(dict(current)))

    def on_member_changes(self, token: int, group: str, members: tuple[str, ...]) -> None:
        """Members rewrote their join requests or left: one pipelined re-read, one coordinator step."""
        if not self._current(token):
            return
        ctx, lay = self.ctx, self.layout
        current = ctx.members.setdefault(group, {})
        ids = sorted(members)
        bounced = []
        for m, res in zip(ids, get_many(self.zk, [lay.group_member(group, m) for m in ids], watch=self._member_watch)):
            if res is None:
                if m in current and current[m].leaving:
                    ctx.clean_exits.add(m)
                current.pop(m, None)
                ctx.invalid_members.pop((group, m), None)
                ctx.member_sessions.pop((group, m), None)
            elif self._set_member(ctx, group, m, res[0], res[1]):
                bounced.append(m)
        coord = self._coordinator(group)
        if bounced:  # a restart the watches saw as one change: first the departure, then the new member
            snapshot = {m: r for m, r in ctx.members.get(group, {}).items() if m not in bounced}
            self._apply(group, coord.on_members(snapshot))
        self._apply(group, coord.on_members(dict(ctx.members.get(group, {}))))

    def on_sync_proposal(self, token: int, group: str, generation: int) -> None:
        if not self._current(token):
            return
        coord = self._coordinator(group)
        if coord.generation != generation:
            return
        path = self.layout.group_sync(group, generation)
        try:
            data, _ = self.zk.get(path, watch=self._watch(lambda t: ev.SyncProposalReady(t, group, generation)))
        except NoNodeError:
            # not written yet (a held re-read after a connection loss): the watch must be armed again
            self._watch_sync(group, generation)
            return
        try:
            proposal = codecs.decode(codecs.SyncProposal, data, path)
        except PayloadError as exc:
            log.warning("group %s: unreadable proposal; waiting for a rewrite or the sync timeout: %s", group, exc)
            return
        self._refresh_room(group)
        self._apply(group, coord.on_proposal(proposal))

    def on_tick(self) -> None:
        if not self.active or self.ctx is None:
            return
        for g, coord in sorted(self.ctx.groups.items()):
            self._apply(g, coord.on_tick())
        self._flush_deletions()
