"""Cluster operations: status at a glance, brokers, groups, manual rebalance, controlled shutdown, and
the live watch."""

from __future__ import annotations

import queue
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from kazoo.client import KazooClient

from controller.admin.common import NotFound, Progress, file_request, wait_watched
from controller.admin.reads import ClusterReads, broker_view, decode_read, group_summary
from controller.admin.views import (
    AdminRequest,
    BrokerView,
    ClusterEvent,
    ClusterStatus,
    GroupDescription,
    MemberView,
    stale_after,
    unassigned_since,
)
from controller.admin.watch import ClusterWatch
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs, group_messages, registration_records, task_records
from controller.protocol.records.admin_records import MaintenanceInfo
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.protocol.tasks.summary import summary_age, trusted


class ClusterAdmin:
    """The cluster part of ``AdminClient``: what the cluster looks like, and the requests that move it."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, reads: ClusterReads, maintenance: Callable[[], MaintenanceInfo]
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        self.maintenance = maintenance  # the maintenance mode in force (a rebalance says it moves nothing)

    # ---- cluster ----------------------------------------------------------------------------------
    def status(self, full: bool = False) -> ClusterStatus:
        """The cluster at a glance. The task counts come from the active controller's summary
        (``/cluster_summary``: O(brokers + groups) reads) unless ``full``, or there is no controller, or the
        summary is of another epoch or older than ``summary.MAX_AGE_S``: then every task's spec, owner and
        status are read (O(tasks)), and ``fallback`` says why."""
        lay = self.layout
        (ctl_res, epoch_res, maint_res, sum_res), (brokers, groups, deleting, shutdowns, reassigns, rebalances) = (
            self.reads.wave(
                [lay.controller, lay.controller_epoch, lay.maintenance, lay.cluster_summary],
                [
                    lay.broker_ids,
                    lay.groups,
                    lay.admin_delete_tasks,
                    lay.admin_controlled_shutdown,
                    lay.admin_reassign,
                    lay.admin_rebalance,
                ],
            )
        )
        brokers, groups = brokers or [], groups or []
        controller, _ = decode_read(registration_records.ControllerInfo, ctl_res, lay.controller)
        maintenance, _ = (
            decode_read(admin_records.MaintenanceInfo, maint_res, lay.maintenance)
            if maint_res and maint_res[0]
            else (None, None)
        )
        epoch = None
        if epoch_res is not None:
            try:
                epoch = codecs.decode_epoch(epoch_res[0], lay.controller_epoch)
            except PayloadError:
                epoch = None
        if controller is not None and (epoch is None or controller.epoch > epoch):
            # a controller between winning /controller and bumping /controller_epoch (two writes): it runs
            # at the epoch it claimed, or gives /controller up if the bump fails
            epoch = controller.epoch
        fallback = "asked for" if full else None
        if not full:
            summary, fallback = self._summary(sum_res, controller, epoch)
            if summary is not None:
                return self._from_summary(
                    summary, controller, epoch, maintenance, brokers, groups, deleting, shutdowns, reassigns, rebalances
                )
        tasks = self.reads.task_ids()
        n = len(tasks)
        got, kids = self.reads.wave(
            [lay.task(t) for t in tasks]
            + [lay.task_owner(t) for t in tasks]
            + [lay.status(t) for t in tasks]
            + [lay.broker(b) for b in brokers]
            + [lay.group_state(g) for g in groups],
            [lay.group_members(g) for g in groups],
        )
        spec_res, owner_res, status_res = got[:n], got[n : 2 * n], got[2 * n : 3 * n]
        broker_res, state_res = got[3 * n : 3 * n + len(brokers)], got[3 * n + len(brokers) :]
        by_state: Counter[str] = Counter()
        by_status: Counter[str] = Counter()
        owned_by: Counter[str] = Counter()
        invalid = unowned = 0
        oldest: float | None = None
        for t, s, o, st in zip(tasks, spec_res, owner_res, status_res):
            if s is None:
                continue
            try:
                spec = decode_task(s[0], lay.task(t))
                by_state[spec.state] += 1
            except PayloadError:
                invalid += 1
                spec = None
            owner, _ = decode_read(task_records.OwnerInfo, o, lay.task_owner(t))
            status, _ = decode_read(task_records.TaskStatus, st, lay.status(t))
            if owner is not None:
                owned_by[owner.broker] += 1
            elif spec is not None:
                since = unassigned_since(
                    spec.state, False, status, s[1].ctime / 1000.0, st[1].mtime / 1000.0 if st else None
                )
                if since is not None:
                    unowned += 1
                    oldest = since if oldest is None else min(oldest, since)
            if status is not None:
                by_status[
                    "STALE" if stale_after(status, owner, o[1].ephemeralOwner if o else None) else status.state
                ] += 1
        shutting = set(shutdowns or ())
        views = tuple(
            broker_view(lay, b, r, owned_by[b], b in shutting) for b, r in zip(brokers, broker_res) if r is not None
        )
        summaries = tuple(group_summary(lay, g, r, m) for g, r, m in zip(groups, state_res, kids))
        return ClusterStatus(
            root=lay.root,
            controller=codecs.to_jsonable(controller) if controller else None,
            controller_epoch=epoch,
            brokers=views,
            groups=summaries,
            tasks={
                "total": sum(1 for s in spec_res if s is not None),
                "by_state": dict(sorted(by_state.items())),
                "by_status": dict(sorted(by_status.items())),
                "unowned": unowned,
                "unassigned_oldest": oldest,
                "invalid": invalid,
                "deleting": len(deleting or ()),
            },
            maintenance=codecs.to_jsonable(maintenance) if maintenance else None,
            pending={
                "delete_tasks": len(deleting or ()),
                "controlled_shutdown": len(shutting),
                "reassign": len(reassigns or ()),
                "rebalance": len(rebalances or ()),
            },
            source="full",
            fallback=fallback,
        )

    def _summary(
        self, res: tuple[bytes, Any] | None, controller: registration_records.ControllerInfo | None, epoch: int | None
    ) -> tuple[admin_records.ClusterSummary | None, str]:
        """The controller's summary if it can stand for the full read, else why not."""
        if controller is None:
            return None, "no active controller"
        if res is None or not res[0]:
            return None, "the controller has written no summary yet"
        try:
            summary = codecs.decode(admin_records.ClusterSummary, res[0], self.layout.cluster_summary)
        except PayloadError as exc:
            return None, f"the summary is unreadable ({exc})"
        why = trusted(summary, epoch, time.time())
        return (None, why) if why else (summary, "")

    def _from_summary(
        self,
        summary: admin_records.ClusterSummary,
        controller: registration_records.ControllerInfo | None,
        epoch: int | None,
        maintenance: MaintenanceInfo | None,
        brokers: list[str] | None,
        groups: list[str] | None,
        deleting: list[str] | None,
        shutdowns: list[str] | None,
        reassigns: list[str] | None,
        rebalances: list[str] | None,
    ) -> ClusterStatus:
        """``status`` from the summary: the brokers' and groups' znodes are read, no task's."""
        lay = self.layout
        brokers, groups = brokers or [], groups or []
        got, kids = self.reads.wave(
            [lay.broker(b) for b in brokers] + [lay.group_state(g) for g in groups],
            [lay.group_members(g) for g in groups],
        )
        broker_res, state_res = got[: len(brokers)], got[len(brokers) :]
        shutting = set(shutdowns or ())
        views = tuple(
            broker_view(lay, b, r, summary.by_broker.get(b, 0), b in shutting)
            for b, r in zip(brokers, broker_res)
            if r is not None
        )
        return ClusterStatus(
            root=lay.root,
            controller=codecs.to_jsonable(controller) if controller else None,
            controller_epoch=epoch,
            brokers=views,
            groups=tuple(group_summary(lay, g, r, m) for g, r, m in zip(groups, state_res, kids)),
            tasks={
                "total": summary.total,
                "by_state": dict(summary.by_state),
                "by_status": None,  # the workers' reports: read by the full status only
                "unowned": summary.unassigned,
                "unassigned_oldest": None,
                "invalid": summary.invalid,
                "deleting": summary.deleting,
                "by_group": {c.group: codecs.to_jsonable(c) for c in summary.groups},
            },
            maintenance=codecs.to_jsonable(maintenance) if maintenance else None,
            pending={
                "delete_tasks": len(deleting or ()),
                "controlled_shutdown": len(shutting),
                "reassign": len(reassigns or ()),
                "rebalance": len(rebalances or ()),
            },
            source="summary",
            summary_age=summary_age(summary, time.time()),
        )

    def brokers(self) -> list[BrokerView]:
        lay = self.layout
        _, (ids, shutdowns) = self.reads.wave(children=[lay.broker_ids, lay.admin_controlled_shutdown])
        ids, tasks = ids or [], self.reads.task_ids()
        got, _ = self.reads.wave([lay.broker(b) for b in ids] + [lay.task_owner(t) for t in tasks])
        owned_by: Counter[str] = Counter()
        for t, o in zip(tasks, got[len(ids) :]):
            owner, _ = decode_read(task_records.OwnerInfo, o, lay.task_owner(t))
            if owner is not None:
                owned_by[owner.broker] += 1
        shutting = set(shutdowns or ()) | self._leaving(ids, got[: len(ids)])
        return [
            broker_view(lay, b, r, owned_by[b], b in shutting) for b, r in zip(ids, got[: len(ids)]) if r is not None
        ]

    def _leaving(self, ids: list[str], registrations: list[Any]) -> set[str]:
        """The brokers whose join request says they are leaving (a broker stopping on SIGTERM says so there,
        not in an admin request), read in one wave."""
        lay = self.layout
        members: list[tuple[str, str]] = []
        for b, res in zip(ids, registrations):
            info, _ = (
                decode_read(registration_records.BrokerInfo, res, lay.broker(b)) if res is not None else (None, None)
            )
            if info is not None:  # (its group decoded as a legal name)
                members.append((b, lay.group_member(info.group, b)))
        got, _ = self.reads.wave([p for _, p in members])
        out = set()
        for (b, path), res in zip(members, got):
            request, _ = decode_read(group_messages.JoinRequest, res, path)
            if request is not None and request.leaving:
                out.add(b)
        return out

    def describe_group(self, group: str | None = None) -> list[GroupDescription]:
        """Each group (or the one named): its state, and per member the join request, the published
        assignment and the tasks it holds right now."""
        lay = self.layout
        _, (groups,) = self.reads.wave(children=[lay.groups])
        groups, tasks = groups or [], self.reads.task_ids()
        if group is not None:
            lay.group(group)  # InvalidName for a malformed name
            if group not in groups:
                raise NotFound(f"unknown group {group!r} (groups: {', '.join(groups) or 'none'})")
            groups = [group]
        n = len(tasks)
        got, kids = self.reads.wave(
            [lay.task_owner(t) for t in tasks] + [lay.task(t) for t in tasks] + [lay.group_state(g) for g in groups],
            [lay.group_members(g) for g in groups] + [lay.group_assignments(g) for g in groups],
        )
        owns: dict[str, list[str]] = {}
        runnable: Counter[str] = Counter()
        for t, o, s in zip(tasks, got[:n], got[n : 2 * n]):
            owner, _ = decode_read(task_records.OwnerInfo, o, lay.task_owner(t))
            if owner is not None:
                owns.setdefault(owner.broker, []).append(t)
            if s is not None:
                try:
                    spec = decode_task(s[0], lay.task(t))
                except PayloadError:
                    continue
                if spec.state == "RUNNING":
                    runnable[spec.group] += 1
        states = got[2 * n :]
        member_lists, assignment_lists = kids[: len(groups)], kids[len(groups) :]
        pairs = [(g, m, True) for g, ms in zip(groups, member_lists) for m in (ms or [])]
        pairs_a = [(g, m) for g, ms in zip(groups, assignment_lists) for m in (ms or [])]
        got2, _ = self.reads.wave(
            [lay.group_member(g, m) for g, m, _ in pairs] + [lay.group_assignment(g, m) for g, m in pairs_a]
        )
        requests = {(g, m): r for (g, m, _), r in zip(pairs, got2[: len(pairs)])}
        assignments = {(g, m): r for (g, m), r in zip(pairs_a, got2[len(pairs) :])}
        out = []
        for g, state_res, live in zip(groups, states, member_lists):
            summary = group_summary(lay, g, state_res, live)
            names = sorted(
                {m for (gg, m) in requests if gg == g}
                | {m for (gg, m) in assignments if gg == g}
                | set(summary.members)
            )
            members = []
            for m in names:
                req, req_err = decode_read(group_messages.JoinRequest, requests.get((g, m)), lay.group_member(g, m))
                asg, asg_err = decode_read(
                    group_messages.Assignment, assignments.get((g, m)), lay.group_assignment(g, m)
                )
                live_m = requests.get((g, m)) is not None
                if (
                    not live_m
                    and m not in summary.members
                    and (asg is None or asg.generation < (summary.generation or 0))
                ):
                    continue  # an old assignment of a member long gone
                members.append(
                    MemberView(
                        m,
                        live_m,
                        codecs.to_jsonable(req) if req else None,
                        codecs.to_jsonable(asg) if asg else None,
                        tuple(sorted(owns.get(m, ()))),
                        req_err or asg_err,
                    )
                )
            out.append(GroupDescription(summary, tuple(members), runnable[g]))
        return out

    # ---- admin requests ---------------------------------------------------------------------------
    def rebalance(
        self,
        group: str | None = None,
        reason: str = "manual",
        wait: float = 0.0,
        preferred: bool = False,
        progress: Progress | None = None,
    ) -> AdminRequest:
        """Ask for a rebalance of one group (or all): a sequential ``/admin/rebalance/req-`` znode.
        ``preferred``: towards the assignor's layout from scratch, in throttled waves."""
        lay = self.layout
        _, (groups,) = self.reads.wave(children=[lay.groups])
        groups = groups or []
        if group is not None:
            lay.group(group)
            if group not in groups:
                raise NotFound(f"unknown group {group!r} (groups: {', '.join(groups) or 'none'})")
        targets = [group] if group else groups
        before = {s.group: s for s in self.reads.group_summaries(targets)}
        path = self.client.create(
            lay.admin_rebalance_request_prefix,
            codecs.encode(admin_records.RebalanceRequest(group=group, reason=reason, preferred=preferred)),
            sequence=True,
            makepath=True,
        )
        notes = list(self.reads.controller_note())
        if self.maintenance().on:
            notes.append("maintenance mode is on: the rebalance moves nothing until it ends")
        busy = [g for g, s in before.items() if s.live_members]
        if not busy:
            notes.append("no group has live members: nothing to rebalance")
        done = None
        if wait > 0:

            def settled(_w: Callable[[Any], None]) -> tuple[int, int]:
                now = {s.group: s for s in self.reads.group_summaries(busy)}
                return sum(
                    1
                    for g in busy
                    if now[g].state == "Stable"
                    and not now[g].moving
                    and not now[g].deferred
                    and (now[g].generation or 0) > (before[g].generation or 0)
                ), len(busy)

            done = wait_watched(settled, wait, progress=progress)
        return AdminRequest("rebalance", group, path, False, done, tuple(notes))

    def shutdown_broker(self, broker_id: str, wait: float = 0.0, progress: Progress | None = None) -> AdminRequest:
        """Controlled shutdown: the controller moves the broker's tasks away; the broker exits when it owns
        nothing. ``wait`` waits (bounded) until it holds no task or is gone."""
        lay = self.layout
        if self.client.exists(lay.broker(broker_id)) is None:
            live = self.reads.live_brokers()
            raise NotFound(f"unknown broker {broker_id!r} (live brokers: {', '.join(live) or 'none'})")
        path = lay.admin_controlled_shutdown_of(broker_id)
        already = file_request(
            self.client, path, admin_records.ControlledShutdownRequest(broker=broker_id, requested=time.time())
        )
        done = None
        if wait > 0:
            held_at_first: list[int] = []

            def released(w: Callable[[Any], None]) -> tuple[int, int]:
                if self.client.exists(lay.broker(broker_id), watch=w) is None:
                    return (held_at_first or [1])[0], (held_at_first or [1])[0]
                tasks = self.reads.task_ids()
                held = sum(
                    1
                    for o in self.reads.owners(tasks).values()
                    if o is not None and o[0] is not None and o[0].broker == broker_id
                )
                if not held_at_first:
                    held_at_first.append(max(held, 1))
                total = max(held_at_first[0], held)
                return (total - held, total) if held else (total, total)

            done = wait_watched(released, wait, progress=progress)
        return AdminRequest("controlled_shutdown", broker_id, path, already, done, self.reads.controller_note())

    # ---- watch ------------------------------------------------------------------------------------
    def watch(
        self, duration: float | None = None, max_events: int | None = None, idle_s: float | None = None
    ) -> Iterator[ClusterEvent | None]:
        """Yield cluster events as ZooKeeper watches report them: controller changes, brokers joining,
        leaving or bouncing, group state/generation changes, tasks created/deleted/paused/resumed and task
        owner moves. The first event (kind ``watching``) summarises the state watched from. Bounded by
        ``duration`` seconds and ``max_events`` (the ``watching`` event not counted); None = unbounded.
        With ``idle_s``, yields None after that long without an event (a stream's keep-alive, which is
        also how a server notices a reader that went away)."""
        w = ClusterWatch(self.client, self.layout)
        deadline = None if duration is None else time.monotonic() + duration
        count = 0
        last = time.monotonic()
        try:
            yield w.start()
            while max_events is None or count < max_events:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    key = w.queue.get(timeout=0.5 if remaining is None else min(remaining, 0.5))
                except queue.Empty:
                    if idle_s is not None and time.monotonic() - last >= idle_s:
                        last = time.monotonic()
                        yield None
                    continue
                last = time.monotonic()
                keys = [key]
                while True:
                    try:
                        keys.append(w.queue.get_nowait())
                    except queue.Empty:
                        break
                for event in w.refresh(list(dict.fromkeys(keys))):
                    yield event
                    count += 1
                    if max_events is not None and count >= max_events:
                        return
        finally:
            w.close()
