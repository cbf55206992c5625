"""A task's checkpoint and log through the cluster: ``offsets``, ``reset_offsets``, the checkpoint's size,
its purge, and ``logs``. None of them opens a file here: each is a storage request written to ZooKeeper
(``/admin/storage/<task>``) that a broker holding the task's storage carries out and answers
(``broker_sim.worker.storage_service``); this part asks, waits (bounded) and returns the answer. So they work
from any directory and from a host that cannot see the checkpoints.

Whom it asks: the task's owner, else the broker that ran it last, if live; else any live broker whose
checkpoint root holds the checkpoint. A reset needs the task STOPPED (``task_stop``), marks the history
``resetting`` while it runs and records its outcome there (``task_history``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar, cast

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from controller.admin.common import AdminError, Conflict, NotFound, ensure_layout, wait_watched
from controller.admin.reads import ClusterReads, decode_read
from controller.admin.task_history import Recorder
from controller.admin.task_stop import StopState
from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.records import codecs, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError, coerce
from controller.protocol.tasks.checkpoints import CheckpointError
from controller.protocol.tasks.spec import SparkPipeline, TaskSpec
from controller.protocol.tasks.storage import (
    MAX_TIMEOUT_S,
    CheckpointSize,
    LogLines,
    OffsetsView,
    ResetResult,
    ResetTarget,
    StorageError,
    StorageMiss,
    StorageRequest,
    StorageResult,
    StorageTimeout,
    addressed_broker,
)

T = TypeVar("T")

#: how long a request waits by default
DEFAULT_TIMEOUT_S = 30.0
#: how long ``describe`` waits for a checkpoint's size (it shows "unknown" past it)
SIZE_TIMEOUT_S = 3.0

_ERRORS: dict[str, type[Exception]] = {
    "invalid_checkpoint": CheckpointError,
    "conflict": Conflict,
    "not_found": NotFound,
}


def _streaming(spec: TaskSpec) -> SparkPipeline:
    p = spec.pipeline
    if not isinstance(p, SparkPipeline) or p.mode != "streaming":
        raise Conflict(f"task {spec.id!r} is not a streaming spark pipeline: it has no offsets")
    return p


class OffsetAdmin:
    """The storage part of ``AdminClient``: requests answered by the brokers."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        *,
        require_stopped: Callable[[str], StopState],
        record: Recorder,
        begin_reset: Callable[[str, int], None],
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        #: the stop part's check that the task is STOPPED and runs nowhere
        self.require_stopped = require_stopped
        #: the history part's append and its mark of a reset under way
        self.record = record
        self.begin_reset = begin_reset

    # ---- the request ----------------------------------------------------------------------------------
    def _live_brokers(self) -> dict[str, str | None]:
        """Live brokers and their checkpoint roots (a registration that does not decode is left out)."""
        _, kids = self.reads.wave(children=[self.layout.broker_ids])
        names = []
        for n in kids[0] or []:
            try:
                names.append(check_name("broker id", n))
            except ValueError:
                continue
        paths = [self.layout.broker(n) for n in names]
        got, _ = self.reads.wave(paths)
        out: dict[str, str | None] = {}
        for n, p, res in zip(names, paths, got, strict=True):
            info, _err = decode_read(registration_records.BrokerInfo, res, p)
            if info is not None:
                out[n] = info.checkpoint_root
        return out

    def _whom(self, task_id: str, live: dict[str, str | None]) -> str | None:
        owner_p, status_p = self.layout.task_owner(task_id), self.layout.status(task_id)
        got, _ = self.reads.wave([owner_p, status_p])
        owner, _ = decode_read(task_records.OwnerInfo, got[0], owner_p)
        status, _ = decode_read(task_records.TaskStatus, got[1], status_p)
        serving = [b for b, root in live.items() if root is not None]
        return addressed_broker(owner.broker if owner else None, status.broker if status else None, serving)

    def _withdraw(self, path: str) -> None:
        try:
            self.client.delete(path, recursive=True)
        except NoNodeError:
            pass

    def _clear_stale(self, task_id: str) -> None:
        """A request of an earlier caller that is past its deadline (or unreadable) is removed; a live one is
        another caller's: refused."""
        path = self.layout.storage_request(task_id)
        try:
            data, _stat = self.client.get(path)
        except NoNodeError:
            return
        try:
            old = codecs.decode(StorageRequest, data, path)
        except PayloadError:
            self._withdraw(path)
            return
        if time.time() > old.deadline:
            self._withdraw(path)
            return
        raise Conflict(
            f"task {task_id!r}: another {old.kind} request is under way (until "
            f"{time.strftime('%H:%M:%S', time.localtime(old.deadline))}); try again then"
        )

    def request(self, kind: str, task_id: str, timeout: float, **params: Any) -> dict[str, Any]:
        """Write the request, wait for its answer (bounded by ``timeout``), withdraw it, return the answer's body
        or raise the broker's error as ours."""
        check_name("task id", task_id)
        if not 0 < timeout <= MAX_TIMEOUT_S:
            raise AdminError(f"--timeout must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds")
        ensure_layout(self.client, self.layout)
        live = self._live_brokers()
        serving = {b for b, root in live.items() if root is not None}
        if not serving:
            raise StorageError(
                "no live broker serves checkpoint storage (brokers run with a checkpoint root answer these "
                "requests): start a broker"
            )
        broker = self._whom(task_id, live)
        now = time.time()
        req = StorageRequest(uuid.uuid4().hex, kind, task_id, now, now + timeout, broker=broker, **params)
        self._clear_stale(task_id)
        path = self.layout.storage_request(task_id)
        try:
            self.client.create(path, codecs.encode(req))
        except NodeExistsError:
            raise Conflict(f"task {task_id!r}: another storage request is under way; try again") from None
        except NoNodeError:
            raise AdminError(
                f"{self.layout.admin_storage} is missing (a secured root laid out by an earlier release: run "
                "`zkctl security init`)"
            ) from None
        result: list[StorageResult] = []
        misses: set[str] = set()

        def answered(watch: Any) -> bool:
            rp = self.layout.storage_result(task_id)
            data = None
            if self.client.exists(rp, watch=watch) is not None:  # an exists watch fires when it is created
                try:
                    data, _ = self.client.get(rp)
                except NoNodeError:
                    pass
            if data is not None:
                got = codecs.decode(StorageResult, data, rp)
                if got.request_id == req.request_id and (broker is None or got.broker == broker):
                    result.append(got)
                    return True
            if broker is None:
                try:
                    kids = self.client.get_children(path, watch=watch)
                except NoNodeError:
                    kids = []
                for k in kids:
                    if k.startswith("miss-") and k[5:] not in misses:
                        try:
                            miss = codecs.decode(StorageMiss, self.client.get(f"{path}/{k}")[0], f"{path}/{k}")
                        except (NoNodeError, PayloadError):
                            continue
                        if miss.request_id == req.request_id:
                            misses.add(miss.broker)
                return serving <= misses
            return False

        try:
            wait_watched(answered, timeout)
        except PayloadError as exc:
            raise StorageError(f"task {task_id!r}: the broker's answer is unreadable: {exc}") from None
        finally:
            self._withdraw(path)
        if not result:
            if broker is None and serving <= misses:
                raise CheckpointError(
                    f"task {task_id!r}: no live broker holds its checkpoint (asked {', '.join(sorted(misses))}; "
                    "roots: " + ", ".join(sorted({str(live[b]) for b in misses})) + ")"
                )
            who = f"broker {broker}" if broker else "no broker holding its checkpoint"
            raise StorageTimeout(f"task {task_id!r}: {who} answered the {kind} request in {timeout:g}s")
        got = result[0]
        if not got.ok:
            raise _ERRORS.get(got.code or "", StorageError)(f"broker {got.broker}: {got.error}")
        return got.body

    @staticmethod
    def _as(cls: type[T], body: dict[str, Any], what: str) -> T:
        try:
            return cast(T, coerce(cls, body, "<answer>", what))
        except PayloadError as exc:
            raise StorageError(f"the broker's {what} is malformed: {exc}") from None

    # ---- the operations -------------------------------------------------------------------------------
    def checkpoint_size(self, task_id: str, timeout: float = SIZE_TIMEOUT_S) -> CheckpointSize:
        """Bytes and files under the checkpoint (a bounded walk on the broker; ``complete`` False: partial)."""
        return self._as(CheckpointSize, self.request("size", task_id, timeout), "checkpoint size")

    def purge_checkpoint(self, task_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> CheckpointSize:
        """Remove the checkpoint of a deleted task (what it held is returned); a task that exists is refused."""
        if self.client.exists(self.layout.task(task_id)) is not None:
            raise Conflict(f"task {task_id!r} exists: its checkpoint is removed only once it is deleted")
        try:
            return self._as(CheckpointSize, self.request("purge", task_id, timeout), "purge")
        except CheckpointError as exc:
            if "no live broker holds its checkpoint" in str(exc):
                return CheckpointSize(f"<checkpoint root>/{task_id}", False)
            raise AdminError(f"task {task_id!r} is deleted; its checkpoint was not removed: {exc}") from None
        except StorageError as exc:
            raise AdminError(f"task {task_id!r} is deleted; its checkpoint was not removed: {exc}") from None

    def purge_note(self, task_id: str) -> str:
        """``purge_checkpoint`` as a note for the deletion's answer."""
        size = self.purge_checkpoint(task_id)
        if not size.exists:
            return f"no checkpoint of {task_id} on any live broker to remove"
        return f"checkpoint {size.path} removed on broker {size.broker} ({size.bytes:,} bytes in {size.files:,} files)"

    def offsets(self, task_id: str, timeout: float = DEFAULT_TIMEOUT_S) -> OffsetsView:
        """What the task's checkpoint says (read by its broker); the rows its owner reported since it started."""
        spec, _stat, _ = self.reads.spec(task_id)
        _streaming(spec)
        view: OffsetsView = self._as(OffsetsView, self.request("offsets", task_id, timeout), "offsets")
        return replace(view, rows_since_start=self._rows_since_start(task_id))

    def _rows_since_start(self, task_id: str) -> int | None:
        path = self.layout.status(task_id)
        got, _ = self.reads.wave([path])
        status, _err = decode_read(task_records.TaskStatus, got[0], path)
        rows = status.metrics.get("rows") if status is not None else None
        return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows >= 0 else None

    def reset_offsets(
        self, task_id: str, target: ResetTarget, dry_run: bool = False, timeout: float = DEFAULT_TIMEOUT_S
    ) -> ResetResult:
        """Move the task's checkpoint (and its file sink's log with it) to ``target``; refused unless the task
        is STOPPED and confirmed stopped. The broker checks and plans everything before it writes; the reset
        is recorded in the task's history, and a resume waits for it to finish."""
        spec, spec_stat, deleting = self.reads.spec(task_id)
        if deleting:
            raise Conflict(f"task {task_id!r} is being deleted")
        _streaming(spec)
        self.require_stopped(task_id)
        params = {"target": target.name, "batch": target.batch, "spec_version": spec_stat.version}
        deadline = time.monotonic() + timeout
        # planned first without a write: a reset refused (a batch not kept, garbage in a log) changes nothing
        # and is not recorded; only then is the history marked and the reset carried out
        plan = self._as(ResetResult, self.request("reset", task_id, timeout, dry_run=True, **params), "reset")
        if dry_run:
            return plan
        timeout = max(0.1, deadline - time.monotonic())
        self.begin_reset(task_id, spec_stat.version)
        try:
            r = self._as(ResetResult, self.request("reset", task_id, timeout, dry_run=False, **params), "reset")
        except StorageTimeout as exc:
            self.record(task_id, "reset-offsets", f"to {target.name} unanswered: {exc}", end_reset=False)
            raise
        except Exception as exc:
            self.record(task_id, "reset-offsets", f"to {target.name} FAILED: {exc}", end_reset=True)
            raise
        detail = f"to {r.target}: position {r.position} (broker {r.broker})" + (
            f", sink batches {r.sink_batches_removed[0]}-{r.sink_batches_removed[-1]} removed"
            f" ({r.sink_files_removed} files)"
            if r.sink_batches_removed
            else ""
        )
        self.record(task_id, "reset-offsets", detail, end_reset=True)
        return r

    def logs(
        self, task_id: str, tail: int = 100, since: int | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ) -> LogLines:
        """The last ``tail`` lines of the pipeline's own log (or those after byte ``since``: a follow), from the
        broker that runs or last ran it."""
        return self._as(LogLines, self.request("logs", task_id, timeout, tail=tail, since=since), "log")
