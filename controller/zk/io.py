"""Batched, pipelined and fenced ZooKeeper I/O for the controller.

Every controller write is a ``multi`` whose first op checks ``/controller_epoch`` at the version read
when this controller won: a newer controller bumped it, so a ``BadVersion`` there means we are a
zombie and must resign (``Fenced``). Large writes are split into several multis (bounded in ops and
bytes, well under ZooKeeper's 1 MiB request limit) that are sent with the async API and awaited
together: one session processes them in order, so ordering is kept while round trips overlap.
Reads of many znodes are pipelined the same way (``get_many``: one kazoo request per znode), or, where no
watch is wanted, batched into ZooKeeper ``multiRead`` requests (``multi_read``: one request per chunk of
up to a thousand znodes).
"""

from __future__ import annotations

import logging
import struct
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeAlias

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    EXCEPTIONS,
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
    UnimplementedError,
    ZookeeperError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import _norm_root, join, normpath
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    int_struct,
    read_buffer,
    read_string,
    stat_struct,
    write_string,
)
from kazoo.protocol.states import ZnodeStat

from controller.protocol.errors import InternalError

log = logging.getLogger(__name__)

MAX_OPS_PER_MULTI = 1000
MAX_BYTES_PER_MULTI = 512 * 1024
WAIT_S = 60.0
WAIT_SLICE_S = 0.05
UPSERT_ATTEMPTS = 4


class AsyncResult(Protocol):
    """What this module uses of kazoo's ``IAsyncResult`` (kazoo ships no types)."""

    def ready(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...


class _Pending:
    """An async result whose ``get`` gives up when the connection is not live (see InterruptibleClient)."""

    __slots__ = ("_result", "_client", "_max_wait_s")

    def __init__(self, result: AsyncResult, client: KazooClient, max_wait_s: float) -> None:
        self._result = result
        self._client = client
        self._max_wait_s = max_wait_s

    def ready(self) -> bool:
        return self._result.ready()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        limit = self._max_wait_s if timeout is None else min(timeout, self._max_wait_s)
        deadline = time.monotonic() + limit
        result = self._result
        while not result.ready():
            if not self._client.connected:
                raise ConnectionLoss("the ZooKeeper connection is down (request abandoned, not awaited)")
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not block:
                raise KazooTimeoutError(f"no ZooKeeper answer within {limit:.0f}s")
            result.wait(min(WAIT_SLICE_S, remaining))
        return result.get(block=False)


class _Transaction(TransactionRequest):  # type: ignore[misc]  # kazoo ships no types: its classes are Any
    def commit_async(self) -> Any:
        return _Pending(super().commit_async(), self.client._client, self.client.max_wait_s)

    def commit(self) -> Any:
        return self.commit_async().get()


class InterruptibleClient:
    """The controller's view of a KazooClient: every blocking call gives up once the connection is down.

    kazoo queues a request issued while it is reconnecting, and its synchronous calls wait for the answer
    without a bound. An event thread that issued one at the start of an outage would sit there, unable to
    see SUSPENDED, LOST or Shutdown, until ZooKeeper came back. Here every wait is sliced and raises
    ``ConnectionLoss`` as soon as it finds the connection not live (kazoo may still send the request after
    reconnecting: reads are harmless, and writes are fenced multis), and none waits longer than
    ``max_wait_s``. Everything else (``client_id``, ``connected``, ``_call``, ...) is the client's own.
    """

    def __init__(self, client: KazooClient, max_wait_s: float = WAIT_S) -> None:
        self._client = client
        self.max_wait_s = max_wait_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _pending(self, result: Any) -> _Pending:
        return _Pending(result, self._client, self.max_wait_s)

    # async: the client's requests, with interruptible results
    def get_async(self, path: str, watch: Any = None) -> _Pending:
        return self._pending(self._client.get_async(path, watch=watch))

    def get_children_async(self, path: str, watch: Any = None, include_data: bool = False) -> _Pending:
        return self._pending(self._client.get_children_async(path, watch=watch, include_data=include_data))

    def exists_async(self, path: str, watch: Any = None) -> _Pending:
        return self._pending(self._client.exists_async(path, watch=watch))

    def create_async(
        self,
        path: str,
        value: bytes = b"",
        acl: Any = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> _Pending:
        return self._pending(
            self._client.create_async(path, value, acl=acl, ephemeral=ephemeral, sequence=sequence, makepath=makepath)
        )

    def set_async(self, path: str, value: bytes, version: int = -1) -> _Pending:
        return self._pending(self._client.set_async(path, value, version))

    def delete_async(self, path: str, version: int = -1) -> _Pending:
        return self._pending(self._client.delete_async(path, version))

    def set_acls_async(self, path: str, acls: Any, version: int = -1) -> _Pending:
        return self._pending(self._client.set_acls_async(path, acls, version))

    def ensure_path_async(self, path: str, acl: Any = None) -> _Pending:
        return self._pending(self._client.ensure_path_async(path, acl))

    # blocking, but bounded
    def get(self, path: str, watch: Any = None) -> Any:
        return self.get_async(path, watch).get()

    def get_children(self, path: str, watch: Any = None, include_data: bool = False) -> Any:
        return self.get_children_async(path, watch, include_data).get()

    def exists(self, path: str, watch: Any = None) -> Any:
        return self.exists_async(path, watch).get()

    def create(
        self,
        path: str,
        value: bytes = b"",
        acl: Any = None,
        ephemeral: bool = False,
        sequence: bool = False,
        makepath: bool = False,
    ) -> str:
        created: str = self.create_async(path, value, acl, ephemeral, sequence, makepath).get()
        return created

    def set(self, path: str, value: bytes, version: int = -1) -> Any:
        return self.set_async(path, value, version).get()

    def delete(self, path: str, version: int = -1) -> Any:
        return self.delete_async(path, version).get()

    def ensure_path(self, path: str, acl: Any = None) -> Any:
        return self.ensure_path_async(path, acl).get()

    def transaction(self) -> TransactionRequest:
        return _Transaction(self)

    def call_async(self, request: Any) -> _Pending:
        """Send a request object of kazoo's protocol (``type``, ``serialize()``, ``deserialize(bytes, offset)``)
        the way kazoo's own ``*_async`` methods do, through ``KazooClient._call`` (see ``MultiRead``)."""
        result = self._client.handler.async_result()
        self._client._call(request, result)
        return self._pending(result)


class Fenced(InternalError, RuntimeError):
    """Our epoch is stale: a newer controller exists. The only correct reaction is to resign."""


class WriteFailed(InternalError, RuntimeError):
    """A fenced multi failed for another reason (a znode missing or present unexpectedly).

    ``failures`` are the ops that failed, with their errors; ``unwritten`` every op of the multis that
    failed (a multi is all or nothing; the other multis of the write were applied)."""

    def __init__(self, message: str, failures: list[tuple[Op, Exception]], unwritten: list[Op] | None = None) -> None:
        super().__init__(message)
        self.failures = failures
        self.unwritten = unwritten or []


@dataclass(frozen=True)
class Create:
    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequence: bool = False


@dataclass(frozen=True)
class SetData:
    path: str
    data: bytes
    version: int = -1


@dataclass(frozen=True)
class Delete:
    path: str
    version: int = -1


Op = Create | SetData | Delete


def _size(op: Op) -> int:
    return len(op.path) + 64 + (len(op.data) if isinstance(op, (Create, SetData)) else 0)


def chunk_ops(
    ops: Sequence[Op], max_ops: int = MAX_OPS_PER_MULTI, max_bytes: int = MAX_BYTES_PER_MULTI
) -> list[list[Op]]:
    """Split ops, in order, into batches bounded in count and bytes."""
    batches: list[list[Op]] = []
    current: list[Op] = []
    size = 0
    for op in ops:
        s = _size(op)
        if current and (len(current) >= max_ops or size + s > max_bytes):
            batches.append(current)
            current, size = [], 0
        current.append(op)
        size += s
    if current:
        batches.append(current)
    return batches


class FencedWriter:
    """Writes ops in fenced multis. ``requests`` counts the multis sent (for tests and benchmarks)."""

    def __init__(self, client: KazooClient, epoch_path: str | None, epoch_zk_version: int = -1) -> None:
        """``epoch_path=None`` makes an unfenced batch writer (workers' status writes)."""
        self.client = client
        self.epoch_path = epoch_path
        self.epoch_zk_version = epoch_zk_version
        self.requests = 0
        self.ops_written = 0

    def write(self, ops: Sequence[Op], versions: dict[str, int] | None = None) -> None:
        """Write ``ops`` in fenced multis. ``versions`` (updated in place) gets the data version each written
        znode has now (a create's is 0), and loses the paths of a batch that failed (their version is unknown):
        a writer that knows its version can later write conditionally without reading first."""
        if not ops:
            return
        batches = chunk_ops(ops)
        pending = []
        for batch in batches:
            t = self.client.transaction()
            if self.epoch_path is not None:
                t.check(self.epoch_path, self.epoch_zk_version)
            for op in batch:
                if isinstance(op, Create):
                    t.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
                elif isinstance(op, SetData):
                    t.set_data(op.path, op.data, op.version)
                else:
                    t.delete(op.path, op.version)
            pending.append((batch, t.commit_async()))
            self.requests += 1
        failures: list[tuple[Op, Exception]] = []
        unwritten: list[Op] = []
        for batch, async_result in pending:
            results = async_result.get(timeout=WAIT_S)
            if self.epoch_path is not None:
                if results and isinstance(results[0], BadVersionError):
                    raise Fenced(
                        f"{self.epoch_path} moved past version {self.epoch_zk_version}: a newer controller exists"
                    )
                if results and isinstance(results[0], NoNodeError):
                    raise Fenced(f"{self.epoch_path} is gone")
                results = results[1:]
            # in a failed multi, the ops around the one that failed report RolledBack / RuntimeInconsistency
            for op, result in zip(batch, results):
                if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
                    failures.append((op, result))
            if any(isinstance(r, Exception) for r in results):
                unwritten += batch
                if versions is not None:
                    for op in batch:
                        versions.pop(op.path, None)
            else:
                self.ops_written += len(batch)
                if versions is not None:
                    for op, result in zip(batch, results):
                        if isinstance(op, Create):
                            versions[op.path] = 0
                        elif isinstance(op, SetData) and isinstance(result, ZnodeStat):
                            versions[op.path] = result.version
                        else:
                            versions.pop(op.path, None)
        if failures:
            detail = "; ".join(f"{type(e).__name__} on {op.path}" for op, e in failures[:5])
            raise WriteFailed(f"{len(failures)} ops failed: {detail}", failures, unwritten)

    def upsert(
        self, items: Sequence[tuple[str, bytes]], known: set[str] | None = None, versions: dict[str, int] | None = None
    ) -> None:
        """Create or overwrite each (path, data): set where the znode exists, create where it doesn't.

        ``known`` caches paths known to exist (updated in place). Unknown paths are looked up with
        pipelined ``exists`` calls; a race (someone deleted/created meanwhile) is looked up and written
        again, up to ``UPSERT_ATTEMPTS`` times in all: a failed multi names only its first failing op, so two
        paths raced in one batch take two more rounds. ``versions``: see :meth:`write`.
        """
        known = known if known is not None else set()
        # A path written twice in one batch (e.g. a group's state: PreparingRebalance, then AwaitingSync)
        # is written once, with its last value, at its first position: in one multi the intermediate value
        # is never visible anyway, and a Create followed by a Create of the same new znode would fail.
        last = {p: d for p, d in items}
        items = [(p, last.pop(p)) for p, _ in items if p in last]
        for attempt in range(UPSERT_ATTEMPTS):
            unknown = [p for p, _ in items if p not in known]
            for p, stat in zip(unknown, exists_many(self.client, unknown)):
                if stat is not None:
                    known.add(p)
            ops: list[Op] = [SetData(p, d) if p in known else Create(p, d) for p, d in items]
            try:
                self.write(ops, versions)
            except WriteFailed as exc:
                if attempt == UPSERT_ATTEMPTS - 1:
                    raise
                for op, err in exc.failures:
                    if isinstance(err, NoNodeError):
                        known.discard(op.path)
                    elif isinstance(err, NodeExistsError):
                        known.add(op.path)
                continue
            known.update(p for p, _ in items)
            return

    def delete_if_present(self, paths: Iterable[str], present: Collection[str] = ()) -> list[str]:
        """Delete the znodes that exist; returns those left alone because they gained a child meanwhile
        (see delete_groups)."""
        paths = list(dict.fromkeys(paths))
        return [paths[i] for i in self.delete_groups([[p] for p in paths], present)]

    def delete_tree(self, path: str, max_nodes: int = 1000) -> int:
        """Delete ``path`` and everything under it in fenced multis, children first; returns how many
        znodes went. Bounded: a subtree of more than ``max_nodes`` raises instead of being walked."""
        order: list[str] = []
        stack = [path]
        while stack:
            current = stack.pop()
            try:
                children = self.client.get_children(current)
            except NoNodeError:
                continue
            order.append(current)
            if len(order) > max_nodes:
                raise WriteFailed(f"{path} holds more than {max_nodes} znodes; not deleting it", [])
            stack += [f"{current}/{c}" for c in children]
        if order:
            self.write([Delete(p) for p in reversed(order)])
        return len(order)

    def delete_groups(self, groups: Sequence[Sequence[str]], present: Collection[str] = ()) -> list[int]:
        """Delete groups of znodes in fenced multis (pipelined); returns the indexes of groups left alone.

        Paths not in ``present`` (known to exist) are looked up first, pipelined. A group one of whose
        znodes gained a child meanwhile (``NotEmpty``, e.g. a task whose owner came back) is left whole,
        so a task and its request go together; a znode already gone counts as deleted. A multi that
        failed rolled back whole, so its other ops are sent again (bounded), without a new look-up.
        """
        unknown = list(dict.fromkeys(p for g in groups for p in g if p not in present))
        gone = {p for p, stat in zip(unknown, exists_many(self.client, unknown)) if stat is None}
        group_of = {p: i for i, g in enumerate(groups) for p in g}
        blocked: set[int] = set()
        ops: list[Op] = [Delete(p) for p in dict.fromkeys(p for g in groups for p in g) if p not in gone]
        for attempt in range(3):
            try:
                self.write(ops)
                return sorted(blocked)
            except WriteFailed as exc:
                others = [(op, err) for op, err in exc.failures if not isinstance(err, (NotEmptyError, NoNodeError))]
                if others or attempt == 2:
                    raise
                gone |= {op.path for op, err in exc.failures if isinstance(err, NoNodeError)}
                blocked |= {group_of[op.path] for op, err in exc.failures if isinstance(err, NotEmptyError)}
                ops = [op for op in exc.unwritten if op.path not in gone and group_of[op.path] not in blocked]
        return sorted(blocked)


WatchFor: TypeAlias = Callable[[str], Any]
"""Given a path, the watcher to arm on it (or None)."""


def exists_many(client: KazooClient, paths: Sequence[str], watch: WatchFor | None = None) -> list[ZnodeStat | None]:
    """Pipelined ``exists`` for many paths. ``watch(path)`` returns the watcher to arm on each path, if any."""
    asyncs = [client.exists_async(p, watch=watch(p) if watch else None) for p in paths]
    return [a.get(timeout=WAIT_S) for a in asyncs]


def get_many(
    client: KazooClient, paths: Sequence[str], watch: WatchFor | None = None
) -> list[tuple[bytes, ZnodeStat] | None]:
    """Pipelined ``get`` for many paths (None for a znode that is gone). ``watch(path)`` returns the
    watcher to arm on each path, if any."""
    asyncs = [client.get_async(p, watch=watch(p) if watch else None) for p in paths]
    out: list[tuple[bytes, ZnodeStat] | None] = []
    for a in asyncs:
        try:
            out.append(a.get(timeout=WAIT_S))
        except NoNodeError:
            out.append(None)
    return out


def children_many(client: KazooClient, paths: Sequence[str], watch: WatchFor | None = None) -> list[list[str] | None]:
    asyncs = [client.get_children_async(p, watch=watch(p) if watch else None) for p in paths]
    out: list[list[str] | None] = []
    for a in asyncs:
        try:
            out.append(list(a.get(timeout=WAIT_S)))
        except NoNodeError:
            out.append(None)
    return out


# ---- multiRead ------------------------------------------------------------------------------------------
# Every kazoo request costs one wake-up byte and one select round of kazoo's connection thread, however
# small it is: that, not ZooKeeper, bounds a pipelined ``get_many`` at ~8,000 znodes/s on a 2-core machine
# (docs/benchmarks.md, "What bounds the misses"). ZooKeeper 3.6+ answers many reads in one request,
# ``multiRead`` (ZOOKEEPER-3032); kazoo 2.11 has no call for it, so ``MultiRead`` below speaks it in kazoo's
# own request protocol. A multiRead cannot arm watches: the server drops the watch flag of its sub-reads
# (``MultiOperationRecord`` rebuilds them as ``Op.getData(path)``), so reads that need a watch stay on
# ``get_many``.

MULTI_READ_OPCODE = 22  # ZooKeeper's OpCode.multiRead
_ERROR_OP = -1  # a sub-result's type when that read failed; an ErrorResponse (the error code) follows
_multiheader = struct.Struct("!iBi")  # type, done, err: before every sub-request and sub-result, and at the end

MULTI_READ_MAX_OPS = 1000  # sub-reads per request
MULTI_READ_MAX_BYTES = 1024 * 1024  # expected reply bytes per request (ZooKeeper builds each reply whole in its heap)
MULTI_READ_MAX_REQUEST_BYTES = 256 * 1024  # paths per request, far below the server's jute.maxbuffer (1 MiB)
MULTI_READ_WINDOW = 4  # requests in flight
MULTI_READ_FIRST_OPS = 64  # the first request, alone in flight: its reply tells the znodes' real sizes
MULTI_READ_PRIOR_BYTES = 1024  # expected reply bytes per znode until a reply has been seen
_DATA_REPLY_OVERHEAD: int = _multiheader.size + 4 + stat_struct.size  # header, data length, stat
_CHILDREN_REPLY_OVERHEAD = _multiheader.size + 4  # header, list length; then 4 + len per child

# Clients whose server rejected multiRead (ZooKeeper < 3.6 answers UNIMPLEMENTED and drops the connection):
# they use the pipelined reads for the rest of their life.
_NO_MULTI_READ: weakref.WeakSet[KazooClient] = weakref.WeakSet()

DataResult: TypeAlias = tuple[bytes, ZnodeStat]
SubResult: TypeAlias = DataResult | list[str] | ZookeeperError


@dataclass(frozen=True, repr=False)
class MultiRead:
    """ZooKeeper's ``multiRead`` request: one request, many ``GetData`` / ``GetChildren`` sub-reads.

    Wire format (ZooKeeper's ``MultiOperationRecord`` / ``MultiResponse``, the same framing as kazoo's
    ``Transaction``): each sub-request is a ``MultiHeader(type, done=False, err=-1)`` followed by the
    ``GetDataRequest`` / ``GetChildrenRequest`` record (path, watch flag); a ``MultiHeader(-1, True, -1)``
    ends the list. The reply has one ``MultiHeader(type, False, err)`` per sub-read followed by a
    ``GetDataResponse`` (data, stat), a ``GetChildrenResponse`` (children) or, with type -1, an
    ``ErrorResponse`` (the error code), then the same end marker. The sub-reads are independent: one
    failing (NoNode, NoAuth) does not fail the others. ``ops`` are (``GetData.type`` or
    ``GetChildren.type``, path with the client's chroot already prefixed).

    kazoo sends any object with ``type``, ``serialize()`` and ``deserialize(bytes, offset)`` through
    ``KazooClient._call``; its connection thread calls ``deserialize`` with the reply. Without a ``watcher``
    attribute kazoo arms no watch, which matches what the server does.
    """

    ops: tuple[tuple[int, str], ...]
    type: ClassVar[int] = MULTI_READ_OPCODE

    def serialize(self) -> bytes:
        b = bytearray()
        for op_type, path in self.ops:
            b += _multiheader.pack(op_type, False, -1)
            b += write_string(path)
            b.append(0)  # watch: no (the server would ignore it)
        b += _multiheader.pack(-1, True, -1)
        return bytes(b)

    def deserialize(self, buffer: bytes, offset: int) -> list[SubResult]:
        results: list[SubResult] = []
        while True:
            op_type, done, _err = _multiheader.unpack_from(buffer, offset)
            offset += _multiheader.size
            if done:
                break
            if op_type == GetData.type:
                data, offset = read_buffer(buffer, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(buffer, offset))
                offset += stat_struct.size
                results.append((data, stat))
            elif op_type == GetChildren.type:
                count = int_struct.unpack_from(buffer, offset)[0]
                offset += int_struct.size
                children = []
                for _ in range(max(count, 0)):
                    child, offset = read_string(buffer, offset)
                    children.append(child)
                results.append(children)
            elif op_type == _ERROR_OP:
                code = int_struct.unpack_from(buffer, offset)[0]
                offset += int_struct.size
                results.append(_zookeeper_error(code))
            else:
                raise ValueError(f"unexpected sub-result type {op_type} in a multiRead reply")
        if len(results) != len(self.ops):
            raise ValueError(f"a multiRead of {len(self.ops)} reads answered {len(results)}")
        return results

    def __repr__(self) -> str:  # kazoo logs requests at DEBUG: not a thousand paths
        first = self.ops[0][1] if self.ops else "-"
        return f"MultiRead({len(self.ops)} ops, first {first})"


def _zookeeper_error(code: int) -> ZookeeperError:
    known = EXCEPTIONS.get(code)  # .get: kazoo's EXCEPTIONS raises for an unknown code
    return known() if known is not None else ZookeeperError(f"ZooKeeper error code {code}")


def _send(client: KazooClient | InterruptibleClient, request: MultiRead) -> Any:
    if isinstance(client, InterruptibleClient):
        return client.call_async(request)
    result = client.handler.async_result()
    client._call(request, result)
    return result


def _raw(client: KazooClient | InterruptibleClient) -> KazooClient:
    return client._client if isinstance(client, InterruptibleClient) else client


def _reply_bytes(result: SubResult) -> int:
    if isinstance(result, tuple):
        return _DATA_REPLY_OVERHEAD + len(result[0] or b"")
    if isinstance(result, list):
        return _CHILDREN_REPLY_OVERHEAD + sum(4 + len(c) for c in result)
    return _multiheader.size + 4


def _multi_read_ops(
    client: KazooClient | InterruptibleClient,
    op_type: int,
    paths: Sequence[str],
    max_ops: int,
    max_bytes: int,
    window: int,
) -> list[SubResult] | None:
    """Send ``paths`` as sub-reads of ``op_type`` in chunked, pipelined multiReads; the sub-results in order,
    or None if the server does not know multiRead.

    Chunks are bounded by ``max_ops`` sub-reads, by request bytes, and by ``max_bytes`` of *expected* reply:
    until the first reply only ``MULTI_READ_FIRST_OPS`` reads go out, sized by ``MULTI_READ_PRIOR_BYTES`` per
    znode; from then on the average reply bytes per znode seen so far sizes each next chunk, with up to
    ``window`` requests in flight. A few 50 KB znodes among small ones thus shrink the chunks instead of
    making one reply of tens of megabytes.
    """
    raw = _raw(client)
    if raw in _NO_MULTI_READ:
        return None
    root = _norm_root(raw.chroot or "")  # kazoo's _prefix_root, with the root normalised once, not per path
    base = root.rstrip("/")
    # a clean absolute path (what ZkLayout builds) needs no normpath: the root in front is the whole prefixing
    full = [
        base + p
        if p[:1] == "/" and "//" not in p and "/." not in p and p != "/"
        else normpath(join(root, p.lstrip("/")))
        for p in paths
    ]
    results: list[SubResult] = []
    in_flight: deque[tuple[int, Any]] = deque()  # (sub-reads, async result)
    sent = 0
    seen_ops = seen_bytes = 0
    while sent < len(full) or in_flight:
        while sent < len(full) and len(in_flight) < (window if seen_ops else 1):
            per_op = seen_bytes / seen_ops if seen_ops else MULTI_READ_PRIOR_BYTES
            limit = max(1, min(max_ops, int(max_bytes // max(per_op, 1.0))))
            if not seen_ops:
                limit = min(limit, MULTI_READ_FIRST_OPS)
            ops: list[tuple[int, str]] = []
            request_bytes = 0
            for path in full[sent : sent + limit]:
                request_bytes += _multiheader.size + 5 + len(path)
                if ops and request_bytes > MULTI_READ_MAX_REQUEST_BYTES:
                    break
                ops.append((op_type, path))
            in_flight.append((len(ops), _send(client, MultiRead(tuple(ops)))))
            sent += len(ops)
        count, pending = in_flight.popleft()
        try:
            reply = pending.get(timeout=WAIT_S)
        except UnimplementedError:
            log.warning("ZooKeeper rejected multiRead (a server older than 3.6): reading one znode per request")
            _NO_MULTI_READ.add(raw)
            return None
        results += reply
        seen_ops += count
        seen_bytes += sum(_reply_bytes(r) for r in reply)
    return results


def _present(results: list[Any]) -> list[Any]:
    """Per-znode multiRead results as ``get_many`` gives them: NoNode → None, any other error raised."""
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, NoNodeError):
            raise result
    return [None if isinstance(r, NoNodeError) else r for r in results]


def multi_read(
    client: KazooClient | InterruptibleClient,
    paths: Sequence[str],
    *,
    max_ops: int = MULTI_READ_MAX_OPS,
    max_bytes: int = MULTI_READ_MAX_BYTES,
    window: int = MULTI_READ_WINDOW,
) -> list[DataResult | None]:
    """``get`` of many znodes without watches, in a few multiRead requests: what ``get_many`` returns
    ((data, stat), None for a znode that is gone; any other error, e.g. NoAuth, raises its kazoo exception),
    at a small fraction of its cost per znode (one kazoo request per chunk of up to ``max_ops`` znodes, not
    per znode). Each sub-read is consistent on its own; like ``get_many``, the reads are not one snapshot.
    A server without multiRead (< 3.6) gets the pipelined ``get_many`` instead."""
    if not paths:
        return []
    results = _multi_read_ops(client, GetData.type, paths, max_ops, max_bytes, window)
    if results is None:
        return get_many(client, paths)
    return _present(results)


def multi_children(
    client: KazooClient | InterruptibleClient,
    paths: Sequence[str],
    *,
    max_ops: int = MULTI_READ_MAX_OPS,
    max_bytes: int = MULTI_READ_MAX_BYTES,
    window: int = MULTI_READ_WINDOW,
) -> list[list[str] | None]:
    """``get_children`` of many znodes without watches, in multiRead requests: what ``children_many``
    returns (None for a znode that is gone; other errors raise). Falls back to ``children_many``."""
    if not paths:
        return []
    results = _multi_read_ops(client, GetChildren.type, paths, max_ops, max_bytes, window)
    if results is None:
        return children_many(client, paths)
    return _present(results)


# ---- whole subtrees -------------------------------------------------------------------------------------

DELETE_TREE_OPS = 1000  # deletes per multi
DELETE_TREE_ROUNDS = 5  # listings of the tree, when znodes are created under it while it is deleted


def delete_tree(client: KazooClient, path: str, max_nodes: int = 2_000_000) -> int:
    """Delete ``path`` and its subtree; returns how many znodes went. kazoo's ``delete(recursive=True)`` pays
    a round trip per znode (a freshly laid out root: 528 znodes, 1-2 s); here the tree is listed level by
    level in multiRead requests and deleted deepest level first in multis of ``DELETE_TREE_OPS``. A multi
    that fails (a znode gone or created meanwhile) is redone one znode at a time; a child created under
    the tree while it goes makes its parent's delete fail, and the tree is listed again (bounded rounds)."""
    deleted = 0
    for _ in range(DELETE_TREE_ROUNDS):
        levels: list[list[str]] = [[path]]
        seen = 1
        while levels[-1] and seen < max_nodes:
            kids = multi_children(client, levels[-1])
            level = [f"{p.rstrip('/')}/{c}" for p, cs in zip(levels[-1], kids) for c in (cs or ())]
            seen += len(level)
            levels.append(level)
        if seen >= max_nodes:
            raise WriteFailed(f"{path} has more than {max_nodes} znodes: not deleted", [])
        blocked = False
        for level in reversed(levels):
            for lo in range(0, len(level), DELETE_TREE_OPS):
                chunk = level[lo : lo + DELETE_TREE_OPS]
                tx = client.transaction()
                for p in chunk:
                    tx.delete(p)
                if not any(isinstance(r, Exception) for r in tx.commit()):
                    deleted += len(chunk)
                    continue
                for pending in [client.delete_async(p) for p in chunk]:  # all sent, then all awaited
                    try:
                        pending.get(timeout=WAIT_S)
                        deleted += 1
                    except NoNodeError:
                        pass
                    except NotEmptyError:
                        blocked = True
        if not blocked:
            return deleted
    raise WriteFailed(f"{path}: znodes kept being created under it; not deleted after {DELETE_TREE_ROUNDS} rounds", [])
