"""Controller events: small immutable values. Watches, timers and admin requests only enqueue these;
the ControllerEventThread processes them one at a time. Each event's ``process`` step names the
controller method that handles it, so the dispatch is in one readable place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from controller.daemon import Controller


class ControllerEvent(Protocol):
    def process(self, c: "Controller") -> None: ...


@dataclass(frozen=True)
class Startup:
    def process(self, c: "Controller") -> None:
        c.elect()


@dataclass(frozen=True)
class ControllerChange:
    """``/controller`` was created, changed or deleted."""

    token: int

    def process(self, c: "Controller") -> None:
        c.on_controller_change(self.token)


@dataclass(frozen=True)
class Reelect:
    def process(self, c: "Controller") -> None:
        c.resign("re-election requested")
        c.elect()


@dataclass(frozen=True)
class Suspended:
    """The ZooKeeper connection is suspended: hold writes until it is back or the session is lost."""

    def process(self, c: "Controller") -> None:
        c.on_suspended()


@dataclass(frozen=True)
class Reconnected:
    def process(self, c: "Controller") -> None:
        c.on_reconnected()


@dataclass(frozen=True)
class Expire:
    """The session is lost: resign, drop the context, run for election again."""

    def process(self, c: "Controller") -> None:
        c.on_expire()


@dataclass(frozen=True)
class BrokerChange:
    token: int

    def process(self, c: "Controller") -> None:
        c.on_broker_change(self.token)


@dataclass(frozen=True)
class BrokerModification:
    token: int
    broker_id: str

    def process(self, c: "Controller") -> None:
        c.on_broker_modification(self.token, self.broker_id)


@dataclass(frozen=True)
class TaskChange:
    """``/tasks`` children changed: tasks created (or deleted behind our back)."""

    token: int

    def process(self, c: "Controller") -> None:
        c.on_task_change(self.token)


@dataclass(frozen=True)
class TaskConfigChange:
    """One task's spec changed (paused, resumed, edited) or was deleted."""

    token: int
    task_id: str

    def process(self, c: "Controller") -> None:
        c.on_task_config_change(self.token, self.task_id)


@dataclass(frozen=True)
class TaskDeletion:
    """``/admin/delete_tasks`` changed, or an owner of a task being deleted let go."""

    token: int

    def process(self, c: "Controller") -> None:
        c.on_task_deletion(self.token)


@dataclass(frozen=True)
class GroupsChange:
    token: int

    def process(self, c: "Controller") -> None:
        c.on_groups_change(self.token)


@dataclass(frozen=True)
class MembersChange:
    token: int
    group: str

    def process(self, c: "Controller") -> None:
        c.on_members_change(self.token, self.group)


@dataclass(frozen=True)
class MemberChange:
    token: int
    group: str
    member: str

    def process(self, c: "Controller") -> None:
        c.on_member_change(self.token, self.group, self.member)


@dataclass(frozen=True)
class SyncProposalReady:
    token: int
    group: str
    generation: int

    def process(self, c: "Controller") -> None:
        c.on_sync_proposal(self.token, self.group, self.generation)


@dataclass(frozen=True)
class Rebalance:
    """An operator asked (``/admin/rebalance``), or a trigger inside the controller."""

    token: int

    def process(self, c: "Controller") -> None:
        c.on_admin_rebalance(self.token)


@dataclass(frozen=True)
class ControlledShutdown:
    token: int

    def process(self, c: "Controller") -> None:
        c.on_controlled_shutdown(self.token)


@dataclass(frozen=True)
class Reassign:
    token: int

    def process(self, c: "Controller") -> None:
        c.on_reassign(self.token)


@dataclass(frozen=True)
class Tick:
    """A protocol deadline passed (join/sync timeout, scheduled rebalance delay)."""

    def process(self, c: "Controller") -> None:
        c.on_tick()


@dataclass(frozen=True)
class Shutdown:
    def process(self, c: "Controller") -> None:
        c.resign("shutdown")
