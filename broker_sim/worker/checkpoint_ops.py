"""A task's checkpoint on this broker's disk, as the storage requests use it: its offsets, a reset, a purge,
its size. Each call gets one :class:`Budget` (bytes, entries, time) that every file operation is charged to.

The caller (``storage_service``) has checked the request against ZooKeeper (the task STOPPED at the version
the operator checked, no owner); here only files. Parsing and plans are ``controller.protocol.tasks.checkpoints``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from broker_sim.worker import checkpoint_files as files
from broker_sim.worker.checkpoint_files import MAX_LISTED, local_path, read_file
from broker_sim.worker.safe_files import Budget, SafeDir
from controller.protocol.cluster.layout import check_name
from controller.protocol.tasks import checkpoints as ck
from controller.protocol.tasks.checkpoints import CheckpointError, CheckpointLogs
from controller.protocol.tasks.spec import SparkPipeline
from controller.protocol.tasks.storage import CheckpointSize, OffsetsView, ResetResult, SourceOffsets


class CheckpointStore:
    """The checkpoints under this broker's (cluster-scoped) checkpoint root."""

    def __init__(self, root: str, broker_id: str) -> None:
        self.root = root
        self.broker_id = broker_id
        self.local = "://" not in root

    @contextmanager
    def _root(self, budget: Budget) -> Iterator[SafeDir | None]:
        if not self.local:
            raise CheckpointError(
                f"the checkpoint root {self.root} is not a local directory: this broker does not read it "
                "(use Spark's tools where it is mounted)"
            )
        d = SafeDir.open(local_path(self.root, "checkpoint root"), budget)
        try:
            yield d
        finally:
            if d is not None:
                d.close()

    def path_of(self, task_id: str) -> str:
        return f"{self.root.rstrip('/')}/{check_name('task id', task_id)}"

    def holds(self, task_id: str) -> bool:
        """Whether anything is at the task's checkpoint path here (a link or a file there is this broker's to
        report, and refuse)."""
        if not self.local:
            return False
        with self._root(Budget()) as root:
            return root is not None and root.kind(check_name("task id", task_id)) is not None

    def size(self, task_id: str, budget: Budget) -> CheckpointSize:
        with self._root(budget) as root:
            if root is None:
                return CheckpointSize(self.path_of(task_id), False, broker=self.broker_id)
            got = files.measure(root, check_name("task id", task_id), budget)
        return CheckpointSize(got.path, got.exists, got.bytes, got.files, got.complete, self.broker_id)

    def purge(self, task_id: str, budget: Budget) -> CheckpointSize:
        """Remove a deleted task's checkpoint (what it held is returned; a link there is refused)."""
        size = self.size(task_id, budget)
        if size.exists:
            with self._root(budget) as root:
                assert root is not None
                root.rmtree(task_id)
        return size

    def offsets(self, task_id: str, p: SparkPipeline, state: str, rows: int | None, budget: Budget) -> OffsetsView:
        """What the checkpoint says: per source the last committed batch's offset and files, when it was
        planned, how many files wait; the oldest batch kept."""
        path = self.path_of(task_id)
        where = files.pipeline_files(p)
        with self._root(budget) as root:
            chk = root.sub(task_id) if root is not None else None
            if chk is None:
                note = f"no checkpoint at {path} on broker {self.broker_id}: the task has not committed a batch yet"
                return OffsetsView(task_id, state, path, False, rows_since_start=rows, note=note, broker=self.broker_id)
            with chk, self._sink(where, budget) as sink:
                logs = files.read_logs(chk, sink, where.file_sources)
                query_id = (
                    ck.parse_metadata(read_file(chk, "metadata"), f"{path}/metadata")
                    if files.is_file(chk, "metadata")
                    else None
                )
                last = logs.last_committed
                if last is not None and not files.is_file(chk, f"offsets/{last}"):
                    raise CheckpointError(f"{path}: batch {last} is committed but its offsets are missing")
                entry = (
                    ck.parse_offsets(last, read_file(chk, f"offsets/{last}"), f"{path}/offsets/{last}")
                    if last is not None
                    else None
                )
                sources = []
                n_sources = len(entry.sources) if entry else (1 if where.source is not None else 0)
                for i in range(n_sources):
                    offset = entry.sources[i] if entry else None
                    if i in where.file_sources and where.source is not None:
                        names = logs.sources.get(i, ())
                        taken = files.source_entries(chk, i, names, last) if last is not None else []
                        in_batch = [e.path for e in taken if e.batch == last]
                        pending = (
                            files.pending_count(where.source, {e.path for e in taken}, budget)
                            if last is not None
                            else None
                        )
                        sources.append(
                            SourceOffsets(
                                i,
                                "files",
                                where.source,
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
            state,
            path,
            True,
            query_id=query_id,
            last_committed=last,
            committed_at=entry.timestamp_ms / 1000.0 if entry else None,
            last_planned=logs.last_planned,
            earliest=logs.earliest,
            sources=tuple(sources),
            sink=where.sink,
            sink_last_batch=logs.sink[-1].batch if logs.sink else None,
            rows_since_start=rows,
            stateful=logs.stateful,
            broker=self.broker_id,
        )

    @contextmanager
    def _sink(self, where: files.PipelineFiles, budget: Budget) -> Iterator[SafeDir | None]:
        d = SafeDir.open(where.sink, budget) if where.sink is not None else None
        try:
            yield d
        finally:
            if d is not None:
                d.close()

    def reset(
        self, task_id: str, p: SparkPipeline, target: str, batch: int | None, dry_run: bool, budget: Budget
    ) -> ResetResult:
        """Move the checkpoint (and its file sink's log with it) to ``target``: everything is read and planned
        before anything is written."""
        path = self.path_of(task_id)
        where = files.pipeline_files(p)
        notes: list[str] = []
        with self._root(budget) as root:
            chk = root.sub(task_id) if root is not None else None
            if chk is None and target != "earliest":
                raise CheckpointError(f"no checkpoint at {path} on broker {self.broker_id}: nothing to rewind")
            if chk is None:
                notes.append(f"no checkpoint at {path}: the next start reads from the beginning anyway")
            with self._sink(where, budget) as sink:
                try:
                    logs = (
                        files.read_logs(chk, sink, where.file_sources)
                        if chk is not None
                        else CheckpointLogs((), (), {}, None)
                    )
                    if target == "earliest":
                        plan = ck.plan_to_earliest(logs)
                        if chk is None:
                            plan = ck.ResetPlan(plan.target, plan.position, remove_dirs=(), remove_logs=())
                    elif target == "batch":
                        assert batch is not None
                        plan = ck.plan_to_batch(logs, batch)
                    else:
                        assert chk is not None
                        plan = self._plan_latest(chk, logs, where, sink, budget)
                    data_files = files.sink_files(sink, plan) if sink is not None else []
                    result = ResetResult(
                        task_id,
                        plan.target,
                        plan.position,
                        dry_run,
                        plan.remove_logs,
                        tuple(name for name, _ in plan.write),
                        plan.sink_batches_removed,
                        len(data_files),
                        tuple(notes),
                        self.broker_id,
                    )
                    if not dry_run:
                        assert root is not None or not (plan.remove_dirs or plan.remove_logs or plan.write)
                        if root is not None:
                            files.apply_plan(root, task_id, sink, plan, data_files)
                finally:
                    if chk is not None:
                        chk.close()
        return result

    def _plan_latest(
        self, chk: SafeDir, logs: CheckpointLogs, where: files.PipelineFiles, sink: SafeDir | None, budget: Budget
    ) -> ck.ResetPlan:
        last = logs.last_committed
        if last is None or where.source is None:
            raise CheckpointError(
                "--to-latest needs a file source and a committed batch: start the task once"
                if where.source is not None
                else "--to-latest works on file sources (a rate source has no backlog to skip)"
            )
        entry = ck.parse_offsets(last, read_file(chk, f"offsets/{last}"), f"{chk.path}/offsets/{last}")
        if not all(isinstance(s, dict) and isinstance(s.get("logOffset"), int) for s in entry.sources):
            raise CheckpointError("--to-latest needs every source to be a file source")
        new = last + 1
        taken = files.source_entries(chk, 0, logs.sources.get(0, ()), last)
        listed = files.listed_files(where.source, budget)
        if listed is None:
            raise CheckpointError(
                f"source directory {where.source} cannot be listed on broker {self.broker_id} "
                f"(or holds over {MAX_LISTED:,} files)"
            )
        seen = {e.path for e in taken}
        pending = sorted((uri, ts) for uri, ts in listed if uri not in seen)
        entries = None
        if logs.sink is not None and sink is not None and ck.is_compaction(new, 10):
            entries = files.sink_entries(sink, logs.sink)
        latest = ck.LatestInputs(entry, {0: pending}, {0: taken}, entries)
        return ck.plan_to_latest(logs, latest, int(time.time() * 1000))
