"""The registrations of the cluster's processes: the active controller (``/controller``) and each live broker
(``/brokers/ids/<id>``) with its compute session.

Plain frozen values, no I/O and no encoding: ``codecs`` encodes and validates them; callers import them from here."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from controller.protocol.cluster.layout import is_name, shown_name

# The longest host name (DNS: 253) and label (rack, instance id, runner, controller id) a registration may
# carry: untrusted text that every ``status`` prints, bounded where it is decoded.
MAX_HOST_CHARS = 255
MAX_LABEL_CHARS = 200
#: a broker's checkpoint root: an absolute path (PATH_MAX is 4096; far less in practice)
MAX_PATH_CHARS = 4096


def _bounded(cls: str, **fields: str | None) -> None:
    for name, value in fields.items():
        limit = {"host": MAX_HOST_CHARS, "checkpoint_root": MAX_PATH_CHARS}.get(name, MAX_LABEL_CHARS)
        if value is not None and len(value) > limit:
            raise ValueError(f"{cls} {name} is {len(value)} characters, over {limit}")


@dataclass(frozen=True)
class ControllerInfo:
    """``/controller``: who is the active controller, at which epoch."""

    controller_id: str
    epoch: int
    host: str
    since: float

    def __post_init__(self) -> None:
        _bounded("controller", controller_id=self.controller_id, host=self.host)


@dataclass(frozen=True)
class CandidateInfo:
    """``/controller_candidates/<id>`` (ephemeral): a controller candidate, active or standing by; its id is
    held by one live process at a time (a second ``controller run --id`` of the same id is refused)."""

    controller_id: str
    host: str
    pid: int
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
    checkpoint_root: str | None = None  # where its checkpoints are (scoped by the cluster root); None: none
    #: its measured load (cpu_percent, rss_mb, memory_percent, tasks: {task: load share}); kept as the raw
    #: object so that a bad figure never costs the registration: ``controller.protocol.tasks.load`` bounds it
    load: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, value in (("broker_id", self.broker_id), ("group", self.group)):
            if not is_name(value):
                raise ValueError(f"broker {name} {shown_name(value)} is not a legal name")
        _bounded(
            "broker",
            broker_id=self.broker_id,
            host=self.host,
            group=self.group,
            rack=self.rack,
            instance_id=self.instance_id,
            runner=self.runner,
            checkpoint_root=self.checkpoint_root,
        )
