"""Versioned JSON codecs for every payload the product keeps in ZooKeeper.

Each payload is a frozen dataclass. ``encode`` writes it as compact JSON with a ``"version"`` field;
``decode`` parses and validates bytes read from a znode against the dataclass's type hints and raises
one error type, :class:`PayloadError` (with the path and the reason), for anything malformed: bad
UTF-8, bad JSON, a missing or unknown version, a missing field, a wrong type, an oversized value.
Callers never see a bare KeyError or JSONDecodeError.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import threading
import types
import typing
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union, cast

from controller.protocol.errors import ZkcError

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
# ZooKeeper's default jute.maxbuffer is 1 MiB; we refuse to read or write anything near it.
MAX_PAYLOAD_BYTES = 900 * 1024
COMPRESS_ABOVE = 64 * 1024
MAX_INFLATED_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


class PayloadError(ZkcError, ValueError):
    """A znode holds bytes that are not a valid payload of the expected kind.

    ``path`` is the znode (or "<memory>" when decoding a value not read from ZooKeeper) and ``reason``
    says what is wrong, e.g. ``field 'generation': expected int, got str``.
    """

    status = 422
    code = "invalid_spec"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"malformed payload at {path}: {reason}")
        self.path = path
        self.reason = reason


# --------------------------------------------------------------------------------------------------
# payloads (DESIGN.md § 2)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControllerInfo:
    """``/controller``: who is the active controller, at which epoch."""

    controller_id: str
    epoch: int
    host: str
    since: float


class SessionState(str, enum.Enum):
    """Where a broker's compute session (a Spark broker's SparkSession) is: ``starting`` (not yet: no work for
    it), ``ready``, ``lazy`` (started by the first task, as asked), ``failed`` (it cannot start: no work)."""

    STARTING = "starting"
    READY = "ready"
    LAZY = "lazy"
    FAILED = "failed"


MAX_SESSION_ERROR_CHARS = 500
MAX_SESSION_STARTUP_S = 86_400.0


@dataclass(frozen=True)
class SessionInfo:
    """A broker's compute session as its registration reports it: untrusted, so bounded here (a value out of
    range is a PayloadError, and the controller then treats the broker as not ready)."""

    state: SessionState
    since: float  # wall time the session's start began (lazy: the registration's)
    startup_s: float | None = None  # how long the start took, once ready
    error: str | None = None  # why it failed

    def __post_init__(self) -> None:
        if not math.isfinite(self.since) or self.since < 0:
            raise ValueError(f"since {self.since!r} is not a wall time")
        if self.startup_s is not None and not 0 <= self.startup_s <= MAX_SESSION_STARTUP_S:
            raise ValueError(f"startup_s {self.startup_s!r} is not within 0..{MAX_SESSION_STARTUP_S:.0f}")
        if self.error is not None and len(self.error) > MAX_SESSION_ERROR_CHARS:
            raise ValueError(f"error is over {MAX_SESSION_ERROR_CHARS} characters")

    @property
    def ready(self) -> bool:
        """Whether the broker may be given work: its session runs, or it asked to start it lazily."""
        return self.state in (SessionState.READY, SessionState.LAZY)


@dataclass(frozen=True)
class BrokerInfo:
    """``/brokers/ids/<id>``: a live worker. Its broker epoch is the znode's czxid, not a field. ``session``:
    its compute session (None: a runner without one, always ready)."""

    broker_id: str
    host: str
    pid: int
    group: str = "default"
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None
    runner: str = "noop"
    session: SessionInfo | None = None


@dataclass(frozen=True)
class OwnerInfo:
    """``/tasks/<id>/owner``: the one worker running the task (ephemeral)."""

    broker: str
    generation: int


@dataclass(frozen=True)
class HeldTasks:
    """Tasks of a departed static member, kept unassigned until ``until`` (wall-clock seconds) for it to
    return; ``until`` None: until maintenance mode ends."""

    instance: str
    tasks: tuple[str, ...]
    until: float | None


@dataclass(frozen=True)
class IgnoredMember:
    """A member znode the coordinator gives no work: no live broker of the same session behind it (a ghost),
    or a request or report it refused (``reason`` says which)."""

    member: str
    reason: str


@dataclass(frozen=True)
class GroupStateInfo:
    """``/groups/<g>/state``: the coordinator's view of a group, written only by the controller. ``held``
    keeps the scheduled rebalance delay's holds across a controller failover."""

    state: str
    generation: int
    join_generation: int
    controller_epoch: int
    protocol: str | None = None
    assignor: str | None = None
    leader: str | None = None
    members: tuple[str, ...] = ()
    reason: str = ""
    held: tuple[HeldTasks, ...] = ()
    #: the move throttle's view: moves in flight now, moves waiting for a later wave, and the imbalance
    #: (tasks off the preferred layout) last measured
    moving: tuple[str, ...] = ()
    deferred: int = 0
    imbalance: int | None = None
    maintenance: bool = False
    #: member znodes set apart (ghosts, refused reports): shown, never given work
    ignored: tuple[IgnoredMember, ...] = ()
    #: reconcile: members that have not yet acknowledged (taken and reported) their current assignment
    unacked: tuple[str, ...] = ()


@dataclass(frozen=True)
class JoinRequest:
    """``/groups/<g>/members/<member>``: a member's join request (ephemeral, rewritten to rejoin).

    ``join_generation`` is the generation the member asks to join (the coordinator's current
    generation + 1); ``owned`` is what it still runs (always empty under the eager protocol).
    """

    member_id: str
    join_generation: int
    generation: int
    protocols: tuple[str, ...]
    assignors: tuple[str, ...]
    owned: tuple[str, ...] = ()
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None
    leaving: bool = False
    #: this life of the member (new at every start): a reconcile assignment names the one it is for
    incarnation: str | None = None
    #: reconcile: tasks of its assignment whose owner znode it does not hold yet (empty: it runs its
    #: assignment of member epoch ``generation``, which is its acknowledgement)
    pending: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskDescriptor:
    """What an assignor needs to know of one task (a projection of its spec)."""

    task_id: str
    weight: int = 1
    pinned: tuple[str, ...] = ()
    pin_mode: str = "preferred"
    rack: str | None = None


@dataclass(frozen=True)
class MemberMetadata:
    """What an assignor needs to know of one member."""

    member_id: str
    owned: tuple[str, ...] = ()
    capacity: int = 1
    rack: str | None = None
    instance_id: str | None = None
    leaving: bool = False


@dataclass(frozen=True)
class JoinResult:
    """``/groups/<g>/join/<generation>``: the join phase's outcome, for the leader to assign from.

    ``held`` are tasks waiting for a departed member to return (scheduled rebalance delay): the
    assignor must leave them unassigned. ``previous`` is the last published assignment, for sticky
    assignors.
    """

    generation: int
    leader: str
    protocol: str
    assignor: str
    controller_epoch: int
    members: tuple[MemberMetadata, ...]
    tasks: tuple[TaskDescriptor, ...]
    held: tuple[str, ...] = ()
    previous: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class SyncProposal:
    """``/groups/<g>/sync/<generation>``: the leader's proposed assignment for that generation."""

    generation: int
    leader: str
    assigned: dict[str, tuple[str, ...]]
    revoked: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Assignment:
    """``/groups/<g>/assignment/<member>``: what one member must run, fenced by the controller epoch.

    ``error`` carries a protocol error code for this member (e.g. UNKNOWN_MEMBER_ID) instead of tasks.
    """

    generation: int
    controller_epoch: int
    assigned: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    protocol: str = "cooperative"
    leader: str | None = None
    error: str | None = None
    #: whether this member rejoins once its revocations are let go, so a second round assigns what moved
    #: (the leader, when the published assignment revokes anything); None: it decides from its own proposal
    #: (controllers before the move throttle, whose assignment was always the proposal)
    follow_up: bool | None = None
    #: reconcile: the member's life (its request's ``incarnation``) this assignment is for
    incarnation: str | None = None


@dataclass(frozen=True)
class TaskStatus:
    """``/status/<task_id>``: what the owning worker reports about a task."""

    broker: str
    state: str
    generation: int
    updated: float
    error: str | None = None
    trace: str | None = None
    failures: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    #: the ZooKeeper session that wrote it (``0x...``): a status is only as live as that session
    session: str | None = None


def session_hex(session_id: int | None) -> str | None:
    """A session id as ZooKeeper's own tools print it."""
    return None if session_id is None else f"0x{session_id:x}"


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
    the budget on the bound measures the group exactly and writes the measure (``controller.protocol.tally``)."""

    tasks: int = 0
    payload_bytes: int = 0


@dataclass(frozen=True)
class HistoryEvent:
    """One operator action on a task: when (the admin's clock), what, and what it did."""

    at: float
    action: str
    detail: str = ""


@dataclass(frozen=True)
class TaskHistory:
    """``/admin/task_history/<id>``: the task's last operator actions on its run state and offsets (stop,
    reset), newest last, at most ``HISTORY_EVENTS``. ``resetting``: when a reset of its checkpoint began and
    has not finished; a resume waits for it (or for ``RESET_LEASE_S`` to pass, should the reset have died)."""

    events: tuple[HistoryEvent, ...] = ()
    resetting: float | None = None


HISTORY_EVENTS = 50
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


@dataclass(frozen=True)
class RunInterval:
    """One period during which a worker was running a task; recorded for the checker and timelines.

    ``start``/``end`` bound the useful run (for downtime); ``acquired``/``released`` bound the whole
    period the worker could have been running it (for the no-double-ownership check)."""

    task_id: str
    broker: str
    start: float
    end: float | None = None
    generation: int = 0
    acquired: float | None = None  # owner znode created (the run may begin any time after)
    released: float | None = None  # owner znode deleted (the run has fully stopped before)


@dataclass(frozen=True)
class IntervalLog:
    """``/intervals/<broker>``: a broker's recorded run intervals (bounded; oldest dropped first)."""

    broker: str
    intervals: tuple[RunInterval, ...] = ()


# --------------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------------


# Per-class reflection, looked up once: ``dataclasses.fields`` / ``is_dataclass`` on every object were 17% of
# the controller's event-thread time while it encoded join results of 1,000 tasks (docs/benchmarks.md, B2).
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}
# Exact types returned as they are (subclasses, e.g. a ``str`` Enum, take the slow path).
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type (None for any other type), cached per class."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
        _FIELD_NAMES[cls] = names
        return names


def to_jsonable(payload: Any) -> Any:
    """A payload dataclass (or nested value) as plain JSON-compatible data."""
    cls = type(payload)
    if cls in _LEAVES:
        return payload
    names = _field_names(cls)  # a dataclass *instance* (a dataclass type's type is ``type``: not converted)
    if names is not None:
        return {n: to_jsonable(getattr(payload, n)) for n in names}
    if isinstance(payload, enum.Enum):
        return payload.value
    if isinstance(payload, (list, tuple)):
        return [to_jsonable(v) for v in payload]
    if isinstance(payload, dict):
        return {str(k): to_jsonable(v) for k, v in payload.items()}
    return payload


def _serialize(payload: Any) -> bytes:
    body = to_jsonable(payload)
    body["version"] = SCHEMA_VERSION
    data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return zlib.compress(data, 6) if len(data) > COMPRESS_ABOVE else data


def encoded_size(payload: Any) -> int:
    """The bytes ``encode`` would write for ``payload`` (compressed where it would be), without a limit."""
    return len(_serialize(payload))


# A group's tasks travel whole in its join result (descriptors, the previous assignment, what members own):
# creating tasks is refused when that would take the group's join result past this share of the znode limit,
# the rest being left for the members' own metadata.
GROUP_PAYLOAD_BUDGET = int(MAX_PAYLOAD_BYTES * 0.75)


def group_payload_bytes(tasks: Sequence[TaskDescriptor]) -> int:
    """The size of the largest protocol payload a group of ``tasks`` makes: its join result with every task
    owned and previously assigned (what a cooperative rebalance of a loaded group carries)."""
    ids = tuple(t.task_id for t in tasks)
    worst = JoinResult(
        generation=1,
        leader="m",
        protocol="cooperative",
        assignor="cooperative-sticky",
        controller_epoch=1,
        members=(MemberMetadata("m", owned=ids),),
        tasks=tuple(tasks),
        previous={"m": ids},
    )
    return encoded_size(worst)


def encode(payload: Any) -> bytes:
    """Encode a payload dataclass as versioned JSON bytes (refusing oversized payloads).

    JSON larger than ``COMPRESS_ABOVE`` is stored zlib-compressed (a znode's bytes then start with the
    zlib header, never with ``{``): join results and assignments of groups with tens of thousands of
    tasks stay well under ZooKeeper's 1 MiB limit, small payloads stay readable with any client."""
    data = _serialize(payload)
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError("<memory>", f"{type(payload).__name__} is {len(data)} bytes, over {MAX_PAYLOAD_BYTES}")
    return data


def inflate(data: bytes, path: str) -> bytes:
    """Undo ``encode``'s compression (bounded: a small znode cannot expand into gigabytes)."""
    if not data or data[:1] not in (b"\x78",):
        return data
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise PayloadError(path, f"not JSON and not a valid compressed payload ({exc})") from None
    if d.unconsumed_tail:
        raise PayloadError(path, f"compressed payload expands past {MAX_INFLATED_BYTES} bytes")
    return out


class Unreadable(bytes):
    """What a reader got for a znode its credentials may not read (NoAuth): decoding it raises a
    PayloadError that says so, so that one such znode is reported, not fatal to a whole listing."""

    REASON = "not readable with these credentials (NoAuth)"


def decode(cls: type[T], data: bytes | None, path: str = "<memory>") -> T:
    """Parse and validate ``data`` as a ``cls`` payload, or raise PayloadError naming path and reason."""
    if isinstance(data, Unreadable):
        raise PayloadError(path, Unreadable.REASON)
    if data is None:
        raise PayloadError(path, "znode has no data")
    if len(data) > MAX_PAYLOAD_BYTES:
        raise PayloadError(path, f"{len(data)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit")
    data = inflate(data, path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(path, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError: also integers past int_max_str_digits
        raise PayloadError(path, f"not JSON ({exc})") from None
    return from_dict(cls, body, path)


def from_dict(cls: type[T], body: Any, path: str = "<memory>") -> T:
    """Validate an already-parsed versioned JSON object as a ``cls`` payload."""
    if not isinstance(body, dict):
        raise PayloadError(path, f"expected a JSON object, got {_tname(body)}")
    version = body.get("version")
    if version is None:
        raise PayloadError(path, "missing 'version'")
    if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise PayloadError(path, f"unsupported version {version!r} (supported: {sorted(SUPPORTED_VERSIONS)})")
    return cast(T, _coerce(cls, {k: v for k, v in body.items() if k != "version"}, path, ""))


def decode_epoch(data: bytes | None, path: str = "<memory>") -> int:
    """``/controller_epoch`` holds the epoch as decimal text."""
    if data is None:
        raise PayloadError(path, "znode has no data")
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise PayloadError(path, "epoch is not ASCII text") from None
    if not text.isdigit() or len(text) > 18:
        raise PayloadError(path, f"epoch {text[:40]!r} is not a non-negative integer")
    return int(text)


def encode_epoch(epoch: int) -> bytes:
    return str(int(epoch)).encode("ascii")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = hints
    return hints


def _tname(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _label(where: str) -> str:
    return f"field '{where}'" if where else "payload"


def _sub(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# One converter per type, built on first use: ``(value, path, where) -> converted``. Walking the type hints
# for every value (``get_origin``, ``fields``, ``get_args`` per task id) made decoding a 1,000-task join
# result take ~16 ms; the converters take the same decisions and raise the same errors, once compiled.
Converter = typing.Callable[[Any, str, str], Any]
_CONVERTERS: dict[Any, Converter] = {}


def _coerce(tp: Any, value: Any, path: str, where: str) -> Any:
    """Check ``value`` (parsed JSON) against type ``tp`` and convert lists to tuples, objects to dataclasses."""
    return _converter(tp)(value, path, where)


_BUILD_LOCK = threading.RLock()  # workers decode on several threads: a converter is built by one of them


def _converter(tp: Any) -> Converter:
    conv = _CONVERTERS.get(tp)
    if conv is not None:
        return conv
    with _BUILD_LOCK:
        conv = _CONVERTERS.get(tp)
        if conv is None:
            # a placeholder first, so that a type that refers to itself finds its converter while it is
            # built; another thread that meets the placeholder waits for the build instead of recursing
            def placeholder(value: Any, path: str, where: str) -> Any:
                with _BUILD_LOCK:
                    return _CONVERTERS[tp](value, path, where)

            _CONVERTERS[tp] = placeholder
            try:
                conv = _CONVERTERS[tp] = _build_converter(tp)
            except BaseException:
                del _CONVERTERS[tp]
                raise
    return conv


def _build_converter(tp: Any) -> Converter:
    if tp is Any:
        return lambda value, path, where: value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _union_converter(tp)
    if origin is tuple:
        return _tuple_converter(tp)
    if origin is dict:
        (_key, item) = typing.get_args(tp)
        conv_item = _converter(item)

        def conv_dict(value: Any, path: str, where: str) -> Any:
            if not isinstance(value, dict):
                raise PayloadError(path, f"{_label(where)}: expected an object, got {_tname(value)}")
            return {k: conv_item(v, path, f"{where}.{k}") for k, v in value.items()}

        return conv_dict
    if isinstance(tp, type) and issubclass(tp, enum.Enum):

        def conv_enum(value: Any, path: str, where: str) -> Any:
            try:
                return tp(value)
            except ValueError:
                raise PayloadError(path, f"{_label(where)}: {value!r} is not one of {[m.value for m in tp]}") from None

        return conv_enum
    leaf = _LEAF_CONVERTERS.get(tp)
    if leaf is not None:
        return leaf

    def unsupported(value: Any, path: str, where: str) -> Any:
        raise TypeError(f"codec cannot handle type {tp!r}")  # a programming error, not bad input

    return unsupported


def _dataclass_converter(tp: type) -> Converter:
    hints = _hints(tp)
    fields = [
        (f.name, f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(tp)
    ]
    resolved: list[tuple[str, bool, Converter]] | None = None

    def conv_dataclass(value: Any, path: str, where: str) -> Any:
        nonlocal resolved
        if not isinstance(value, dict):
            raise PayloadError(path, f"{_label(where)}: expected an object, got {_tname(value)}")
        convs = resolved
        if convs is None:  # field converters resolved on first use (a field's type may be this dataclass);
            # published whole, so a thread decoding at the same time never sees half of them
            convs = resolved = [(name, required, _converter(hints[name])) for name, required in fields]
        kwargs = {}
        for name, required, conv in convs:
            if name in value:
                kwargs[name] = conv(value[name], path, _sub(where, name))
            elif required:
                raise PayloadError(path, f"missing field '{_sub(where, name)}'")
        try:
            return tp(**kwargs)
        except PayloadError:
            raise
        except ValueError as exc:  # a payload's own bounds (``__post_init__``)
            raise PayloadError(path, f"{_label(where)}: {exc}") from None

    return conv_dataclass


def _union_converter(tp: Any) -> Converter:
    args = typing.get_args(tp)
    nullable = type(None) in args
    alternatives = [_converter(a) for a in args if a is not type(None)]

    def conv_union(value: Any, path: str, where: str) -> Any:
        if value is None and nullable:
            return None
        errors = []
        for conv in alternatives:
            try:
                return conv(value, path, where)
            except PayloadError as exc:
                errors.append(exc.reason)
        raise PayloadError(
            path, errors[0] if len(errors) == 1 else f"{_label(where)}: no alternative matches ({'; '.join(errors)})"
        )

    return conv_union


def _tuple_converter(tp: Any) -> Converter:
    (item, _ellipsis) = typing.get_args(tp)
    if item is str or item is int:
        # the common case (ids): one pass of type checks; the converter of the first bad item names it
        conv_leaf = _LEAF_CONVERTERS[item]
        ok: typing.Callable[[Any], bool] = (
            (lambda v: isinstance(v, str))
            if item is str
            else (lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**63)
        )

        def conv_ids(value: Any, path: str, where: str) -> Any:
            if not isinstance(value, list):
                raise PayloadError(path, f"{_label(where)}: expected an array, got {_tname(value)}")
            for i, v in enumerate(value):
                if not ok(v):
                    conv_leaf(v, path, f"{where}[{i}]")
            return tuple(value)

        return conv_ids
    conv_item = _converter(item)

    def conv_tuple(value: Any, path: str, where: str) -> Any:
        if not isinstance(value, list):
            raise PayloadError(path, f"{_label(where)}: expected an array, got {_tname(value)}")
        return tuple(conv_item(v, path, f"{where}[{i}]") for i, v in enumerate(value))

    return conv_tuple


def _conv_bool(value: Any, path: str, where: str) -> Any:
    if not isinstance(value, bool):
        raise PayloadError(path, f"{_label(where)}: expected boolean, got {_tname(value)}")
    return value


def _conv_int(value: Any, path: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(path, f"{_label(where)}: expected integer, got {_tname(value)}")
    if abs(value) > 2**63:
        raise PayloadError(path, f"{_label(where)}: integer out of range")
    return value


def _conv_float(value: Any, path: str, where: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PayloadError(path, f"{_label(where)}: expected number, got {_tname(value)}")
    return float(value)


def _conv_str(value: Any, path: str, where: str) -> Any:
    if not isinstance(value, str):
        raise PayloadError(path, f"{_label(where)}: expected string, got {_tname(value)}")
    return value


_LEAF_CONVERTERS: dict[type, Converter] = {bool: _conv_bool, int: _conv_int, float: _conv_float, str: _conv_str}
