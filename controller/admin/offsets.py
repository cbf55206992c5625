"""A task's run state and offsets as operations: ``stop`` (STOPPED, confirmed from ZooKeeper), ``offsets`` (what
its Spark checkpoint says), ``reset_offsets`` (earliest, latest, a batch), the checkpoint's size and purge, and
the task's history of these actions (``/admin/task_history/<id>``).

The checkpoint is read where it lives: ``<checkpoint root>/<task id>`` on a local or mounted file system, the
same root the brokers were given (``--checkpoint-root``). A root that is a Hadoop URL other than ``file:`` is
not read from here (``zkctl`` has no Hadoop client); a root not mounted where ``zkctl`` runs reads as "no
checkpoint at <path>". The parsing and the reset plans are ``controller.protocol.checkpoints`` (pure)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from controller.admin.common import AdminError, Conflict, NotFound, Progress, Watch, ensure_layout, wait_watched
from controller.admin.reads import ClusterReads, decode_read
from controller.protocol import checkpoints as ck
from controller.protocol import codecs
from controller.protocol.checkpoints import CheckpointError, CheckpointLogs, LogName
from controller.protocol.layout import InvalidName, ZkLayout, check_name
from controller.protocol.reports import ghost_reason
from controller.protocol.taskspec import FilesSink, FilesSource, SparkPipeline, TaskSpec
from controller.zk.io import exists_many

#: files counted by ``describe``'s checkpoint size at most (a bound on the walk)
MAX_SIZE_FILES = 200_000
#: files listed in a source directory at most (pending files of ``offsets``, ``--to-latest``)
MAX_LISTED = 100_000


def default_checkpoint_root() -> str:
    """The brokers' default (``zkctl broker run --checkpoint-root``): ``$ZKC_CHECKPOINT_ROOT``, else
    ``$ZKC_STATE_DIR/checkpoints``."""
    return os.environ.get("ZKC_CHECKPOINT_ROOT") or os.path.join(os.environ.get("ZKC_STATE_DIR", ".zkc"), "checkpoints")


def local_path(url: str, what: str) -> Path:
    """A local path from a path or ``file:`` URL; any other scheme is refused (not readable from here)."""
    if "://" in url or url.startswith("file:"):
        parsed = urlparse(url)
        if parsed.scheme != "file":
            raise CheckpointError(
                f"{what} {url!r} is on {parsed.scheme}://, which zkctl does not read: run it where that storage "
                "is mounted, or use Spark's tools there"
            )
        return Path(unquote(parsed.path))
    return Path(os.path.abspath(url))


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


@dataclass(frozen=True)
class SourceOffsets:
    """One source of the query: its offset at the last committed batch and, for a file source, the files it
    took in that batch (the first ``SHOWN_FILES``), how many it took so far, and how many wait in its
    directory (None: not listed from here)."""

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


@dataclass(frozen=True)
class CheckpointSize:
    path: str
    exists: bool
    bytes: int = 0
    files: int = 0
    complete: bool = True  # False: the walk stopped at MAX_SIZE_FILES


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
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ResetTarget:
    """``--to-earliest`` | ``--to-latest`` | ``--to-batch N``: exactly one (checked by ``parse``)."""

    earliest: bool = False
    latest: bool = False
    batch: int | None = None

    @classmethod
    def parse(cls, earliest: bool, latest: bool, batch: Any) -> ResetTarget:
        if sum([bool(earliest), bool(latest), batch is not None]) != 1:
            raise AdminError("give exactly one of --to-earliest, --to-latest, --to-batch N")
        if batch is not None and (type(batch) is not int or not 0 <= batch <= 10**15):
            raise AdminError(f"--to-batch must be a batch id from 0 to {10**15}, not {batch!r}")
        return cls(bool(earliest), bool(latest), batch)


def _streaming(spec: TaskSpec) -> SparkPipeline:
    p = spec.pipeline
    if not isinstance(p, SparkPipeline) or p.mode != "streaming":
        raise Conflict(f"task {spec.id!r} is not a streaming spark pipeline: it has no offsets")
    return p


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(ck.MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None


def _names(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot list ({exc.strerror})") from None


def _remove_file(path: Path) -> None:
    """A log file and Hadoop's checksum beside it (``.<name>.crc``: a stale one would fail Spark's read)."""
    for p in (path, path.with_name(f".{path.name}.crc")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _write_file(path: Path, data: bytes) -> None:
    """Write through a hidden temporary name and rename into place, as Spark's own logs are written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_file(path)
    tmp = path.with_name(f".{path.name}.zkc-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


_COORDINATOR = "group {group}'s coordinator to take the stop in"


def _legal(kind: str, name: str) -> bool:
    try:
        check_name(kind, name)
        return True
    except InvalidName:
        return False


class OffsetAdmin:
    """The offsets part of ``AdminClient``. ``checkpoint_root`` is where the brokers keep checkpoints, as seen
    from this process."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        checkpoint_root: str | None = None,
        request_rebalance: Callable[[str, str], object] | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        self.checkpoint_root = checkpoint_root or default_checkpoint_root()
        #: files a rebalance request for a group (group, reason): the coordinator's state write that follows
        #: confirms a stop that changed nothing it schedules
        self.request_rebalance = request_rebalance

    # ---- history ----------------------------------------------------------------------------------
    def history(self, task_id: str) -> codecs.TaskHistory:
        """The task's recorded stops and resets (empty when none)."""
        path = self.layout.task_history(task_id)
        got, _ = self.reads.wave([path])
        hist, err = decode_read(codecs.TaskHistory, got[0], path)
        if err:
            raise AdminError(f"task {task_id!r}: its history is unreadable: {err}")
        return hist or codecs.TaskHistory()

    def _history_op(
        self, task_id: str, change: Callable[[codecs.TaskHistory], codecs.TaskHistory]
    ) -> tuple[str, bytes, int | None]:
        """The history znode's path, its new bytes, and the version to set (None: to create)."""
        path = self.layout.task_history(task_id)
        try:
            data, stat = self.client.get(path)
            hist, err = decode_read(codecs.TaskHistory, (data, stat), path)
            version: int | None = stat.version
        except NoNodeError:
            hist, err, version = None, None, None
        new = change(hist or codecs.TaskHistory())  # an unreadable history is replaced, not kept
        if err:
            new = replace(new, events=new.events[-1:])
        return path, codecs.encode(new), version

    def record(self, task_id: str, action: str, detail: str, *, end_reset: bool = False) -> None:
        """Append one event (bounded to the newest ``HISTORY_EVENTS``; ``end_reset``: a reset is over); retried
        on a concurrent write."""
        ensure_layout(self.client, self.layout)
        for _ in range(10):
            path, data, version = self._history_op(task_id, _append(action, detail, end_reset))
            try:
                if version is None:
                    self.client.create(path, data)
                else:
                    self.client.set(path, data, version=version)
                return
            except (BadVersionError, NodeExistsError):
                continue
            except NoNodeError:
                raise AdminError(
                    f"task {task_id!r}: the {action} is done but not recorded: {self.layout.admin_task_history} is "
                    "missing (a secured root laid out by an earlier release: run `zkctl security init`)"
                ) from None
        raise AdminError(f"task {task_id!r}: its history kept changing; the {action} is done but not recorded")

    # ---- stop ---------------------------------------------------------------------------------------
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
            if spec.state == "STOPPED":
                break
            try:
                self.client.set(path, spec.with_state("STOPPED").encode(), version=stat.version)
            except BadVersionError:
                continue
            except NoNodeError:
                raise NotFound(f"unknown task {task_id!r}") from None
            changed = True
            self.record(task_id, "stop", f"was {spec.state}")
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
                codecs.OwnerInfo, (data, owner) if data is not None else None, lay.task_owner(task_id)
            )
            return StopState(task_id, spec.state, False, f"its owner {info.broker if info else '?'} to let it go")
        if not self._live_members(g, watch):
            return StopState(task_id, spec.state, True)
        try:
            data, state_stat = self.client.get(lay.group_state(g), watch=watch)
        except NoNodeError:
            return StopState(task_id, spec.state, False, f"group {g}'s coordinator to write its state")
        if state_stat.mzxid < spec_stat.mzxid:
            return StopState(task_id, spec.state, False, _COORDINATOR.format(group=g))
        group_state, err = decode_read(codecs.GroupStateInfo, (data, state_stat), lay.group_state(g))
        if group_state is None:
            return StopState(task_id, spec.state, False, f"group {g}'s state to be readable ({err})")
        if any(task_id in h.tasks for h in group_state.held):
            return StopState(task_id, spec.state, False, f"group {g} to drop its hold of the task")
        for m in self._children(lay.group_assignments(g), watch):
            path = lay.group_assignment(g, m)
            try:
                raw = self.client.get(path, watch=watch)
            except NoNodeError:
                continue
            a, err = decode_read(codecs.Assignment, raw, path)
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
            return list(self.client.get_children(path, watch=watch))
        except NoNodeError:
            return []

    def require_stopped(self, task_id: str) -> StopState:
        state = self.stop_state(task_id)
        if not state.confirmed:
            hint = "" if state.state != "STOPPED" else f" (waiting for {state.waiting_for}; `task stop --wait`)"
            raise Conflict(f"task {task_id!r} must be STOPPED and confirmed stopped{hint}: {state.waiting_for}")
        return state

    def check_resume(self, task_id: str) -> int | None:
        """Before a resume: refuse while a reset of the checkpoint is under way; returns the history znode's
        version for the resume's write to check (a reset that begins meanwhile changes it). A STOPPED task
        without a history gets an empty one first, so that there is a version to check."""
        path = self.layout.task_history(task_id)
        for _ in range(3):
            got, _ = self.reads.wave([path])
            if got[0] is None:
                try:
                    ensure_layout(self.client, self.layout)
                    self.client.create(path, codecs.encode(codecs.TaskHistory()))
                except NodeExistsError:
                    pass
                except NoNodeError:
                    return None  # no history container (an old secured root): no reset can have begun either
                continue
            hist, _err = decode_read(codecs.TaskHistory, got[0], path)
            if hist is not None and hist.resetting is not None and time.time() - hist.resetting < codecs.RESET_LEASE_S:
                began = time.strftime("%H:%M:%S", time.localtime(hist.resetting))
                raise Conflict(
                    f"task {task_id!r}: a reset of its offsets began at {began} and has not finished; wait for it "
                    "(or, if it died, run reset-offsets again)"
                )
            return int(got[0][1].version)
        raise AdminError(f"task {task_id!r}: its history could not be read")

    # ---- the checkpoint ---------------------------------------------------------------------------
    def checkpoint_of(self, task_id: str) -> Path:
        return local_path(self.checkpoint_root, "checkpoint root") / check_name("task id", task_id)  # one segment

    def checkpoint_size(self, task_id: str) -> CheckpointSize:
        """Bytes and files under the checkpoint (bounded walk); ``exists`` False where it is not seen from here."""
        root = self.checkpoint_of(task_id)
        if not root.is_dir():
            return CheckpointSize(str(root), False)
        total = files = 0
        for dirpath, _dirs, names in os.walk(root):
            for n in names:
                try:
                    total += os.lstat(os.path.join(dirpath, n)).st_size
                except OSError:
                    continue
                files += 1
                if files >= MAX_SIZE_FILES:
                    return CheckpointSize(str(root), True, total, files, complete=False)
        return CheckpointSize(str(root), True, total, files)

    def purge_checkpoint(self, task_id: str) -> CheckpointSize:
        """Remove the checkpoint of a deleted task (what it held is returned); a task that exists is refused."""
        if self.client.exists(self.layout.task(task_id)) is not None:
            raise Conflict(f"task {task_id!r} exists: its checkpoint is removed only once it is deleted")
        size = self.checkpoint_size(task_id)
        if size.exists:
            try:
                shutil.rmtree(size.path)  # refuses a symbolic link: what it points at is not the checkpoint's
            except OSError as exc:
                raise AdminError(
                    f"task {task_id!r} is deleted; its checkpoint {size.path} was not removed: {exc}"
                ) from None
        return size

    def purge_note(self, task_id: str) -> str:
        """``purge_checkpoint`` as a note for the deletion's answer."""
        size = self.purge_checkpoint(task_id)
        if not size.exists:
            return f"no checkpoint at {size.path} to remove"
        return f"checkpoint {size.path} removed ({size.bytes:,} bytes in {size.files:,} files)"

    def _logs(self, root: Path, sink: Path | None, file_sources: set[int]) -> CheckpointLogs:
        sources = {
            i: tuple(ck.log_names(_names(root / "sources" / str(i)), f"{root}/sources/{i}")) for i in file_sources
        }
        sink_dir = sink / "_spark_metadata" if sink is not None else None
        return CheckpointLogs(
            offsets=tuple(ck.log_names(_names(root / "offsets"), f"{root}/offsets")),
            commits=tuple(ck.log_names(_names(root / "commits"), f"{root}/commits")),
            sources=sources,
            sink=tuple(ck.log_names(_names(sink_dir), str(sink_dir))) if sink_dir and sink_dir.is_dir() else None,
            stateful=(root / "state").is_dir(),
        )

    @staticmethod
    def _paths(p: SparkPipeline) -> tuple[Path | None, Path | None, set[int]]:
        src = local_path(p.source.path, "source path") if isinstance(p.source, FilesSource) else None
        sink = local_path(p.sink.path, "sink path") if isinstance(p.sink, FilesSink) else None
        return src, sink, ({0} if src is not None else set())

    def _source_entries(self, log_dir: Path, names: tuple[LogName, ...], upto: int) -> list[ck.SourceFile]:
        """Every entry of a source log up to batch ``upto``: the latest compaction at or below it, then the
        per-batch files after it."""
        chosen = [n for n in names if n.batch <= upto]
        compact = [n for n in chosen if n.compact]
        start = compact[-1].batch if compact else -1
        out: list[ck.SourceFile] = []
        for n in chosen:
            if (n.compact and n.batch == start) or (not n.compact and n.batch > start):
                out += ck.parse_source_log(_read(log_dir / n.name), str(log_dir / n.name))
        return out

    def _sink_entries(self, log_dir: Path, names: tuple[LogName, ...]) -> list[ck.SinkFile]:
        compact = [n for n in names if n.compact]
        start = compact[-1].batch if compact else -1
        out: list[ck.SinkFile] = []
        for n in names:
            if (n.compact and n.batch == start) or (not n.compact and n.batch > start):
                out += ck.parse_sink_log(_read(log_dir / n.name), str(log_dir / n.name))
        return out

    def offsets(self, task_id: str) -> OffsetsView:
        """What the task's checkpoint says: per source the last committed batch's offset and files, when it was
        planned, how many files wait; the oldest batch kept; the rows its owner reported since it started."""
        spec, _stat, _ = self.reads.spec(task_id)
        p = _streaming(spec)
        root = self.checkpoint_of(task_id)
        src, sink, file_sources = self._paths(p)
        rows = self._rows_since_start(task_id)
        if not root.is_dir():
            note = (
                f"no checkpoint at {root}: the task has not committed a batch yet, or the checkpoint root "
                f"{self.checkpoint_root} is not where the brokers keep it (--checkpoint-root, ZKC_CHECKPOINT_ROOT)"
            )
            return OffsetsView(task_id, spec.state, str(root), False, rows_since_start=rows, note=note)
        logs = self._logs(root, sink, file_sources)
        meta = root / "metadata"
        query_id = None
        if meta.is_file():
            query_id = ck.parse_metadata(_read(meta), str(meta))
        last = logs.last_committed
        if last is not None and not (root / "offsets" / str(last)).is_file():
            raise CheckpointError(f"{root}: batch {last} is committed but its offsets are missing")
        entry = (
            ck.parse_offsets(last, _read(root / "offsets" / str(last)), f"{root}/offsets/{last}")
            if last is not None
            else None
        )
        sources = []
        n_sources = len(entry.sources) if entry else (1 if src is not None else 0)
        for i in range(n_sources):
            offset = entry.sources[i] if entry else None
            if i in file_sources and src is not None:
                names = logs.sources.get(i, ())
                taken = self._source_entries(root / "sources" / str(i), names, last) if last is not None else []
                in_batch = [e.path for e in taken if e.batch == last]
                pending = self._pending(src, {e.path for e in taken}) if last is not None else None
                sources.append(
                    SourceOffsets(
                        i,
                        "files",
                        str(src),
                        offset,
                        tuple(in_batch[: ck.SHOWN_FILES]),
                        len(in_batch),
                        len(taken),
                        pending,
                    )
                )
            else:
                sources.append(SourceOffsets(i, p.source.type, None, offset))
        return OffsetsView(
            task_id,
            spec.state,
            str(root),
            True,
            query_id=query_id,
            last_committed=last,
            committed_at=entry.timestamp_ms / 1000.0 if entry else None,
            last_planned=logs.last_planned,
            earliest=logs.earliest,
            sources=tuple(sources),
            sink=str(sink) if sink else None,
            sink_last_batch=logs.sink[-1].batch if logs.sink else None,
            rows_since_start=rows,
            stateful=logs.stateful,
        )

    def _pending(self, src: Path, taken: set[str]) -> int | None:
        files = self._listed(src)
        return None if files is None else sum(1 for uri, _ts in files if uri not in taken)

    @staticmethod
    def _listed(src: Path) -> list[tuple[str, int]] | None:
        """The files a file source would see (hidden and ``_`` names skipped, as Spark does), as URIs with their
        modification time in ms; None where the directory is not readable from here or too large to list."""
        out: list[tuple[str, int]] = []

        def walk(d: Path, depth: int) -> Iterator[os.DirEntry[str]]:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith((".", "_")):
                        continue
                    if e.is_dir(follow_symlinks=False) and depth < 8:
                        yield from walk(Path(e.path), depth + 1)
                    elif e.is_file():
                        yield e

        try:
            for e in walk(src, 0):
                out.append((Path(e.path).absolute().as_uri(), int(e.stat().st_mtime * 1000)))
                if len(out) > MAX_LISTED:
                    return None
        except OSError:
            return None
        return out

    def _rows_since_start(self, task_id: str) -> int | None:
        path = self.layout.status(task_id)
        got, _ = self.reads.wave([path])
        status, _err = decode_read(codecs.TaskStatus, got[0], path)
        rows = status.metrics.get("rows") if status is not None else None
        return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None

    # ---- reset --------------------------------------------------------------------------------------
    def reset_offsets(self, task_id: str, target: ResetTarget, dry_run: bool = False) -> ResetResult:
        """Move the task's checkpoint (and its file sink's log with it) to ``target``; refused unless the task
        is STOPPED and confirmed stopped. Everything is checked and planned before anything is written; the
        reset is recorded in the task's history, and a resume waits for it to finish."""
        spec, spec_stat, deleting = self.reads.spec(task_id)
        if deleting:
            raise Conflict(f"task {task_id!r} is being deleted")
        p = _streaming(spec)
        self.require_stopped(task_id)
        root = self.checkpoint_of(task_id)
        src, sink, file_sources = self._paths(p)
        notes: list[str] = []
        if not root.is_dir():
            if not target.earliest:
                raise CheckpointError(
                    f"no checkpoint at {root} (checkpoint root {self.checkpoint_root}, as seen from here): "
                    "nothing to rewind"
                )
            notes.append(f"no checkpoint at {root}: the next start reads from the beginning anyway")
        logs = self._logs(root, sink, file_sources) if root.is_dir() else CheckpointLogs((), (), {}, None)
        if target.earliest:
            plan = ck.plan_to_earliest(logs)
        elif target.batch is not None:
            plan = ck.plan_to_batch(logs, target.batch)
        else:
            plan = self._plan_latest(root, logs, src, sink)
        sink_files = self._sink_files(sink, plan) if sink is not None else []
        result = ResetResult(
            task_id,
            plan.target,
            plan.position,
            dry_run,
            plan.remove_logs,
            tuple(name for name, _ in plan.write),
            plan.sink_batches_removed,
            len(sink_files),
            tuple(notes),
        )
        if dry_run:
            return result
        self._begin_reset(task_id, spec_stat.version)
        try:
            self._apply(root, sink, plan, sink_files)
        except OSError as exc:
            self.record(task_id, "reset-offsets", f"to {plan.target} FAILED part-way: {exc}", end_reset=True)
            raise AdminError(f"task {task_id!r}: the reset failed part-way ({exc}); run it again") from None
        detail = f"to {plan.target}: position {plan.position}" + (
            f", sink batches {plan.sink_batches_removed[0]}-{plan.sink_batches_removed[-1]} removed"
            f" ({len(sink_files)} files)"
            if plan.sink_batches_removed
            else ""
        )
        self.record(task_id, "reset-offsets", detail, end_reset=True)
        return result

    def _plan_latest(self, root: Path, logs: CheckpointLogs, src: Path | None, sink: Path | None) -> ck.ResetPlan:
        last = logs.last_committed
        if last is None or src is None:
            raise CheckpointError(
                "--to-latest needs a file source and a committed batch: start the task once"
                if src is not None
                else "--to-latest works on file sources (a rate source has no backlog to skip)"
            )
        entry = ck.parse_offsets(last, _read(root / "offsets" / str(last)), f"{root}/offsets/{last}")
        if not all(isinstance(s, dict) and isinstance(s.get("logOffset"), int) for s in entry.sources):
            raise CheckpointError("--to-latest needs every source to be a file source")
        new = last + 1
        taken = self._source_entries(root / "sources" / "0", logs.sources.get(0, ()), last)
        listed = self._listed(src)
        if listed is None:
            raise CheckpointError(
                f"source directory {src} cannot be listed from here (or holds over {MAX_LISTED:,} files)"
            )
        seen = {e.path for e in taken}
        pending = sorted((uri, ts) for uri, ts in listed if uri not in seen)
        sink_entries = None
        if logs.sink is not None and sink is not None and ck.is_compaction(new, 10):
            sink_entries = self._sink_entries(sink / "_spark_metadata", logs.sink)
        latest = ck.LatestInputs(entry, {0: pending}, {0: taken}, sink_entries)
        return ck.plan_to_latest(logs, latest, int(time.time() * 1000))

    def _sink_files(self, sink: Path, plan: ck.ResetPlan) -> list[Path]:
        """The data files the removed sink batches committed (to earliest: every file its log names), inside the
        sink directory only: a log naming a file elsewhere is not followed."""
        log_dir = sink / "_spark_metadata"
        if not log_dir.is_dir():
            return []
        if plan.position < 0:
            entries = self._sink_entries(log_dir, tuple(ck.log_names(_names(log_dir), str(log_dir))))
        else:
            entries = []
            for b in plan.sink_batches_removed:
                f = log_dir / str(b)
                if f.is_file():
                    entries += ck.parse_sink_log(_read(f), str(f))
        base = sink.resolve()
        out: set[Path] = set()
        for e in entries:
            try:
                p = local_path(e.path, "sink file").resolve()
            except (CheckpointError, OSError, ValueError):
                continue
            if e.action == "add" and p != base and p.is_relative_to(base):
                out.add(p)
        return sorted(out)

    def _begin_reset(self, task_id: str, spec_version: int) -> None:
        """One multi: the spec checked at the version read (still STOPPED: a resume since then fails the reset)
        and the history marked ``resetting`` (a resume after it fails its check of the history's version, looks
        again and waits). The spec itself is not rewritten: its zxid stays the stop's, which ``stop_state``
        compares with the group's."""
        ensure_layout(self.client, self.layout)
        now = time.time()
        for _ in range(10):
            path, data, version = self._history_op(task_id, lambda h: replace(h, resetting=now))
            t = self.client.transaction()
            t.check(self.layout.task(task_id), spec_version)
            if version is None:
                t.create(path, data)
            else:
                t.set_data(path, data, version=version)
            results = t.commit()
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if not failed:
                return
            if isinstance(results[1], NoNodeError):
                raise AdminError(
                    f"task {task_id!r}: nothing was reset: {self.layout.admin_task_history} is missing (a secured "
                    "root laid out by an earlier release: run `zkctl security init`)"
                )
            if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
                raise Conflict(f"task {task_id!r} changed during the reset (resumed?); nothing was reset")
        raise AdminError(f"task {task_id!r}: its history kept changing; nothing was reset")

    @staticmethod
    def _apply(root: Path, sink: Path | None, plan: ck.ResetPlan, sink_files: list[Path]) -> None:
        """Carry a plan out, in the order that leaves readers a consistent sink if it is cut short: the sink's
        log first (readers stop seeing the removed batches' files), then the checkpoint, the files written (a
        batch's commit last), and the removed batches' data files at the end. Run again, a reset cut short
        completes; data files it had not reached stay behind unlisted, which readers through the log skip."""

        def where(rel: str) -> Path:
            if rel.startswith("sink:"):
                assert sink is not None
                return sink / rel[len("sink:") :]
            return root / rel if rel else root

        def remove(rels: list[str]) -> None:
            for rel in sorted((r for r in rels if r in plan.remove_logs), reverse=True):
                _remove_file(where(rel))
            for rel in (r for r in rels if r in plan.remove_dirs):
                if where(rel).is_dir():
                    shutil.rmtree(where(rel))

        every = list(plan.remove_logs) + list(plan.remove_dirs)
        remove([r for r in every if r.startswith("sink:")])
        remove([r for r in every if not r.startswith("sink:")])
        for rel, data in plan.write:
            _write_file(where(rel), data)
        for f in sink_files:
            _remove_file(f)


def _append(action: str, detail: str, end_reset: bool) -> Callable[[codecs.TaskHistory], codecs.TaskHistory]:
    def change(h: codecs.TaskHistory) -> codecs.TaskHistory:
        events = (*h.events, codecs.HistoryEvent(time.time(), action, detail[:500]))[-codecs.HISTORY_EVENTS :]
        return codecs.TaskHistory(events, None if end_reset else h.resetting)

    return change
