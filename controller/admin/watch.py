"""The cluster watch behind ``zkctl watch``: watches on the controller, brokers, groups and tasks turned
into a stream of ``ClusterEvent`` (what changed, from what to what)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from controller.admin.common import WAIT_S
from controller.admin.reads import decode_read, group_summary
from controller.admin.views import ClusterEvent, GroupSummary
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.zk.layout_io import list_tasks


class ClusterWatch:
    """The state behind :meth:`AdminClient.watch`: one-shot ZooKeeper watches enqueue a key; the
    generator re-reads what the key names (pipelined, re-arming the watch) and reports the difference."""

    def __init__(self, client: KazooClient, layout: ZkLayout) -> None:
        self.client = client
        self.layout = layout
        self.queue: queue.Queue[tuple[str, ...]] = queue.Queue()
        self.closed = False
        self._watchers: dict[tuple[str, ...], Callable[[Any], None]] = {}
        self.controller: tuple[str, int] | None = None
        self.brokers: dict[str, int] = {}
        self.groups: dict[str, GroupSummary] = {}
        self.tasks: dict[str, str | None] = {}  # task -> spec state (None: invalid spec)
        self.owners: dict[str, str | None] = {}  # task -> owning broker
        self.maintenance: admin_records.MaintenanceInfo | None = None
        self.started = False

    def _w(self, *key: str) -> Callable[[Any], None]:
        fn = self._watchers.get(key)
        if fn is None:

            def fn(_event: Any, key: tuple[str, ...] = key) -> None:
                if not self.closed:
                    self.queue.put(key)

            self._watchers[key] = fn
        return fn

    def close(self) -> None:
        self.closed = True

    # reads that (re-)arm watches; NoNode arms an exists watch instead, to see the znode appear
    def _get_watched(self, items: Sequence[tuple[str, tuple[str, ...]]]) -> list[Any]:
        asyncs = [self.client.get_async(p, watch=self._w(*key)) for p, key in items]
        out, missing = [], []
        for (p, key), a in zip(items, asyncs):
            try:
                out.append(a.get(timeout=WAIT_S))
            except NoNodeError:
                out.append(None)
                missing.append((key, self.client.exists_async(p, watch=self._w(*key))))
        for key, a in missing:
            if a.get(timeout=WAIT_S) is not None:
                self.queue.put(key)  # created in between the two reads: read it again
        return out

    def _children_watched(self, path: str, key: tuple[str, ...]) -> list[str]:
        try:
            return self.layout.legal_children(path, self.client.get_children(path, watch=self._w(*key)))
        except NoNodeError:
            self.client.exists(path, watch=self._w(*key))
            return []

    def start(self) -> ClusterEvent:
        list(self.refresh([("controller",), ("maintenance",), ("brokers",), ("groups",), ("tasks",)]))
        self.started = True
        ctl = f"controller {self.controller[0]} (epoch {self.controller[1]})" if self.controller else "no controller"
        running = sum(1 for o in self.owners.values() if o)
        msg = (
            f"watching {self.layout.root}: {ctl}, {len(self.brokers)} brokers, {len(self.groups)} groups, "
            f"{len(self.tasks)} tasks ({running} owned)"
        )
        if self.maintenance is not None and self.maintenance.on:
            msg += f"; MAINTENANCE MODE ({self.maintenance.by}): {self.maintenance.reason}"
        return ClusterEvent(
            time.time(),
            "watching",
            self.layout.root,
            msg,
            {
                "maintenance": self.maintenance is not None and self.maintenance.on,
                "controller": self.controller[0] if self.controller else None,
                "epoch": self.controller[1] if self.controller else None,
                "brokers": dict(self.brokers),
                "groups": {g: s.state for g, s in self.groups.items()},
                "tasks": len(self.tasks),
                "owned": running,
            },
        )

    def refresh(self, keys: Sequence[tuple[str, ...]]) -> list[ClusterEvent]:
        events: list[ClusterEvent] = []
        for key in keys:
            if key == ("controller",):
                events += self._controller()
            elif key == ("maintenance",):
                events += self._maintenance()
        if ("brokers",) in keys:
            events += self._brokers(None)
        bkeys = [k[1] for k in keys if k[0] == "broker"]
        if bkeys:
            events += self._brokers(bkeys)
        # causal order: a task created (or deleted, or edited) makes its group rebalance, which gives the
        # task its owner. Owners are read before the groups and reported after them: an owner seen here was
        # created after the group state that handed it out, so the groups read next show that state even
        # when its watch has not fired yet (a listing of the buckets takes long enough for a whole rebalance)
        new: list[str] = []
        if ("tasks",) in keys:
            deleted, new = self._task_listing()
            events += deleted
        specs = list(dict.fromkeys(new + [k[1] for k in keys if k[0] == "task"]))
        if specs:
            events += self._tasks(specs, [])
        owners = list(dict.fromkeys(new + [k[1] for k in keys if k[0] == "owner"]))
        owner_events = self._tasks([], owners) if owners else []
        if ("groups",) in keys:
            events += self._groups(None)
        gkeys = {k[1] for k in keys if k[0] == "group"} | (set(self.groups) if owner_events else set())
        if gkeys:
            events += self._groups(sorted(gkeys))
        return events + owner_events

    def _ev(self, kind: str, subject: str, message: str, **detail: Any) -> ClusterEvent:
        return ClusterEvent(time.time(), kind, subject, message, detail)

    def _controller(self) -> list[ClusterEvent]:
        lay = self.layout
        (res,) = self._get_watched([(lay.controller, ("controller",))])
        info, _ = decode_read(registration_records.ControllerInfo, res, lay.controller)
        now = (info.controller_id, info.epoch) if info else None
        if now == self.controller:
            return []
        before, self.controller = self.controller, now
        if now is None:
            assert before is not None  # now differs from before
            return [
                self._ev(
                    "controller",
                    "-",
                    f"controller {before[0]} gone (epoch {before[1]}); electing",
                    controller=None,
                    previous=before[0],
                )
            ]
        return [
            self._ev(
                "controller",
                now[0],
                f"controller {now[0]} active at epoch {now[1]}",
                controller=now[0],
                epoch=now[1],
                previous=before[0] if before else None,
            )
        ]

    def _maintenance(self) -> list[ClusterEvent]:
        lay = self.layout
        (res,) = self._get_watched([(lay.maintenance, ("maintenance",))])
        info = None
        if res is not None and res[0]:
            info, _ = decode_read(admin_records.MaintenanceInfo, res, lay.maintenance)
        on = info is not None and info.on
        before, self.maintenance = self.maintenance, info
        if (before is not None and before.on) == on or (before is None and not on):
            return []
        what = (
            f"maintenance mode ON (by {info.by}): {info.reason}"
            if info is not None and on
            else ("maintenance mode off" + (f" ({info.reason})" if info is not None and info.reason else ""))
        )
        return [
            self._ev(
                "maintenance",
                lay.root,
                what,
                on=on,
                by=info.by if info else None,
                reason=info.reason if info else "",
                offline=list(info.offline) if info else [],
            )
        ]

    def _brokers(self, which: list[str] | None) -> list[ClusterEvent]:
        lay = self.layout
        events = []
        if which is None:
            ids = self._children_watched(lay.broker_ids, ("brokers",))
            for b in sorted(set(self.brokers) - set(ids)):
                del self.brokers[b]
                events.append(self._ev("broker_left", b, f"broker {b} left"))
            which = [b for b in ids if b not in self.brokers]
        got = self._get_watched([(lay.broker(b), ("broker", b)) for b in which])
        for b, res in zip(which, got):
            old = self.brokers.get(b)
            if res is None:
                if old is not None:
                    del self.brokers[b]
                    events.append(self._ev("broker_left", b, f"broker {b} left"))
                continue
            info, _ = decode_read(registration_records.BrokerInfo, res, lay.broker(b))
            epoch = res[1].czxid
            group = info.group if info else None
            if old is None:
                events.append(
                    self._ev(
                        "broker_joined",
                        b,
                        f"broker {b} joined (epoch {epoch}, group {group})",
                        epoch=epoch,
                        group=group,
                    )
                )
            elif old != epoch:
                events.append(
                    self._ev(
                        "broker_bounced",
                        b,
                        f"broker {b} bounced (epoch {old} -> {epoch})",
                        epoch=epoch,
                        previous_epoch=old,
                    )
                )
            self.brokers[b] = epoch
        return events

    def _groups(self, which: list[str] | None) -> list[ClusterEvent]:
        lay = self.layout
        if which is None:
            names = self._children_watched(lay.groups, ("groups",))
            which = [g for g in names if g not in self.groups]
        got = self._get_watched([(lay.group_state(g), ("group", g)) for g in which])
        events = []
        for g, res in zip(which, got):
            info, err = decode_read(group_messages.GroupStateInfo, res, lay.group_state(g))
            now = group_summary(lay, g, res, None) if res is not None else GroupSummary(g, None, error=err)
            old = self.groups.get(g)
            self.groups[g] = now
            if info is None:
                continue
            if old is not None and (old.state, old.generation, old.members, old.ignored, old.starting) == (
                now.state,
                now.generation,
                now.members,
                now.ignored,
                now.starting,
            ):
                continue
            was = f"{old.state} gen {old.generation}" if old is not None and old.state else "new"
            events.append(
                self._ev(
                    "group",
                    g,
                    f"group {g}: {was} -> {now.state} gen {now.generation}"
                    + (f" leader {now.leader} {now.protocol}" if now.leader else "")
                    + f" members [{','.join(now.members)}]"
                    + (f" ({now.reason})" if now.reason else "")
                    + (f"; ignoring {'; '.join(now.ignored)}" if now.ignored else "")
                    + (f"; tasks still starting on {','.join(now.starting)}" if now.starting else ""),
                    state=now.state,
                    generation=now.generation,
                    previous_state=old.state if old else None,
                    previous_generation=old.generation if old else None,
                    protocol=now.protocol,
                    leader=now.leader,
                    members=list(now.members),
                    reason=now.reason,
                    ignored=list(now.ignored),
                    unacked=list(now.unacked),
                    starting=list(now.starting),
                )
            )
        return events

    def _task_listing(self) -> tuple[list[ClusterEvent], list[str]]:
        """The tasks listed again: events for those deleted, and the ids of those not seen before."""
        lay = self.layout
        # a root not laid out yet has no buckets to watch: its layout marker says when it has
        laid_out = self.client.exists(lay.layout_info, watch=self._w("tasks")) is not None
        ids = list_tasks(self.client, lay, watch=self._w("tasks")) if laid_out else []
        events = []
        for t in sorted(set(self.tasks) - set(ids)):
            del self.tasks[t]
            self.owners.pop(t, None)
            events.append(self._ev("task_deleted", t, f"task {t} deleted"))
        return events, [t for t in ids if t not in self.tasks]

    def _tasks(self, specs: list[str], owners: list[str]) -> list[ClusterEvent]:
        lay = self.layout
        events = []
        got = self._get_watched(
            [(lay.task(t), ("task", t)) for t in specs] + [(lay.task_owner(t), ("owner", t)) for t in owners]
        )
        initial = not self.started
        for t, res in zip(specs, got[: len(specs)]):
            if res is None:
                continue
            try:
                state: str | None = decode_task(res[0], lay.task(t)).state
            except PayloadError:
                state = None
            known = t in self.tasks
            old = self.tasks.get(t)
            self.tasks[t] = state
            if initial:
                continue
            if not known:
                events.append(self._ev("task_created", t, f"task {t} created ({state or 'invalid spec'})", state=state))
            elif old != state:
                events.append(self._ev("task_state", t, f"task {t}: {old} -> {state}", state=state, previous=old))
        for t, res in zip(owners, got[len(specs) :]):
            if t not in self.tasks:
                continue
            info, _ = decode_read(task_records.OwnerInfo, res, lay.task_owner(t))
            now = info.broker if info else None
            old = self.owners.get(t)
            self.owners[t] = now
            if initial or now == old:
                continue
            events.append(
                self._ev(
                    "task_owner",
                    t,
                    f"task {t}: {old or '(none)'} -> {now or '(none)'}",
                    owner=now,
                    previous=old,
                    generation=info.generation if info else None,
                )
            )
        return events
