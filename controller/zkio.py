"""Batched, pipelined and fenced ZooKeeper I/O for the controller.

Every controller write is a ``multi`` whose first op checks ``/controller_epoch`` at the version read
when this controller won: a newer controller bumped it, so a ``BadVersion`` there means we are a
zombie and must resign (``Fenced``). Large writes are split into several multis (bounded in ops and
bytes, well under ZooKeeper's 1 MiB request limit) that are sent with the async API and awaited
together: one session processes them in order, so ordering is kept while round trips overlap.
Reads of many znodes are pipelined the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, NodeExistsError, RolledBackError
from kazoo.protocol.states import ZnodeStat

log = logging.getLogger(__name__)

MAX_OPS_PER_MULTI = 500
MAX_BYTES_PER_MULTI = 512 * 1024
WAIT_S = 60.0


class Fenced(RuntimeError):
    """Our epoch is stale: a newer controller exists. The only correct reaction is to resign."""


class WriteFailed(RuntimeError):
    """A fenced multi failed for another reason (a znode missing or present unexpectedly)."""

    def __init__(self, message: str, failures: list[tuple["Op", Exception]]) -> None:
        super().__init__(message)
        self.failures = failures


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


def chunk_ops(ops: Sequence[Op], max_ops: int = MAX_OPS_PER_MULTI, max_bytes: int = MAX_BYTES_PER_MULTI) -> list[list[Op]]:
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

    def write(self, ops: Sequence[Op]) -> None:
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
        for batch, async_result in pending:
            results = async_result.get(timeout=WAIT_S)
            if self.epoch_path is not None:
                if results and isinstance(results[0], BadVersionError):
                    raise Fenced(f"{self.epoch_path} moved past version {self.epoch_zk_version}: a newer controller exists")
                if results and isinstance(results[0], NoNodeError):
                    raise Fenced(f"{self.epoch_path} is gone")
                results = results[1:]
            for op, result in zip(batch, results):
                if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                    failures.append((op, result))
            if not any(isinstance(r, Exception) for r in results):
                self.ops_written += len(batch)
        if failures:
            detail = "; ".join(f"{type(e).__name__} on {op.path}" for op, e in failures[:5])
            raise WriteFailed(f"{len(failures)} ops failed: {detail}", failures)

    def upsert(self, items: Sequence[tuple[str, bytes]], known: set[str] | None = None) -> None:
        """Create or overwrite each (path, data): set where the znode exists, create where it doesn't.

        ``known`` caches paths known to exist (updated in place). Unknown paths are looked up with
        pipelined ``exists`` calls; a race (someone deleted/created meanwhile) is retried once.
        """
        known = known if known is not None else set()
        # A path written twice in one batch (e.g. a group's state: PreparingRebalance, then AwaitingSync)
        # is written once, with its last value, at its first position: in one multi the intermediate value
        # is never visible anyway, and a Create followed by a Create of the same new znode would fail.
        last = {p: d for p, d in items}
        items = [(p, last.pop(p)) for p, _ in items if p in last]
        for attempt in range(2):
            unknown = [p for p, _ in items if p not in known]
            for p, stat in zip(unknown, exists_many(self.client, unknown)):
                if stat is not None:
                    known.add(p)
            ops: list[Op] = [SetData(p, d) if p in known else Create(p, d) for p, d in items]
            try:
                self.write(ops)
            except WriteFailed as exc:
                if attempt == 1:
                    raise
                for op, err in exc.failures:
                    if isinstance(err, NoNodeError):
                        known.discard(op.path)
                    elif isinstance(err, NodeExistsError):
                        known.add(op.path)
                continue
            known.update(p for p, _ in items)
            return

    def delete_if_present(self, paths: Iterable[str]) -> None:
        """Delete the znodes that exist (pipelined look-up, then fenced multis; a race is retried once)."""
        paths = list(paths)
        for attempt in range(2):
            present = [p for p, stat in zip(paths, exists_many(self.client, paths)) if stat is not None]
            try:
                self.write([Delete(p) for p in present])
                return
            except WriteFailed:
                if attempt == 1:
                    raise


def exists_many(client: KazooClient, paths: Sequence[str]) -> list[ZnodeStat | None]:
    """Pipelined ``exists`` for many paths."""
    asyncs = [client.exists_async(p) for p in paths]
    return [a.get(timeout=WAIT_S) for a in asyncs]


def get_many(client: KazooClient, paths: Sequence[str], watch=None) -> list[tuple[bytes, ZnodeStat] | None]:
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


def children_many(client: KazooClient, paths: Sequence[str], watch=None) -> list[list[str] | None]:
    asyncs = [client.get_children_async(p, watch=watch(p) if watch else None) for p in paths]
    out: list[list[str] | None] = []
    for a in asyncs:
        try:
            out.append(list(a.get(timeout=WAIT_S)))
        except NoNodeError:
            out.append(None)
    return out
