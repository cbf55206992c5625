"""Operators' records: requests under ``/admin`` (rebalance, controlled shutdown, reassign, delete), live settings
and maintenance mode, a task's history, the create's per-group tally, the layout marker and the cluster summary.

Plain frozen values; ``codecs`` encodes and validates them; callers import them from here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RebalanceRequest:
    """``/admin/rebalance/<seq>``: an operator asks for a rebalance of one group (or all). ``preferred``
    asks for the preferred layout (the group's assignor from scratch), reached in throttled waves."""

    group: str | None = None
    reason: str = "manual"
    preferred: bool = False


@dataclass(frozen=True)
class MoveLimits:
    """A move throttle: at most ``max_moves`` moves in flight (a task starting on a broker that did not
    run it, from its revocation until it runs again), and at most ``max_moves_per_broker`` of them starting
    on one broker; None is no limit."""

    max_moves: int | None = None
    max_moves_per_broker: int | None = None


@dataclass(frozen=True)
class ClusterSettings:
    """``/admin/settings``: what operators set live and the controller honours at its next decision.

    ``throttle`` applies to the whole cluster, ``group_throttle`` to one group each (both hold). Automatic
    maintenance turns on when more than ``max_offline_brokers`` (or ``max_offline_fraction`` of the brokers
    seen) are lost within ``offline_window_s``. ``preferred_check_s`` is how often the controller checks each
    group's imbalance and, above ``max_imbalance`` tasks, rebalances towards the preferred layout (0: never)."""

    throttle: MoveLimits = field(default_factory=MoveLimits)
    group_throttle: dict[str, MoveLimits] = field(default_factory=dict)
    max_offline_brokers: int | None = None
    max_offline_fraction: float | None = None
    offline_window_s: float = 60.0
    preferred_check_s: float = 60.0
    max_imbalance: int = 1


@dataclass(frozen=True)
class GroupTally:
    """``/admin/group_tasks/<g>``: what a create needs to know of a group without reading its tasks. Both
    figures are upper bounds: each create adds its tasks (check-and-set on the znode's version, so two creates
    cannot both pass the budget on the same figure), deletions do not subtract, and a create that would cross
    the budget on the bound measures the group exactly and writes the measure (``controller.protocol.group.tally``)."""

    tasks: int = 0
    payload_bytes: int = 0


@dataclass(frozen=True)
class HistoryEvent:
    """One operator action on a task: when (the admin's clock), what, and what it did."""

    at: float
    action: str
    detail: str = ""
    #: who asked: the ZooKeeper identity of the admin client, or the API's (absent: not recorded)
    who: str | None = None
    #: a change of the spec: its version before and after (absent: not a change of the spec)
    from_revision: int | None = None
    to_revision: int | None = None


@dataclass(frozen=True)
class SpecRevision:
    """One applied spec, kept so that ``task rollback`` can apply it again: its version and its stored JSON."""

    revision: int
    spec: str
    at: float = 0.0


@dataclass(frozen=True)
class TaskHistory:
    """``/admin/task_history/<id>``: the task's last operator actions on its spec, run state and offsets (apply,
    rollback, stop, reset), newest last, at most ``HISTORY_EVENTS``; its last applied specs, at most
    ``HISTORY_SPECS``. ``resetting``: when a reset of its checkpoint began and has not finished; a resume waits
    for it (or for ``RESET_LEASE_S`` to pass, should the reset have died)."""

    events: tuple[HistoryEvent, ...] = ()
    resetting: float | None = None
    specs: tuple[SpecRevision, ...] = ()


HISTORY_EVENTS = 50
#: applied specs kept for rollback (fewer when they are large: the history stays under ``HISTORY_SPEC_BYTES``)
HISTORY_SPECS = 10
HISTORY_SPEC_BYTES = 256 * 1024
RESET_LEASE_S = 300.0


@dataclass(frozen=True)
class LayoutInfo:
    """``/layout``: the root's layout version and bucket count. Written last when a root is laid out or
    migrated, so a root without it is fresh (no entries) or flat (an earlier release's, to migrate)."""

    layout: int = 2
    buckets: int = 256


@dataclass(frozen=True)
class GroupTaskCount:
    """One group's line of a :class:`ClusterSummary`: its specs by state, and how many of its RUNNING specs
    the coordinator's current assignment places on a member."""

    group: str
    running: int = 0
    paused: int = 0
    assigned: int = 0
    stopped: int = 0


@dataclass(frozen=True)
class ClusterSummary:
    """``/cluster_summary``: task counts kept by the active controller from what it holds in memory, written
    under its epoch fence at most once a second when they change (and rewritten unchanged every few seconds, so
    its age says the controller is alive). ``status`` reads it instead of every task's three znodes.

    ``assigned`` counts RUNNING specs placed by a group's current assignment (``by_broker``: per member, which
    is the broker id); a reported status is the workers' and is not in the summary (``status --full`` reads
    them)."""

    epoch: int
    computed_at: float
    total: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    invalid: int = 0
    deleting: int = 0
    assigned: int = 0
    unassigned: int = 0
    by_broker: dict[str, int] = field(default_factory=dict)
    groups: tuple[GroupTaskCount, ...] = ()


@dataclass(frozen=True)
class MaintenanceInfo:
    """``/admin/maintenance``: the cluster's maintenance mode (no task moves or gains an owner while
    ``on``). ``by`` is ``operator`` or ``auto`` (the controller, on losing too many brokers at once; it
    also ends an automatic one when enough of them are back)."""

    on: bool = False
    reason: str = ""
    by: str = "operator"
    since: float = 0.0
    offline: tuple[str, ...] = ()


@dataclass(frozen=True)
class ControlledShutdownRequest:
    """``/admin/controlled_shutdown/<broker>``: move this broker's tasks away before it leaves. ``in_place``
    (a planned roll's batch with nowhere to move its tasks): the broker stops what it runs and exits now, and
    the coordinator holds its tasks for it until it is back (its supervisor restarts it under the same id)."""

    broker: str
    requested: float = 0.0
    in_place: bool = False
    #: in place: the seconds its tasks wait for it (after that they are placed elsewhere)
    hold_s: float = 0.0


@dataclass(frozen=True)
class ReassignRequest:
    """``/admin/reassign/<task>``: move one task to one broker (still never double-owned)."""

    task_id: str
    to: str


@dataclass(frozen=True)
class DeleteTaskRequest:
    """``/admin/delete_tasks/<task>``: the controller revokes the task, waits for its owner to let go,
    then deletes it (a task is never deleted under a running owner)."""

    task_id: str
    requested: float = 0.0
