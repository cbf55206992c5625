"""What the active controller knows and how it is configured: the config, the in-memory context
loaded on failover and kept current by events, and the broker records in it."""

from __future__ import annotations

import collections
import socket
from dataclasses import dataclass, field
from typing import Literal

from kazoo.exceptions import (
    ConnectionLoss,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from controller.protocol.group.coordinator import GroupCoordinator
from controller.protocol.group.readiness import broker_ready
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records.admin_records import ClusterSettings, MaintenanceInfo
from controller.protocol.records.group_messages import JoinRequest, TaskDescriptor
from controller.protocol.records.registration_records import BrokerInfo
from controller.protocol.tasks.spec import TaskSpec
from controller.zk.client import ZkSettings

TRANSIENT = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)


# How the failover load reads the cluster (see Controller._load): "multiread" reads the bulk without watches
# in multiRead requests and arms the tasks' watches in the background; "pipelined" and "sequential" read
# every task with its watch, one kazoo request per znode (the contenders of benchmark B3).
LoadMethod = Literal["multiread", "pipelined", "sequential"]


LOAD_METHODS: tuple[str, ...] = ("multiread", "pipelined", "sequential")

# How the controller watches task specs: "persistent" (the default) arms one PERSISTENT_RECURSIVE watch on
# ``/tasks`` (ZooKeeper 3.6+, ``controller/zk/watches.py``) and falls back on "one-shot" where the server has no
# ``addWatch``; "one-shot" keeps a data watch per task, re-armed after every firing.
TaskWatch = Literal["persistent", "one-shot"]

TASK_WATCHES: tuple[str, ...] = ("persistent", "one-shot")


@dataclass(frozen=True)
class ControllerConfig:
    controller_id: str
    settings: ZkSettings
    group: GroupConfig = field(default_factory=GroupConfig)
    metrics_port: int | None = None
    host: str = field(default_factory=socket.gethostname)
    load: LoadMethod = "multiread"
    task_watch: TaskWatch = "persistent"

    def __post_init__(self) -> None:
        if self.load not in LOAD_METHODS:
            raise ValueError(f"unknown load method {self.load!r} (one of {', '.join(LOAD_METHODS)})")
        if self.task_watch not in TASK_WATCHES:
            raise ValueError(f"unknown task watch {self.task_watch!r} (one of {', '.join(TASK_WATCHES)})")


@dataclass
class BrokerRecord:
    epoch: int  # the broker znode's czxid: a bounced broker is a new one
    info: BrokerInfo | None
    error: str | None = None
    #: the session holding the registration: a member znode counts only when the same session holds it
    session: int | None = None


@dataclass(frozen=True)
class BrokerDelta:
    """What one look at ``/brokers/ids`` found: new ids, ids gone, and ids re-registered by a new session
    (same id, new czxid: the old incarnation is gone, whatever it held with it)."""

    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    bounced: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.bounced)


@dataclass
class ControllerContext:
    """What the active controller knows, loaded from ZooKeeper on failover and kept current by events.

    One object, built whole by ``loading`` and dropped whole on resign, so that no part can outlive an
    activation; each part changes only its own slice (below). Other parts read a slice, never write it."""

    # ---- brokers (``brokers``) ----
    brokers: dict[str, BrokerRecord] = field(default_factory=dict)
    shutdown_requests: set[str] = field(default_factory=set)
    broker_changes: collections.deque[BrokerDelta] = field(default_factory=lambda: collections.deque(maxlen=1000))
    # ---- tasks, deletions, admin requests (``tasks``) ----
    tasks: dict[str, TaskSpec] = field(default_factory=dict)
    invalid_tasks: dict[str, str] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    deletable: dict[str, float] = field(default_factory=dict)  # requested, owner gone -> since (clock time)
    # deletions that failed with no owner in the way (a stray child, no right to delete it): task ->
    # (failures so far, clock time of the next attempt), so a retry backs off instead of spinning
    deletion_retry: dict[str, tuple[int, float]] = field(default_factory=dict)
    # ---- groups (``groups``) ----
    groups: dict[str, GroupCoordinator] = field(default_factory=dict)
    members: dict[str, dict[str, JoinRequest]] = field(default_factory=dict)
    invalid_members: dict[tuple[str, str], str] = field(default_factory=dict)
    member_sessions: dict[tuple[str, str], int] = field(default_factory=dict)  # session owning each join request
    # member znodes with no live broker of the same session behind them (ghosts): never handed to a coordinator
    ghost_members: dict[tuple[str, str], str] = field(default_factory=dict)
    # per group, the join results this activation wrote and the proposals it watched (path -> generation),
    # deleted once a later generation is Stable; groups whose older generations were listed once (leftovers)
    generation_paths: dict[str, dict[str, int]] = field(default_factory=dict)
    swept_generations: set[str] = field(default_factory=set)
    # ---- per-broker identities (``grants``): task -> the broker its znodes were handed to ----
    task_grants: dict[str, str] = field(default_factory=dict)
    # ---- operations (``operations``): settings, maintenance mode, brokers lost (clock time) ----
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    maintenance: MaintenanceInfo = field(default_factory=MaintenanceInfo)
    lost: dict[str, float] = field(default_factory=dict)
    clean_exits: set[str] = field(default_factory=set)  # members that left by a controlled shutdown
    # ---- every part's writes: znodes known to exist (so a write needs no look-up first) ----
    known_paths: set[str] = field(default_factory=set)

    def unready_brokers(self) -> set[str]:
        """Brokers whose registration does not say their session is ready: no work for their members."""
        return {b for b, r in self.brokers.items() if not broker_ready(r.info)}

    def group_tasks(self, group: str) -> dict[str, TaskDescriptor]:
        return {
            t: spec.descriptor()
            for t, spec in self.tasks.items()
            if spec.group == group and spec.state == "RUNNING" and t not in self.deleting
        }
