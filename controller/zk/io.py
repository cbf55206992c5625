"""Batched, pipelined and fenced ZooKeeper I/O for the controller.

Every controller write is a ``multi`` whose first op checks ``/controller_epoch`` at the version read
when this controller won: a newer controller bumped it, so a ``BadVersion`` there means we are a
zombie and must resign (``Fenced``). Large writes are split into several multis (bounded in ops and
bytes, well under ZooKeeper's 1 MiB request limit) that are sent with the async API and awaited
together: one session processes them in order, so ordering is kept while round trips overlap.
Reads of many znodes are pipelined the same way (``get_many``: one kazoo request per znode); where no watch
is wanted, ``controller.zk.multi_read`` batches them into fewer requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.handlers.threading import KazooTimeoutError
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
