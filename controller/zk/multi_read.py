"""Many znodes read in one request: ZooKeeper's ``multiRead``, which kazoo has no call for."""

from __future__ import annotations

import logging
import struct
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from kazoo.client import KazooClient
from kazoo.exceptions import (
    EXCEPTIONS,
    NoNodeError,
    UnimplementedError,
    ZookeeperError,
)
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

from controller.zk.io import WAIT_S, InterruptibleClient, children_many, get_many

log = logging.getLogger(__name__)

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
