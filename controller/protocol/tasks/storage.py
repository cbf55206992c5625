"""Checkpoint storage as the brokers hold it, and the requests that reach it through ZooKeeper. Pure.

A broker's checkpoint root is decided in one place (:func:`checkpoint_root`) and scoped by the cluster's
ZooKeeper root, so that two clusters given one state dir never share a task's checkpoint directory. Reading
offsets, resetting them, purging a checkpoint, measuring it and reading a pipeline's log are requests
(:class:`StorageRequest`) an operator writes under ``/admin/storage/<task>``; a broker that holds the task's
storage claims the request, carries it out on its own disk and writes a :class:`StorageResult` beside it. The
caller never opens a checkpoint file, so it works from any host and any directory.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.protocol.cluster.layout import check_name, normalize_root
from controller.protocol.errors import ZkcError

#: what a request may ask for
KINDS = ("offsets", "reset", "purge", "size", "logs")
#: the longest a caller may wait for one request (and a broker may spend on it)
MAX_TIMEOUT_S = 600.0
#: bytes of a result body at most (well under ZooKeeper's 1 MiB znode limit)
MAX_RESULT_BYTES = 256 * 1024
#: lines ``task logs`` returns at most, and bytes of log read per request at most
MAX_LOG_LINES = 5_000
MAX_LOG_READ_BYTES = 128 * 1024


class StorageError(ZkcError, ValueError):
    """A storage request that cannot be made or was not carried out (the reason says which)."""

    status = 422
    code = "storage_request_failed"


class StorageTimeout(StorageError):
    """No broker answered a storage request in time."""

    status = 504
    code = "timeout"


# ---- the checkpoint root --------------------------------------------------------------------------
def cluster_dir(zk_root: str) -> str:
    """One directory name per cluster root: ``/zkc`` -> ``zkc``, ``/a/b`` -> ``a+b``, ``/`` -> ``_root`` (a root's
    segments never hold ``+`` nor start with ``_``, so two roots never share a name)."""
    root = normalize_root(zk_root)
    return "_root" if root == "/" else root.strip("/").replace("/", "+")


def checkpoint_root(option: str | None, env: Mapping[str, str], state_dir: str, zk_root: str, cwd: str) -> str:
    """The broker's checkpoint root: ``--checkpoint-root``, else ``$ZKC_CHECKPOINT_ROOT``, else
    ``<state dir>/checkpoints``; made absolute against ``cwd`` once, at start, then scoped by the cluster
    (``<base>/<cluster_dir>``). A Hadoop URL (``hdfs://``, ``s3a://``) is kept as it is, scoped the same way."""
    base = option or env.get("ZKC_CHECKPOINT_ROOT") or posixpath.join(state_dir, "checkpoints")
    if not base.strip():
        raise StorageError("the checkpoint root is empty: give --checkpoint-root DIR")
    if "://" in base:
        return f"{base.rstrip('/')}/{cluster_dir(zk_root)}"
    if base.startswith("file:"):
        base = base[len("file:") :]
    absolute = posixpath.normpath(posixpath.join(cwd, base))
    if absolute == "/":
        raise StorageError("the checkpoint root cannot be / : give --checkpoint-root DIR")
    return posixpath.join(absolute, cluster_dir(zk_root))


def check_data_path(what: str, path: str) -> str:
    """A sink (or checkpoint) path every broker resolves the same way, and that a reset may rewrite safely:
    absolute or a URL, no ``..``, not ``/``, no surrounding blanks. Refused with what to write instead."""
    hint = f"write an absolute path (e.g. /data/{what.split()[0]}s/NAME) or a URL (hdfs://, s3a://, file:///...)"
    if path != path.strip() or not path.strip():
        raise ValueError(f"{what} {path!r} is blank or has surrounding blanks: {hint}")
    if "://" in path:  # a URL: the path after its authority (file:///x: /x)
        rest = path.split("://", 1)[1]
        local = rest[rest.find("/") :] if "/" in rest else ""
    else:
        local = path[len("file:") :] if path.startswith("file:") else path
        if not local.startswith("/"):
            raise ValueError(f"{what} {path!r} is relative: each broker would resolve it in its own directory; {hint}")
    segments = [s for s in local.split("/") if s]
    if ".." in segments or "." in segments:
        raise ValueError(f"{what} {path!r} holds '.' or '..': {hint}")
    if not segments:
        raise ValueError(f"{what} {path!r} is a file system's root: a reset would rewrite the whole of it; {hint}")
    return path


# ---- requests and results ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StorageRequest:
    """``/admin/storage/<task>``: one request for the task's storage. ``broker``: the broker asked (its owner or
    the last that ran it); None: any live broker whose checkpoint root holds the task's checkpoint.
    ``spec_version``: a reset is carried out only while the spec is still at this version (STOPPED then)."""

    request_id: str
    kind: str
    task_id: str
    requested: float
    deadline: float
    broker: str | None = None
    spec_version: int | None = None
    target: str | None = None  # reset: earliest | latest | batch
    batch: int | None = None
    dry_run: bool = False
    tail: int = 100  # logs: lines wanted
    since: int | None = None  # logs (follow): the byte offset read up to


@dataclass(frozen=True)
class StorageClaim:
    """``/admin/storage/<task>/claim`` (ephemeral): the one broker carrying the request out."""

    request_id: str
    broker: str


@dataclass(frozen=True)
class StorageResult:
    """``/admin/storage/<task>/result``: what the broker did. ``body`` is the answer's JSON (an
    :class:`OffsetsView`, a :class:`ResetResult`, a :class:`CheckpointSize` or :class:`LogLines`)."""

    request_id: str
    broker: str
    ok: bool
    finished: float
    error: str | None = None
    code: str | None = None  # the error's kind (``ZkcError.code``): the caller raises the same kind
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StorageMiss:
    """``/admin/storage/<task>/miss-<broker>``: a broker asked "anyone" that does not hold the checkpoint."""

    request_id: str
    broker: str
    root: str


def validate_request(req: StorageRequest, path_task: str, now: float) -> str | None:
    """Why a request read from ZooKeeper is not to be carried out (None: it is sound)."""
    if req.kind not in KINDS:
        return f"unknown kind {req.kind!r}"
    if req.task_id != path_task:
        return f"names task {req.task_id!r} under {path_task!r}"
    check_name("task id", req.task_id)
    if req.broker is not None:
        check_name("broker id", req.broker)
    if not 0 < req.deadline - req.requested <= MAX_TIMEOUT_S + 5:
        return "its deadline is out of bounds"
    if now > req.deadline:
        return "its deadline has passed"
    if req.kind == "reset":
        if req.target not in ("earliest", "latest", "batch"):
            return f"unknown reset target {req.target!r}"
        if req.target == "batch" and (req.batch is None or not 0 <= req.batch <= 10**15):
            return "a reset to a batch needs a batch id from 0 to 10**15"
        if req.spec_version is None and not req.dry_run:
            return "a reset names the spec version it was checked at"
    if req.kind == "logs" and (not 1 <= req.tail <= MAX_LOG_LINES or (req.since is not None and req.since < 0)):
        return f"a logs request asks for 1 to {MAX_LOG_LINES} lines from a non-negative offset"
    return None


def addressed_broker(owner: str | None, last_ran: str | None, live: Iterable[str]) -> str | None:
    """Whom to ask: the owner, else the last broker that ran the task, if live; else None (any broker whose
    checkpoint root holds the task's checkpoint answers)."""
    alive = set(live)
    for candidate in (owner, last_ran):
        if candidate is not None and candidate in alive:
            return candidate
    return None


# ---- the answers --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResetTarget:
    """``--to-earliest`` | ``--to-latest`` | ``--to-batch N``: exactly one (checked by ``parse``)."""

    earliest: bool = False
    latest: bool = False
    batch: int | None = None

    @classmethod
    def parse(cls, earliest: bool, latest: bool, batch: Any) -> ResetTarget:
        if sum([bool(earliest), bool(latest), batch is not None]) != 1:
            raise StorageError("give exactly one of --to-earliest, --to-latest, --to-batch N")
        if batch is not None and (type(batch) is not int or not 0 <= batch <= 10**15):
            raise StorageError(f"--to-batch must be a batch id from 0 to {10**15}, not {batch!r}")
        return cls(bool(earliest), bool(latest), batch)

    @property
    def name(self) -> str:
        return "earliest" if self.earliest else "latest" if self.latest else "batch"


@dataclass(frozen=True)
class SourceOffsets:
    """One source of the query: its offset at the last committed batch and, for a file source, the files it
    took in that batch (the first ``SHOWN_FILES``), how many it took so far, and how many wait in its
    directory (None: not listed)."""

    index: int
    kind: str  # files | rate | ...
    path: str | None
    offset: Any
    files: tuple[str, ...] = ()
    files_in_batch: int = 0
    files_taken: int | None = None
    files_pending: int | None = None


@dataclass(frozen=True)
class OffsetsView:
    task_id: str
    state: str
    checkpoint: str
    exists: bool
    query_id: str | None = None
    last_committed: int | None = None
    committed_at: float | None = None  # when Spark planned that batch (its offsets' batchTimestampMs)
    last_planned: int | None = None  # > last_committed: a batch begun and not committed (it is replayed)
    earliest: int | None = None  # the oldest batch still kept: the lowest --to-batch
    sources: tuple[SourceOffsets, ...] = ()
    sink: str | None = None
    sink_last_batch: int | None = None
    rows_since_start: int | None = None  # input rows of the current (or last) run, from its owner's status
    stateful: bool = False
    note: str | None = None
    broker: str | None = None  # the broker that read it


@dataclass(frozen=True)
class ResetResult:
    task_id: str
    target: str
    position: int  # the last batch that stays committed (-1: the query starts from scratch)
    dry_run: bool
    removed_logs: tuple[str, ...] = ()
    written: tuple[str, ...] = ()
    sink_batches_removed: tuple[int, ...] = ()
    sink_files_removed: int = 0
    notes: tuple[str, ...] = ()
    broker: str | None = None


@dataclass(frozen=True)
class CheckpointSize:
    """Bytes and files under a checkpoint; ``complete`` False: the walk stopped at its bound (entries or time)."""

    path: str
    exists: bool
    bytes: int = 0
    files: int = 0
    complete: bool = True
    broker: str | None = None


@dataclass(frozen=True)
class LogLines:
    """The last lines of a pipeline's log on ``broker``; ``offset``: where a follow reads on from."""

    task_id: str
    broker: str
    path: str
    lines: tuple[str, ...] = ()
    offset: int = 0
    truncated: bool = False
