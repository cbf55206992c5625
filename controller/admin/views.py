"""What admin operations return: frozen views of tasks, brokers, groups and the cluster, and ``to_dict``
for their JSON form (the CLI's ``--json``, the HTTP API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.admin.inspection import jsonable
from controller.protocol.records import admin_records, codecs, task_records


def to_dict(value: Any) -> Any:
    """A result of this module (dataclasses, tuples, payloads) as plain JSON-compatible data."""
    return jsonable(value) if hasattr(value, "model_dump") else codecs.to_jsonable(value)


def json_object(value: Any) -> dict[str, Any]:
    """``to_dict`` of a result that is one object (a view, a payload): what an API route answers."""
    out = to_dict(value)
    if not isinstance(out, dict):
        raise TypeError(f"{type(value).__name__} is not a JSON object")
    return out


@dataclass(frozen=True)
class CreateResult:
    dry_run: bool
    tasks: tuple[str, ...]
    specs: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()
    multis: int = 0


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    group: str | None = None
    state: str | None = None  # the spec's state: RUNNING | PAUSED | STOPPED (None when the spec is invalid)
    kind: str | None = None  # pipeline kind
    weight: int | None = None
    owner: str | None = None  # broker holding /tasks/<id>/owner
    owner_generation: int | None = None
    status: str | None = None  # what the owner reports: RUNNING, FAILED, STOPPED, COMPLETED, ...
    status_broker: str | None = None  # who reported it
    status_stale: bool = False  # reported as running by a session that no longer holds the task
    error: str | None = None
    deleting: bool = False
    invalid: str | None = None  # why the spec cannot be decoded
    owner_since: float | None = None  # when the current owner took it (its owner znode's ctime): the last move
    metrics: dict[str, Any] = field(default_factory=dict)  # what the owner's runner reports (rows, rates, ...)
    #: what to show: STALE for a status its writer's session no longer backs, UNASSIGNED for a task to run that
    #: nobody holds, else the reported status (None: nothing reported yet)
    shown: str | None = None
    status_updated: float | None = None  # when the status was written (its writer's clock)
    unassigned_since: float | None = None  # a task to run with no owner: since when (see ``unassigned_since``)
    revision: int | None = None  # the spec's version
    status_revision: int | None = None  # the spec version the reporting owner runs (None: not said)
    restarts: int | None = None  # failures its owner counted (each one restarted, until the policy gives up)


@dataclass(frozen=True)
class TaskPage:
    """One page of a listing read at the source: its rows, and the cursor of the next page (None: the last).
    The cursor is the last task id the page examined; tasks come in bucket order, then id order."""

    rows: tuple[TaskRow, ...]
    next_cursor: str | None
    examined: int = 0  # tasks whose znodes the page read


@dataclass(frozen=True)
class RestartProgress:
    """A task's restart policy and how far its owner has gone through it (from the spec and the status)."""

    max_attempts: int
    backoff_initial_s: float
    backoff_max_s: float
    failures: int  # failures in a row the owner reported (`task restart` starts over)
    attempts: int  # automatic restarts made or scheduled so far
    gave_up: bool  # FAILED with every attempt spent: it waits for `task restart`
    next_delay_s: float | None = None  # while RESTARTING: the wait before this attempt


@dataclass(frozen=True)
class TaskDescription:
    task_id: str
    spec: dict[str, Any] | None
    spec_version: int | None  # the spec's revision (None: the spec is invalid)
    created: float
    owner: dict[str, Any] | None  # {"broker", "generation", "since"}
    status: dict[str, Any] | None
    last_error: str | None
    deleting: bool = False
    reassign_to: str | None = None
    invalid: str | None = None
    status_stale: bool = False
    shown: str | None = None
    unassigned_since: float | None = None
    restart: RestartProgress | None = None
    checkpoint: Any = None  # a streaming spark task's checkpoint: path, exists, bytes, files (``CheckpointSize``)
    history: tuple[admin_records.HistoryEvent, ...] = ()  # its recorded changes, stops, resumes from STOPPED and resets
    zk_version: int | None = None  # the spec znode's version (any write of the spec bumps it)
    #: why it last failed, from its status: {"error", "kind", "trace", "at", "restarts"} (validated when decoded)
    last_failure: dict[str, Any] | None = None


@dataclass(frozen=True)
class TaskChange:
    task_id: str
    action: str  # pause | resume | restart | stop
    changed: bool
    state: str
    restart_nonce: int
    zk_version: int


@dataclass(frozen=True)
class SkippedRestart:
    task_id: str
    reason: str


@dataclass(frozen=True)
class BulkRestart:
    """What ``restart_tasks`` did: the tasks restarted (their nonces bumped in ``multis`` multis), and those
    it left alone, with why."""

    only_failed: bool
    group: str | None
    restarted: tuple[TaskChange, ...] = ()
    skipped: tuple[SkippedRestart, ...] = ()
    multis: int = 0


@dataclass(frozen=True)
class AdminRequest:
    """A request written under ``/admin``; ``done`` says whether it completed within the wait (None: not waited)."""

    kind: str
    subject: str | None
    path: str
    already_pending: bool = False
    done: bool | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerView:
    broker_id: str
    epoch: int  # the broker znode's czxid
    host: str | None = None
    pid: int | None = None
    group: str | None = None
    capacity: int | None = None
    rack: str | None = None
    instance_id: str | None = None
    runner: str | None = None
    tasks: int = 0  # owner znodes it holds
    shutting_down: bool = False
    since: float = 0.0
    error: str | None = None
    #: its compute session as registered: {"state": starting|ready|lazy|failed, "since", "startup_s", "error"}
    session: dict[str, Any] | None = None
    #: where it keeps checkpoints (scoped by the cluster root); its storage requests are carried out there
    checkpoint_root: str | None = None
    #: its load report, bounded: {"cpu_percent", "rss_mb", "memory_percent", "load", "tasks": {task: share}}
    load: dict[str, Any] | None = None


@dataclass(frozen=True)
class GroupSummary:
    group: str
    state: str | None
    generation: int | None = None
    join_generation: int | None = None
    protocol: str | None = None
    assignor: str | None = None
    leader: str | None = None
    members: tuple[str, ...] = ()  # members of the current generation
    live_members: tuple[str, ...] = ()  # members with a join request znode
    reason: str = ""
    controller_epoch: int | None = None
    error: str | None = None
    moving: int = 0  # moves in flight (throttle)
    deferred: int = 0  # moves waiting for a later wave (throttle, maintenance)
    imbalance: int | None = None  # tasks the assignor would move from where they run
    held: int = 0  # tasks waiting for a departed member (delay, maintenance)
    ignored: tuple[str, ...] = ()  # member znodes given no work ("member: why"): ghosts, refused requests
    unacked: tuple[str, ...] = ()  # reconcile: members that have not acknowledged their assignment yet
    starting: tuple[str, ...] = ()  # reconcile: members whose tasks placed are still starting (not running yet)


@dataclass(frozen=True)
class MemberView:
    member_id: str
    live: bool
    request: dict[str, Any] | None  # the join request (JoinRequest)
    assignment: dict[str, Any] | None  # the published assignment (Assignment)
    owns: tuple[str, ...] = ()  # owner znodes it holds right now
    error: str | None = None


@dataclass(frozen=True)
class GroupDescription:
    summary: GroupSummary
    members: tuple[MemberView, ...]
    tasks: int = 0  # RUNNING-state specs of this group


@dataclass(frozen=True)
class ClusterStatus:
    root: str
    controller: dict[str, Any] | None
    controller_epoch: int | None
    brokers: tuple[BrokerView, ...]
    groups: tuple[GroupSummary, ...]
    tasks: dict[str, Any]
    pending: dict[str, int]
    maintenance: dict[str, Any] | None = None  # MaintenanceInfo, when the znode holds one
    source: str = "full"  # where the task counts come from: "summary" (the controller's) or "full" (every task)
    summary_age: float | None = None  # seconds since the controller computed the summary
    fallback: str | None = None  # why a full read was made instead of the summary


@dataclass(frozen=True)
class ClusterEvent:
    """One change seen by :meth:`AdminClient.watch`."""

    time: float
    kind: str  # watching | controller | maintenance | broker_joined | broker_left | broker_bounced | group |
    # task_created | task_deleted | task_state | task_owner
    subject: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


_LIVE_STATES = frozenset({"RUNNING", "STARTING", "RESTARTING"})


def stale_after(
    status: task_records.TaskStatus | None, owner: task_records.OwnerInfo | None, owner_session: int | None = None
) -> bool:
    """A status that says running, written by a session that does not hold the task: another broker, or an
    earlier life of the same broker (its session expired; the owner znode, if any, is a new session's).
    Workers do not rewrite a status after letting a task go, and a dead one cannot."""
    if status is None or status.state not in _LIVE_STATES:
        return False
    if owner is None or owner.broker != status.broker:
        return True
    return (
        status.session is not None
        and owner_session is not None
        and status.session != task_records.session_hex(owner_session)
    )


_FINAL = frozenset({"COMPLETED", "FAILED"})


def unassigned_since(
    spec_state: str | None,
    owned: bool,
    status: task_records.TaskStatus | None,
    created: float,
    status_written: float | None,
) -> float | None:
    """For a task that should run (not paused, not finished) and that nobody holds: since when. The later of
    its creation and its last status write; exact after a release (a release writes the last status in the
    same multi that deletes the owner znode), early by at most a status interval plus the session timeout
    after a broker died (its last status was written before its session expired)."""
    if owned or spec_state != "RUNNING" or (status is not None and status.state in _FINAL):
        return None
    return max(created, status_written or 0.0)


def shown_status(status: task_records.TaskStatus | None, stale: bool, unassigned: float | None) -> str | None:
    if unassigned is not None:
        return "UNASSIGNED"
    if stale:
        return "STALE"
    return status.state if status else None


def restart_progress(policy: Any, status: task_records.TaskStatus | None) -> RestartProgress:
    """The policy (a spec's ``RestartPolicy``) with what the status says of the failures so far."""
    failures = status.failures if status is not None else 0
    state = status.state if status is not None else None
    return RestartProgress(
        max_attempts=policy.max_attempts,
        backoff_initial_s=policy.backoff_initial_s,
        backoff_max_s=policy.backoff_max_s,
        failures=failures,
        attempts=min(failures, policy.max_attempts),
        gave_up=state == "FAILED" and policy.gives_up(failures),
        next_delay_s=policy.delay_before(failures) if state == "RESTARTING" and failures > 0 else None,
    )


def restart_candidates(rows: Any, only_failed: bool) -> tuple[list[str], list[SkippedRestart]]:
    """Which tasks a bulk restart bumps: those shown FAILED (``only_failed``; what ``task list`` shows) or every
    task, less those it cannot or need not restart, each with the reason."""
    chosen: list[str] = []
    skipped: list[SkippedRestart] = []
    for r in rows:
        if only_failed and r.shown != "FAILED":
            continue
        if r.invalid:
            skipped.append(SkippedRestart(r.task_id, f"invalid spec: {r.invalid}"))
        elif r.deleting:
            skipped.append(SkippedRestart(r.task_id, "being deleted"))
        elif r.state in ("PAUSED", "STOPPED"):
            skipped.append(SkippedRestart(r.task_id, f"{r.state}: resume it to run it again"))
        else:
            chosen.append(r.task_id)
    return chosen, skipped
