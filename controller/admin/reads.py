"""The pipelined reads every part of the admin client shares: tasks, statuses, owners, brokers and groups in a
few waves of requests whatever the size of the cluster, and the views built from what they return.

One ``ClusterReads`` per ``AdminClient``: it remembers which znodes these credentials may not read (the CLI
warns of them) and whether the root's layout was checked already."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from controller.admin.common import WAIT_S, AdminError, NotFound
from controller.admin.views import BrokerView, GroupSummary
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.load import broker_figures
from controller.protocol.tasks.spec import TaskSpec, decode_task
from controller.zk.layout_io import check_root, list_tasks
from controller.zk.multi_read import multi_read

T = TypeVar("T")

# From this many znodes on, a read goes through multiRead (controller.zk.multi_read).
MULTI_READ_FROM = 8
# The stat of a znode we may not read: every field 0 (no time, no version).
UNKNOWN_STAT = ZnodeStat(*([0] * len(ZnodeStat._fields)))

#: what a read returns per znode: (data, stat), or None for a znode that does not exist
Read = Any


def decode_read(cls: type[T], res: Read, path: str) -> tuple[T | None, str | None]:
    """A read's payload decoded as ``cls``: (value, None), (None, why not) for garbage, (None, None) if absent."""
    if res is None:
        return None, None
    try:
        return codecs.decode(cls, res[0], path), None
    except PayloadError as exc:
        return None, str(exc)


def broker_view(
    layout: ZkLayout, broker_id: str, res: tuple[bytes, ZnodeStat], tasks: int, shutting: bool
) -> BrokerView:
    """A broker's registration as shown: its epoch is the znode's czxid, a garbled payload an error."""
    info, err = decode_read(registration_records.BrokerInfo, res, layout.broker(broker_id))
    stat = res[1]
    if info is None:
        return BrokerView(
            broker_id, stat.czxid, tasks=tasks, shutting_down=shutting, since=stat.ctime / 1000.0, error=err
        )
    return BrokerView(
        broker_id,
        stat.czxid,
        info.host,
        info.pid,
        info.group,
        info.capacity,
        info.rack,
        info.instance_id,
        info.runner,
        tasks,
        shutting,
        stat.ctime / 1000.0,
        session=None if info.session is None else codecs.to_jsonable(info.session),
        checkpoint_root=info.checkpoint_root,
        load=load_view(info.load),
    )


def load_view(raw: Any) -> dict[str, Any] | None:
    """A registration's load report, bounded (``controller.protocol.tasks.load``): what was repaired is listed."""
    if raw is None:
        return None
    f = broker_figures(raw)
    view: dict[str, Any] = {
        "cpu_percent": f.cpu_percent,
        "rss_mb": f.rss_mb,
        "memory_percent": f.memory_percent,
        "load": round(f.load, 3),
        "tasks": dict(f.tasks),
    }
    if f.problems:
        view["problems"] = list(f.problems)
    return view


def group_summary(layout: ZkLayout, group: str, res: Read, live: list[str] | None) -> GroupSummary:
    """A group's state znode as shown, with the members that have a join request znode (``live``)."""
    info, err = decode_read(group_messages.GroupStateInfo, res, layout.group_state(group))
    live_t = tuple(live or ())
    if info is None:
        return GroupSummary(group, None, live_members=live_t, error=err)
    return GroupSummary(
        group,
        info.state,
        info.generation,
        info.join_generation,
        info.protocol,
        info.assignor,
        info.leader,
        tuple(info.members),
        live_t,
        info.reason,
        info.controller_epoch,
        moving=len(info.moving),
        deferred=info.deferred,
        imbalance=info.imbalance,
        held=sum(len(h.tasks) for h in info.held),
        ignored=tuple(f"{i.member}: {i.reason}" for i in info.ignored),
        unacked=tuple(info.unacked),
        starting=tuple(info.starting),
    )


class ClusterReads:
    """Reads are pipelined with kazoo's async API: every request of a wave is sent before any answer is
    awaited, so a wave costs one round trip of latency; large waves go through multiRead."""

    def __init__(self, client: KazooClient, layout: ZkLayout) -> None:
        self.client = client
        self.layout = layout
        self.unreadable: set[str] = set()  # znodes a read met that these credentials may not read
        self._laid_out = False  # the root's layout marker seen: no need to look again

    def wave(self, gets: Sequence[str] = (), children: Sequence[str] = ()) -> tuple[list[Read], list[list[str] | None]]:
        """Issue every get and get_children at once, then collect: one round trip of latency. A znode these
        credentials may not read comes back as ``(codecs.Unreadable(), stat)`` (its decoding reports it; its
        stat all zeros) and is noted in ``unreadable``: one znode whose ACL was changed under us must not make
        every read of the cluster fail. A child whose name is not legal is logged and left out."""
        ca = [self.client.get_children_async(p) for p in children]
        got: list[Read] = []
        if len(gets) >= MULTI_READ_FROM:
            try:  # a few multiRead requests instead of one request per znode (10,000 tasks: 1 s, not 5)
                got = multi_read(self.client, gets)
            except NoAuthError:
                got = []  # some znode we may not read: read one by one below, to report just that one
        ga = [] if got else [self.client.get_async(p) for p in gets]
        for p, a in zip(gets, ga):
            try:
                got.append(a.get(timeout=WAIT_S))
            except NoNodeError:
                got.append(None)
            except NoAuthError:
                self.unreadable.add(p)
                got.append((codecs.Unreadable(), UNKNOWN_STAT))  # not even its stat may be read
        kids: list[list[str] | None] = []
        for p, a in zip(children, ca):
            try:
                kids.append(self.layout.legal_children(p, a.get(timeout=WAIT_S)))  # one bad name hides nothing
            except NoNodeError:
                kids.append(None)
        return got, kids  # a container we may not list (NoAuth) raises: nothing could be read at all

    def check_layout(self) -> None:
        """A flat root of an earlier release raises LayoutError rather than reading as empty (read once)."""
        if not self._laid_out:
            self._laid_out = check_root(self.client, self.layout)

    def task_ids(self) -> list[str]:
        """Every task id, sorted: the task buckets, in multiRead requests (never one listing of them all)."""
        self.check_layout()
        return list_tasks(self.client, self.layout)

    def owners(self, task_ids: Sequence[str]) -> dict[str, tuple[task_records.OwnerInfo | None, ZnodeStat]]:
        """Each owned task's owner (None if garbled) and its owner znode's stat; unowned tasks are absent."""
        lay = self.layout
        got, _ = self.wave([lay.task_owner(t) for t in task_ids])
        out = {}
        for t, res in zip(task_ids, got):
            if res is not None:
                info, _err = decode_read(task_records.OwnerInfo, res, lay.task_owner(t))
                out[t] = (info, res[1])
        return out

    def spec(self, task_id: str) -> tuple[TaskSpec, ZnodeStat, bool]:
        """The task's spec, its stat and whether a deletion is pending (one wave)."""
        lay = self.layout
        path = lay.task(task_id)
        got, _ = self.wave([path, lay.admin_delete_task(task_id)])
        if got[0] is None:
            raise NotFound(f"unknown task {task_id!r}")
        try:
            spec = decode_task(got[0][0], path)
        except PayloadError as exc:
            raise AdminError(f"task {task_id!r} has an invalid spec: {exc.reason}") from None
        return spec, got[0][1], got[1] is not None

    def live_brokers(self) -> list[str]:
        _, (kids,) = self.wave(children=[self.layout.broker_ids])
        return kids or []

    def group_summaries(self, groups: Sequence[str]) -> list[GroupSummary]:
        lay = self.layout
        got, kids = self.wave([lay.group_state(g) for g in groups], [lay.group_members(g) for g in groups])
        return [group_summary(lay, g, r, m) for g, r, m in zip(groups, got, kids)]

    def controller_note(self) -> tuple[str, ...]:
        """What an admin request's answer should add when no controller is there to carry it out."""
        if self.client.exists(self.layout.controller) is None:
            return ("no active controller: the request waits for one",)
        return ()
