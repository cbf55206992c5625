"""``AdminClient``: every operator request over one kazoo client, usable from Python, the CLI and the HTTP
API. Its shared reads live here; the operations are in ``tasks`` and ``cluster``."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from controller.protocol import codecs
from controller.admin.cluster import ClusterOperations
from controller.admin.common import WAIT_S, AdminError, NotFound
from controller.admin.operations import OperationsAdmin
from controller.admin.restarts import RestartOperations
from controller.admin.tasks import TaskOperations
from controller.protocol.codecs import PayloadError
from controller.protocol.layout import ZkLayout
from controller.zk.layout_io import check_root, list_tasks
from controller.zk.io import multi_read
from controller.protocol.taskspec import TaskSpec, decode_task

# From this many znodes on, a read goes through multiRead (controller.zk.io.multi_read).
MULTI_READ_FROM = 8
# The stat of a znode we may not read: every field 0 (no time, no version).
_UNKNOWN_STAT = ZnodeStat(*([0] * len(ZnodeStat._fields)))


#: told (done, total) while a ``--wait`` request waits (the CLI draws it; the API passes none)
Progress = Callable[[int, int], None]


class AdminClient(TaskOperations, RestartOperations, ClusterOperations, OperationsAdmin):
    """Operator requests over one kazoo client. Reads are pipelined with the async API (a few waves of
    requests whatever the number of tasks); writes are single requests or one ``multi``."""

    def __init__(self, client: KazooClient, layout: ZkLayout, *, retries: int = 5) -> None:
        self.client = client
        self.layout = layout
        self.retries = retries
        self.unreadable: set[str] = set()  # znodes a read met that these credentials may not read
        self._laid_out = False  # the root's layout marker seen: no need to look again

    # ---- pipelined reads --------------------------------------------------------------------------
    def _wave(self, gets: Sequence[str] = (), children: Sequence[str] = ()) -> tuple[list[Any], list[list[str] | None]]:
        """Issue every get and get_children at once, then collect: one round trip of latency. A znode these
        credentials may not read comes back as ``(codecs.Unreadable(), stat)`` (its decoding reports it; its stat all zeros) and
        is noted in ``unreadable``: one znode whose ACL was changed under us must not make every read of
        the cluster fail."""
        ca = [self.client.get_children_async(p) for p in children]
        got: list[Any] = []
        if len(gets) >= MULTI_READ_FROM:
            try:  # a few multiRead requests instead of one request per znode (10,000 tasks: 1 s, not 5)
                got = multi_read(self.client, gets)
            except NoAuthError:
                got = []  # some znode we may not read: read one by one below, to report just that one
        ga = [] if got else [self.client.get_async(p) for p in gets]
        for p, a in zip(gets, ga):
            try:
                got.append(a.get(timeout=WAIT_S))
            except NoNodeError:
                got.append(None)
            except NoAuthError:
                self.unreadable.add(p)
                got.append((codecs.Unreadable(), _UNKNOWN_STAT))  # not even its stat may be read
        kids: list[list[str] | None] = []
        for p, a in zip(children, ca):
            try:
                kids.append(sorted(a.get(timeout=WAIT_S)))
            except NoNodeError:
                kids.append(None)
        return got, kids  # a container we may not list (NoAuth) raises: nothing could be read at all

    def _task_ids(self) -> list[str]:
        """Every task id, sorted: the task buckets, in multiRead requests (never one listing of them all). A
        flat root of an earlier release raises LayoutError rather than reading as empty."""
        if not self._laid_out:
            self._laid_out = check_root(self.client, self.layout)
        return list_tasks(self.client, self.layout)

    @staticmethod
    def _decode(cls: type, res: Any, path: str) -> tuple[Any, str | None]:
        if res is None:
            return None, None
        try:
            return codecs.decode(cls, res[0], path), None
        except PayloadError as exc:
            return None, str(exc)

    def _owners(self, task_ids: Sequence[str]) -> dict[str, tuple[codecs.OwnerInfo | None, ZnodeStat]]:
        lay = self.layout
        got, _ = self._wave([lay.task_owner(t) for t in task_ids])
        out = {}
        for t, res in zip(task_ids, got):
            if res is not None:
                info, _err = self._decode(codecs.OwnerInfo, res, lay.task_owner(t))
                out[t] = (info, res[1])
        return out

    def _read_spec(self, task_id: str) -> tuple[TaskSpec, ZnodeStat, bool]:
        """The task's spec, its stat and whether a deletion is pending (one wave)."""
        lay = self.layout
        path = lay.task(task_id)
        got, _ = self._wave([path, lay.admin_delete_task(task_id)])
        if got[0] is None:
            raise NotFound(f"unknown task {task_id!r}")
        try:
            spec = decode_task(got[0][0], path)
        except PayloadError as exc:
            raise AdminError(f"task {task_id!r} has an invalid spec: {exc.reason}") from None
        return spec, got[0][1], got[1] is not None

    def _live_brokers(self) -> list[str]:
        _, (kids,) = self._wave(children=[self.layout.broker_ids])
        return kids or []

    def _wait(self, check: Callable[[Callable[[Any], None]], bool | tuple[int, int]], timeout: float,
              interval: float = 0.25, progress: Progress | None = None) -> bool:
        """Wait until ``check(watch)`` is done: it arms ``watch`` on what it reads, and is re-run when a
        watch fires or at least every ``interval`` (bounded by ``timeout``). A check returns True/False, or
        (done, total), done when equal, which ``progress`` is told at every look."""
        fired = threading.Event()
        watch = lambda _event: fired.set()  # one callable: kazoo keeps a set, so re-arming does not pile up
        deadline = time.monotonic() + timeout
        while True:
            fired.clear()
            got = check(watch)
            done, total = got if isinstance(got, tuple) else (int(bool(got)), 1)
            if progress is not None:
                progress(done, total)
            if done >= total:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            fired.wait(min(remaining, interval))


