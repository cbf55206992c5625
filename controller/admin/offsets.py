"""A task's offsets as operations: ``offsets`` (what its Spark checkpoint says), ``reset_offsets`` (earliest,
latest, a batch), the checkpoint's size and purge.

The checkpoint is read where it lives: ``<checkpoint root>/<task id>`` on a local or mounted file system, the
same root the brokers were given (``--checkpoint-root``). A root that is a Hadoop URL other than ``file:`` is
not read from here (``zkctl`` has no Hadoop client); a root not mounted where ``zkctl`` runs reads as "no
checkpoint at <path>". The parsing and the reset plans are ``controller.protocol.tasks.checkpoints`` (pure), the
files ``checkpoint_files``; a reset needs the task stopped (``task_stop``) and is recorded in its history
(``task_history``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from controller.admin import checkpoint_files as files
from controller.admin.checkpoint_files import MAX_LISTED, CheckpointSize, default_checkpoint_root, local_path, read_log
from controller.admin.common import AdminError, Conflict
from controller.admin.reads import ClusterReads, decode_read
from controller.admin.task_history import Recorder
from controller.admin.task_stop import StopState
from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.records import task_records
from controller.protocol.tasks import checkpoints as ck
from controller.protocol.tasks.checkpoints import CheckpointError, CheckpointLogs
from controller.protocol.tasks.spec import SparkPipeline, TaskSpec


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


class OffsetAdmin:
    """The offsets part of ``AdminClient``. ``checkpoint_root`` is where the brokers keep checkpoints, as seen
    from this process."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        checkpoint_root: str | None = None,
        *,
        require_stopped: Callable[[str], StopState],
        record: Recorder,
        begin_reset: Callable[[str, int], None],
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        self.checkpoint_root = checkpoint_root or default_checkpoint_root()
        #: the stop part's check that the task is STOPPED and runs nowhere
        self.require_stopped = require_stopped
        #: the history part's append and its mark of a reset under way
        self.record = record
        self.begin_reset = begin_reset

    # ---- the checkpoint ---------------------------------------------------------------------------
    def checkpoint_of(self, task_id: str) -> Path:
        return local_path(self.checkpoint_root, "checkpoint root") / check_name("task id", task_id)  # one segment

    def checkpoint_size(self, task_id: str) -> CheckpointSize:
        """Bytes and files under the checkpoint (bounded walk); ``exists`` False where it is not seen from here."""
        return files.measure(self.checkpoint_of(task_id))

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

    def offsets(self, task_id: str) -> OffsetsView:
        """What the task's checkpoint says: per source the last committed batch's offset and files, when it was
        planned, how many files wait; the oldest batch kept; the rows its owner reported since it started."""
        spec, _stat, _ = self.reads.spec(task_id)
        p = _streaming(spec)
        root = self.checkpoint_of(task_id)
        src, sink, file_sources = files.pipeline_paths(p)
        rows = self._rows_since_start(task_id)
        if not root.is_dir():
            note = (
                f"no checkpoint at {root}: the task has not committed a batch yet, or the checkpoint root "
                f"{self.checkpoint_root} is not where the brokers keep it (--checkpoint-root, ZKC_CHECKPOINT_ROOT)"
            )
            return OffsetsView(task_id, spec.state, str(root), False, rows_since_start=rows, note=note)
        logs = files.read_logs(root, sink, file_sources)
        meta = root / "metadata"
        query_id = None
        if meta.is_file():
            query_id = ck.parse_metadata(read_log(meta), str(meta))
        last = logs.last_committed
        if last is not None and not (root / "offsets" / str(last)).is_file():
            raise CheckpointError(f"{root}: batch {last} is committed but its offsets are missing")
        entry = (
            ck.parse_offsets(last, read_log(root / "offsets" / str(last)), f"{root}/offsets/{last}")
            if last is not None
            else None
        )
        sources = []
        n_sources = len(entry.sources) if entry else (1 if src is not None else 0)
        for i in range(n_sources):
            offset = entry.sources[i] if entry else None
            if i in file_sources and src is not None:
                names = logs.sources.get(i, ())
                taken = files.source_entries(root / "sources" / str(i), names, last) if last is not None else []
                in_batch = [e.path for e in taken if e.batch == last]
                pending = files.pending_count(src, {e.path for e in taken}) if last is not None else None
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

    def _rows_since_start(self, task_id: str) -> int | None:
        path = self.layout.status(task_id)
        got, _ = self.reads.wave([path])
        status, _err = decode_read(task_records.TaskStatus, got[0], path)
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
        src, sink, file_sources = files.pipeline_paths(p)
        notes: list[str] = []
        if not root.is_dir():
            if not target.earliest:
                raise CheckpointError(
                    f"no checkpoint at {root} (checkpoint root {self.checkpoint_root}, as seen from here): "
                    "nothing to rewind"
                )
            notes.append(f"no checkpoint at {root}: the next start reads from the beginning anyway")
        logs = files.read_logs(root, sink, file_sources) if root.is_dir() else CheckpointLogs((), (), {}, None)
        if target.earliest:
            plan = ck.plan_to_earliest(logs)
        elif target.batch is not None:
            plan = ck.plan_to_batch(logs, target.batch)
        else:
            plan = self._plan_latest(root, logs, src, sink)
        sink_files = files.sink_files(sink, plan) if sink is not None else []
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
        self.begin_reset(task_id, spec_stat.version)
        try:
            files.apply_plan(root, sink, plan, sink_files)
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
        entry = ck.parse_offsets(last, read_log(root / "offsets" / str(last)), f"{root}/offsets/{last}")
        if not all(isinstance(s, dict) and isinstance(s.get("logOffset"), int) for s in entry.sources):
            raise CheckpointError("--to-latest needs every source to be a file source")
        new = last + 1
        taken = files.source_entries(root / "sources" / "0", logs.sources.get(0, ()), last)
        listed = files.listed_files(src)
        if listed is None:
            raise CheckpointError(
                f"source directory {src} cannot be listed from here (or holds over {MAX_LISTED:,} files)"
            )
        seen = {e.path for e in taken}
        pending = sorted((uri, ts) for uri, ts in listed if uri not in seen)
        sink_entries = None
        if logs.sink is not None and sink is not None and ck.is_compaction(new, 10):
            sink_entries = files.sink_entries(sink / "_spark_metadata", logs.sink)
        latest = ck.LatestInputs(entry, {0: pending}, {0: taken}, sink_entries)
        return ck.plan_to_latest(logs, latest, int(time.time() * 1000))
