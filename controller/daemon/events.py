"""Controller events: small immutable values. Watches, timers and admin requests only enqueue these;
the ControllerEventThread processes them one at a time (a run of re-reads of single znodes waiting one
behind another as one merged event, see ``coalesce``). Each event's ``process`` step names the part of
the controller and the method that handles it, so the dispatch is in one readable place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from controller.daemon import Controller


class ControllerEvent(Protocol):
    def process(self, c: Controller) -> None: ...


@dataclass(frozen=True)
class Startup:
    def process(self, c: Controller) -> None:
        c.election.elect()


@dataclass(frozen=True)
class ControllerChange:
    """``/controller`` was created, changed or deleted."""

    token: int

    def process(self, c: Controller) -> None:
        c.election.on_controller_change(self.token)


@dataclass(frozen=True)
class Reelect:
    """Run for election again after an attempt ZooKeeper cut short. A no-op once active: a retry timer
    that fires after the controller has won must not make it resign."""

    def process(self, c: Controller) -> None:
        c.election.elect()


@dataclass(frozen=True)
class Suspended:
    """The ZooKeeper connection is suspended: hold writes until it is back or the session is lost."""

    def process(self, c: Controller) -> None:
        c.election.on_suspended()


@dataclass(frozen=True)
class Reconnected:
    def process(self, c: Controller) -> None:
        c.election.on_reconnected()


@dataclass(frozen=True)
class Expire:
    """The session is lost: resign, drop the context, run for election again."""

    def process(self, c: Controller) -> None:
        c.election.on_expire()


@dataclass(frozen=True)
class BrokerChange:
    token: int

    def process(self, c: Controller) -> None:
        c.brokers.on_broker_change(self.token)


@dataclass(frozen=True)
class BrokerModification:
    """One broker's znode changed or went away."""

    token: int
    broker_id: str

    def process(self, c: Controller) -> None:
        c.brokers.on_broker_modifications(self.token, (self.broker_id,))


@dataclass(frozen=True)
class BrokerModifications:
    """Several brokers' znodes to re-read at once: watch firings merged (``coalesce``) after a reconnect or
    while queued one behind another."""

    token: int
    broker_ids: tuple[str, ...]

    def process(self, c: Controller) -> None:
        c.brokers.on_broker_modifications(self.token, self.broker_ids)


@dataclass(frozen=True)
class TaskChange:
    """A task bucket's children changed: tasks created (or deleted behind our back). ``bucket``: the bucket
    znode whose watch fired (only it is listed again), None for all of them."""

    token: int
    bucket: str | None = None

    def process(self, c: Controller) -> None:
        c.tasks.on_task_change(self.token, self.bucket)


@dataclass(frozen=True)
class TaskConfigChange:
    """One task's spec changed (paused, resumed, edited) or was deleted."""

    token: int
    task_id: str

    def process(self, c: Controller) -> None:
        c.tasks.on_task_config_changes(self.token, (self.task_id,))


@dataclass(frozen=True)
class TasksResync:
    """The tasks' watches may have missed changes (the connection dropped: kazoo and the server forgot them):
    re-arm, then read every task again."""

    token: int

    def process(self, c: Controller) -> None:
        c.tasks.on_tasks_resync(self.token)


@dataclass(frozen=True)
class TaskConfigChanges:
    """Several tasks' specs to re-read at once: watch firings merged (``coalesce``) after a reconnect or
    while queued one behind another."""

    token: int
    task_ids: tuple[str, ...]

    def process(self, c: Controller) -> None:
        c.tasks.on_task_config_changes(self.token, self.task_ids)


@dataclass(frozen=True)
class TaskDeletion:
    """``/admin/delete_tasks`` changed, or an owner of a task being deleted let go."""

    token: int

    def process(self, c: Controller) -> None:
        c.tasks.on_task_deletion(self.token)


@dataclass(frozen=True)
class StatusesChange:
    """A status bucket's children changed: a status may belong to a task that no longer exists. ``bucket``:
    the bucket znode whose watch fired (only it is listed again), None for all of them."""

    token: int
    bucket: str | None = None

    def process(self, c: Controller) -> None:
        c.tasks.on_statuses_change(self.token, self.bucket)


@dataclass(frozen=True)
class GroupsChange:
    token: int

    def process(self, c: Controller) -> None:
        c.groups.on_groups_change(self.token)


@dataclass(frozen=True)
class MembersChange:
    token: int
    group: str

    def process(self, c: Controller) -> None:
        c.groups.on_members_change(self.token, self.group)


@dataclass(frozen=True)
class MemberChange:
    token: int
    group: str
    member: str

    def process(self, c: Controller) -> None:
        c.groups.on_member_changes(self.token, self.group, (self.member,))


@dataclass(frozen=True)
class MemberChanges:
    """Several members' join requests to re-read at once: watch firings merged (``coalesce``) after a
    reconnect or while queued one behind another."""

    token: int
    group: str
    members: tuple[str, ...]

    def process(self, c: Controller) -> None:
        c.groups.on_member_changes(self.token, self.group, self.members)


@dataclass(frozen=True)
class SyncProposalReady:
    token: int
    group: str
    generation: int

    def process(self, c: Controller) -> None:
        c.groups.on_sync_proposal(self.token, self.group, self.generation)


@dataclass(frozen=True)
class Rebalance:
    """An operator asked (``/admin/rebalance``), or a trigger inside the controller."""

    token: int

    def process(self, c: Controller) -> None:
        c.tasks.on_admin_rebalance(self.token)


@dataclass(frozen=True)
class ControlledShutdown:
    token: int

    def process(self, c: Controller) -> None:
        c.brokers.on_controlled_shutdown(self.token)


@dataclass(frozen=True)
class Reassign:
    token: int

    def process(self, c: Controller) -> None:
        c.tasks.on_reassign(self.token)


@dataclass(frozen=True)
class RollChange:
    """``/admin/roll`` changed: a roll started, resumed or was cancelled."""

    token: int

    def process(self, c: Controller) -> None:
        c.roll.on_change(self.token)


@dataclass(frozen=True)
class SettingsChange:
    """``/admin/settings`` changed: throttles, automatic maintenance, preferred placement checks."""

    token: int

    def process(self, c: Controller) -> None:
        c.operations.on_settings_change(self.token)


@dataclass(frozen=True)
class MaintenanceChange:
    """``/admin/maintenance`` changed: maintenance mode on or off."""

    token: int

    def process(self, c: Controller) -> None:
        c.operations.on_maintenance_change(self.token)


@dataclass(frozen=True)
class MoveStatus:
    """The status of a task in flight (moved by the last wave) changed: is it running on its new owner?"""

    token: int
    group: str
    task: str

    def process(self, c: Controller) -> None:
        c.operations.on_move_status(self.token, self.group, self.task)


@dataclass(frozen=True)
class Tick:
    """A protocol deadline passed (join/sync timeout, scheduled rebalance delay)."""

    def process(self, c: Controller) -> None:
        c.on_tick()


@dataclass(frozen=True)
class Shutdown:
    def process(self, c: Controller) -> None:
        c.resign("shutdown")


# Events that only ask "re-read this part of ZooKeeper": processing one twice in a row changes nothing,
# so held copies can be merged (see coalesce).
_REREADS = (
    ControllerChange,
    BrokerChange,
    TaskChange,
    TasksResync,
    TaskDeletion,
    StatusesChange,
    GroupsChange,
    MembersChange,
    SyncProposalReady,
    Rebalance,
    ControlledShutdown,
    Reassign,
    RollChange,
    Tick,
)


def merge_key(event: object) -> tuple[tuple[Any, ...], tuple[str, ...]] | None:
    """``((plural kind, token[, group]), ids)`` for a re-read of single znodes, singular or already
    merged; None for every other event. Events with equal keys may be processed as one plural event."""
    if isinstance(event, TaskConfigChange):
        return (TaskConfigChanges, event.token), (event.task_id,)
    if isinstance(event, TaskConfigChanges):
        return (TaskConfigChanges, event.token), event.task_ids
    if isinstance(event, BrokerModification):
        return (BrokerModifications, event.token), (event.broker_id,)
    if isinstance(event, BrokerModifications):
        return (BrokerModifications, event.token), event.broker_ids
    if isinstance(event, MemberChange):
        return (MemberChanges, event.token, event.group), (event.member,)
    if isinstance(event, MemberChanges):
        return (MemberChanges, event.token, event.group), event.members
    return None


def coalesce(events: list[Any]) -> list[Any]:
    """Merge re-reads of single znodes: events held while the connection was suspended, before they are
    replayed, and (ControllerEventThread) a run of them waiting in the queue.

    On a connection loss kazoo fires every watch at once (and forgets them all), so the held list holds one
    re-read per watched znode; a storm of spec changes queues one per task. Processed one by one, that is
    a synchronous round trip per znode. Re-reads of single znodes (singular or already merged) merge into
    one pipelined re-read per kind, token and group (at the place of the first), duplicate re-reads of the
    same thing are dropped, and everything else keeps its place and order. Reading the current state
    earlier than its turn loses nothing: the re-armed watch fires for any later change.
    """
    out: list[Any] = []
    seen: set[Any] = set()
    merged: dict[tuple[Any, ...], tuple[int, list[str]]] = {}
    for e in events:
        mk = merge_key(e)
        if mk is None:
            if isinstance(e, _REREADS):
                if e in seen:
                    continue
                seen.add(e)
            out.append(e)
            continue
        key, ids = mk
        if key not in merged:
            merged[key] = (len(out), [])
            out.append(None)
        merged[key][1].extend(ids)
    for key, (pos, items) in merged.items():
        kind, rest = key[0], key[1:]
        out[pos] = kind(*rest, tuple(dict.fromkeys(items)))
    return out
