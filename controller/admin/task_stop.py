"""Stopping a task: its spec set STOPPED (recorded in its history) and the stop confirmed from ZooKeeper alone,
which a reset of its offsets requires.

A part of ``AdminClient``, given the history's ``record`` and a way to file a rebalance request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from controller.admin.common import AdminError, Conflict, NotFound, Progress, Watch, wait_watched
from controller.admin.reads import ClusterReads, decode_read
from controller.admin.task_history import LifecycleLock
from controller.protocol.cluster.layout import InvalidName, ZkLayout, check_name
from controller.protocol.group.reports import ghost_reason
from controller.protocol.records import group_messages, task_records
from controller.zk.io import exists_many


@dataclass(frozen=True)
class StopState:
    """Whether a task is confirmed stopped: its spec says STOPPED, no owner znode is left, and its group's
    coordinator, having seen the STOPPED spec, places and holds it nowhere. ``waiting_for`` says what is not
    there yet."""

    task_id: str
    state: str
    confirmed: bool
    waiting_for: str | None = None


@dataclass(frozen=True)
class StopResult:
    task_id: str
    changed: bool
    state: str
    confirmed: bool
    waiting_for: str | None = None
    waited: bool = False


_COORDINATOR = "group {group}'s coordinator to take the stop in"


def _legal(kind: str, name: str) -> bool:
    try:
        check_name(kind, name)
        return True
    except InvalidName:
        return False


class StopAdmin:
    """The stop part of ``AdminClient``."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        lifecycle: Callable[[str, str, str], LifecycleLock],
        request_rebalance: Callable[[str, str], object] | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        #: the lock over the task's lifecycle (``HistoryAdmin.check_lifecycle``), with the stop's history event
        self.lifecycle = lifecycle
        #: files a rebalance request for a group (group, reason): the coordinator's state write that follows
        #: confirms a stop that changed nothing it schedules
        self.request_rebalance = request_rebalance

    def stop(self, task_id: str, wait: float = 0.0, progress: Progress | None = None) -> StopResult:
        """Set the spec STOPPED (recorded in its history) and, with ``wait``, wait until ZooKeeper shows it runs
        nowhere (``stop_state``)."""
        path = self.layout.task(task_id)
        changed = False
        was = "STOPPED"
        for _ in range(10):
            spec, stat, deleting = self.reads.spec(task_id)
            if deleting:
                raise Conflict(f"task {task_id!r} is being deleted")
            was = spec.state
            lock = self.lifecycle(task_id, "stop", f"was {spec.state}")  # refused during a reset or deletion
            if spec.state == "STOPPED":
                break
            t = self.client.transaction()
            lock.add_to(t)
            t.set_data(path, spec.with_state("STOPPED").encode(), version=stat.version)
            results = t.commit()
            if isinstance(results[-1], NoNodeError):
                raise NotFound(f"unknown task {task_id!r}")
            if any(isinstance(r, Exception) for r in results):
                continue  # the spec or the history changed: look again
            changed = True
            break
        else:
            raise AdminError(f"task {task_id!r}: its spec kept changing during the stop; try again")
        state = self.stop_state(task_id)
        if state.waiting_for == _COORDINATOR.format(group=spec.group) and self.request_rebalance:
            # nothing the coordinator schedules may have changed (PAUSED or created STOPPED before; a task
            # nobody could run; a controller that has since failed over and restored its groups as they were),
            # so it may write nothing: a rebalance request, delivered after the spec change, makes it write the
            # group's state
            self.request_rebalance(spec.group, f"confirm the stop of {task_id} (was {was})")
        if wait > 0 and not state.confirmed:
            wait_watched(lambda w: self._confirmed(task_id, w), wait, progress=progress)
            state = self.stop_state(task_id)
        return StopResult(task_id, changed, state.state, state.confirmed, state.waiting_for, waited=wait > 0)

    def _confirmed(self, task_id: str, watch: Watch) -> bool:
        return self.stop_state(task_id, watch).confirmed

    def stop_state(self, task_id: str, watch: Watch | None = None) -> StopState:
        """Whether the task is STOPPED and runs nowhere, from ZooKeeper alone (no member's report): no owner
        znode (a worker holds it from before it starts the task until after it stopped it), no assignment of
        its group that places it, no hold of the group that keeps it for a departed member, and the group's
        state written after the spec became STOPPED (so its coordinator has seen it: a coordinator still on the
        RUNNING spec could place it again) — or no member in the group at all. ``watch`` is armed on what it
        reads (the owner, the group's state and assignments)."""
        lay = self.layout
        spec, spec_stat, _ = self.reads.spec(task_id)
        if spec.state != "STOPPED":
            return StopState(task_id, spec.state, False, f"the task is {spec.state}, not STOPPED")
        g = spec.group
        owner = self.client.exists(lay.task_owner(task_id), watch=watch)
        if owner is not None:
            data = self._get(lay.task_owner(task_id))
            info, _ = decode_read(
                task_records.OwnerInfo, (data, owner) if data is not None else None, lay.task_owner(task_id)
            )
            return StopState(task_id, spec.state, False, f"its owner {info.broker if info else '?'} to let it go")
        live = self._live_members(g, watch)
        if not live:
            return StopState(task_id, spec.state, True)
        try:
            data, state_stat = self.client.get(lay.group_state(g), watch=watch)
        except NoNodeError:
            return StopState(task_id, spec.state, False, f"group {g}'s coordinator to write its state")
        if state_stat.mzxid < spec_stat.mzxid:
            return StopState(task_id, spec.state, False, _COORDINATOR.format(group=g))
        group_state, err = decode_read(group_messages.GroupStateInfo, (data, state_stat), lay.group_state(g))
        if group_state is None:
            return StopState(task_id, spec.state, False, f"group {g}'s state to be readable ({err})")
        if any(task_id in h.tasks for h in group_state.held):
            return StopState(task_id, spec.state, False, f"group {g} to drop its hold of the task")
        for m in self._children(lay.group_assignments(g), watch):
            if m not in live:  # a departed member's last assignment stays behind; it runs nothing (no owner
                continue  # znode), and its next life is fenced from that assignment by generation or incarnation
            path = lay.group_assignment(g, m)
            try:
                raw = self.client.get(path, watch=watch)
            except NoNodeError:
                continue
            a, err = decode_read(group_messages.Assignment, raw, path)
            if a is None:
                return StopState(task_id, spec.state, False, f"{m}'s assignment to be readable ({err})")
            if task_id in a.assigned:
                return StopState(task_id, spec.state, False, f"group {g} to revoke it from {m}")
        return StopState(task_id, spec.state, True)

    def _live_members(self, group: str, watch: Watch | None) -> list[str]:
        """The group's members with a broker behind them (the coordinator's rule, ``reports.ghost_reason``: one
        session holds the member znode and the broker registration of the same id); a ghost is never given
        work, so it cannot run the task."""
        lay = self.layout
        members = [m for m in self._children(lay.group_members(group), watch) if _legal("member id", m)]
        stats = exists_many(
            self.client, [lay.group_member(group, m) for m in members] + [lay.broker(m) for m in members]
        )
        live = []
        for m, ms, bs in zip(members, stats[: len(members)], stats[len(members) :]):
            owner = ms.ephemeralOwner if ms is not None else None
            if ms is not None and not ghost_reason(m, owner, bs.ephemeralOwner if bs else None, bs is not None):
                live.append(m)
        return live

    def _get(self, path: str) -> bytes | None:
        try:
            return bytes(self.client.get(path)[0])
        except NoNodeError:
            return None

    def _children(self, path: str, watch: Watch | None) -> list[str]:
        try:
            return self.layout.legal_children(path, self.client.get_children(path, watch=watch))
        except NoNodeError:
            return []

    def require_stopped(self, task_id: str) -> StopState:
        state = self.stop_state(task_id)
        if not state.confirmed:
            hint = "" if state.state != "STOPPED" else f" (waiting for {state.waiting_for}; `task stop --wait`)"
            raise Conflict(f"task {task_id!r} must be STOPPED and confirmed stopped{hint}: {state.waiting_for}")
        return state
