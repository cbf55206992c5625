"""The broker's side of the storage requests (``/admin/storage/<task>``): offsets, reset, purge, size and logs
of the tasks whose checkpoint or log this broker holds, carried out on its own disk.

A request names the broker asked (the task's owner or the last broker that ran it) or none; an unnamed one is
taken by a broker whose checkpoint root holds the task's checkpoint (the ephemeral ``claim`` decides between
several), and the others say they do not hold it (``miss-<broker>``) so the caller need not wait out its
timeout. Each request is checked again here against ZooKeeper before anything is touched (a reset: the spec
STOPPED at the version the operator checked, no owner; a purge: the task gone), bounded in bytes, entries and
time (:class:`Budget`), and answered with one ``result`` znode. Garbage in a request is logged and skipped."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError

from broker_sim.worker.checkpoint_ops import CheckpointStore
from broker_sim.worker.safe_files import MAX_REQUEST_S, Budget
from broker_sim.worker.task_logs import TaskLogs
from controller.protocol.cluster.layout import InvalidName, ZkLayout, check_name
from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import SparkPipeline, TaskSpec, decode_task
from controller.protocol.tasks.storage import (
    MAX_RESULT_BYTES,
    StorageClaim,
    StorageMiss,
    StorageRequest,
    StorageResult,
    validate_request,
)

log = logging.getLogger(__name__)

#: seconds between two looks at the requests when no watch fired
POLL_S = 2.0
#: requests carried out at once
WORKERS = 2


class RequestRefused(ZkcError, ValueError):
    status = 409
    code = "conflict"


class StorageService:
    """Watches ``/admin/storage`` and answers the requests this broker can carry out."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, broker_id: str, store: CheckpointStore, logs: TaskLogs | None
    ) -> None:
        self.client = client
        self.layout = layout
        self.broker_id = broker_id
        self.store = store
        self.logs = logs
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._seen: dict[str, int] = {}  # task -> czxid of the request handled (or skipped) last
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=f"storage-{broker_id}")
        self._thread = threading.Thread(target=self._loop, name=f"storage-{broker_id}-watch", daemon=True)

    def start(self) -> StorageService:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():  # (a worker whose start failed never started it)
            self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- finding requests ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.clear()
            try:
                names = self.client.get_children(self.layout.admin_storage, watch=lambda _e: self._wake.set())
            except NoNodeError:
                names = []
            except KazooException as exc:
                log.debug("storage requests: %s", exc)
                names = []
            except Exception:  # the session is down, the client closing: look again later
                names = []
            for name in names[:10_000]:
                if self._stopped.is_set():
                    return
                self._consider(name)
            self._wake.wait(POLL_S)

    def _consider(self, task_id: str) -> None:
        try:
            check_name("task id", task_id)
        except InvalidName:
            if self._seen.get(task_id) != -1:
                log.warning("storage request %r: not a task id; ignored", task_id[:100])
                self._seen[task_id] = -1
            return
        with self._lock:
            if task_id in self._busy:
                return
        path = self.layout.storage_request(task_id)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return
        if self._seen.get(task_id) == stat.czxid:
            return
        self._seen[task_id] = stat.czxid
        try:
            req = codecs.decode(StorageRequest, data, path)
            reason = validate_request(req, task_id, time.time())
        except (PayloadError, InvalidName) as exc:
            log.warning("storage request %s is malformed; ignored: %s", path, exc)
            return
        if req.broker is not None and req.broker != self.broker_id:
            return
        if self.client.exists(self.layout.storage_result(task_id)) is not None:
            return
        if reason is not None:
            if req.broker == self.broker_id:
                self._answer(req, None, RequestRefused(f"request refused: {reason}"))
            else:
                log.warning("storage request %s refused: %s", path, reason)
            return
        if req.broker is None and not self._holds(req):
            self._miss(req)
            return
        try:
            self.client.create(
                self.layout.storage_claim(task_id),
                codecs.encode(StorageClaim(req.request_id, self.broker_id)),
                ephemeral=True,
            )
        except NodeExistsError:
            return  # another broker carries it out
        except NoNodeError:
            return  # withdrawn
        with self._lock:
            self._busy.add(task_id)
        self._pool.submit(self._run, req)

    def _holds(self, req: StorageRequest) -> bool:
        try:
            if req.kind == "logs":
                return self.logs is not None and self.logs.has(req.task_id)
            return self.store.holds(req.task_id)
        except ZkcError:
            return False

    def _miss(self, req: StorageRequest) -> None:
        try:
            self.client.create(
                self.layout.storage_miss(req.task_id, self.broker_id),
                codecs.encode(StorageMiss(req.request_id, self.broker_id, self.store.root)),
            )
        except (NodeExistsError, NoNodeError):
            pass

    # ---- carrying one out ----------------------------------------------------------------------------
    def _run(self, req: StorageRequest) -> None:
        try:
            body: Any = None
            error: Exception | None = None
            try:
                # four fifths of what the caller waits: a walk cut at its bound is still answered in time
                left = (req.deadline - time.time()) * 0.8
                body = self._execute(req, Budget(seconds=max(0.5, min(MAX_REQUEST_S, left))))
            except ZkcError as exc:
                error = exc
            except (OSError, KazooException) as exc:
                error = exc
            except Exception as exc:  # a bug of ours: answered, logged with its trace
                log.exception("storage request %s of %s failed", req.kind, req.task_id)
                error = exc
            self._answer(req, body, error)
        finally:
            with self._lock:
                self._busy.discard(req.task_id)

    def _spec(self, task_id: str) -> tuple[TaskSpec, Any]:
        path = self.layout.task(task_id)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise RequestRefused(f"unknown task {task_id!r}") from None
        return decode_task(data, path), stat

    def _execute(self, req: StorageRequest, budget: Budget) -> Any:
        t = req.task_id
        if req.kind == "logs":
            got = self.logs.read(t, self.broker_id, req.tail, req.since, budget) if self.logs is not None else None
            if got is None:
                raise RequestRefused(f"broker {self.broker_id} has no log of task {t!r}")
            return got
        if req.kind == "size":
            return self.store.size(t, budget)
        if req.kind == "purge":
            if self.client.exists(self.layout.task(t)) is not None:
                raise RequestRefused(f"task {t!r} exists: its checkpoint is removed only once it is deleted")
            return self.store.purge(t, budget)
        spec, stat = self._spec(t)
        p = spec.pipeline
        if not isinstance(p, SparkPipeline) or p.mode != "streaming":
            raise RequestRefused(f"task {t!r} is not a streaming spark pipeline: it has no offsets")
        if req.kind == "offsets":
            return self.store.offsets(t, p, spec.state, None, budget)
        # a reset: only of the spec the operator checked, still STOPPED, run by nobody
        if not req.dry_run:
            if stat.version != req.spec_version or spec.state != "STOPPED":
                raise RequestRefused(f"task {t!r} changed since the reset was asked (resumed?); nothing was reset")
            if self.client.exists(self.layout.task_owner(t)) is not None:
                raise RequestRefused(f"task {t!r} has an owner again; nothing was reset")
        assert req.target is not None
        return self.store.reset(t, p, req.target, req.batch, req.dry_run, budget)

    def _answer(self, req: StorageRequest, body: Any, error: Exception | None) -> None:
        result = StorageResult(
            req.request_id,
            self.broker_id,
            error is None,
            time.time(),
            error=None if error is None else (str(error) or type(error).__name__)[:2000],
            code=getattr(error, "code", "internal") if error is not None else None,
            body=codecs.to_jsonable(body) if body is not None else {},
        )
        data = codecs.encode(result)
        if len(data) > MAX_RESULT_BYTES:
            result = StorageResult(
                req.request_id, self.broker_id, False, time.time(), error="the answer is too large", code="too_large"
            )
            data = codecs.encode(result)
        try:
            self.client.create(self.layout.storage_result(req.task_id), data)
        except (NodeExistsError, NoNodeError):
            pass  # answered already, or withdrawn by its caller
        except KazooException as exc:
            log.warning("storage request %s of %s: the answer was not written: %s", req.kind, req.task_id, exc)


class StoragePart:
    """What a broker adds for its storage: the checkpoint store, the per-task logs and the request service
    (nothing at all without a checkpoint root)."""

    def __init__(
        self, client: KazooClient, layout: ZkLayout, broker_id: str, root: str | None, logs_dir: str | None
    ) -> None:
        self.logs = TaskLogs(logs_dir) if logs_dir is not None else None
        self.service = (
            StorageService(client, layout, broker_id, CheckpointStore(root, broker_id), self.logs)
            if root is not None
            else None
        )
        self._states: dict[str, tuple[str, str | None]] = {}

    def start(self) -> None:
        if self.logs is not None:
            self.logs.start()
        if self.service is not None:
            self.service.start()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.logs is not None:
            self.logs.stop()

    def on_status(self, task_id: str, state: str, error: str | None) -> None:
        """A status written: the task's log notes a change of state or error (and follows the task's records)."""
        if self.logs is None:
            return
        self.logs.track(task_id)
        if self._states.get(task_id) != (state, error):
            self._states[task_id] = (state, error)
            self.logs.note(task_id, f"state {state}" + (f": {error}" if error else ""))
