"""ZooKeeper inspection (``zkctl zk tree|get``): which payload type lives at a path, and a bounded walk
that decodes what it finds (garbage is shown as an error, never raised)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

from controller.admin.common import NotFound
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task


def payload_decoder(layout: ZkLayout, path: str) -> Callable[[bytes | None, str], Any] | None:
    """The decoder for the znode at ``path`` according to the layout, or None if it has no payload of ours."""
    if not path.startswith(layout.root.rstrip("/") + "/"):
        return None
    rel = path[len(layout.root.rstrip("/")) + 1 :].split("/")

    def of(cls: type) -> Callable[[bytes | None, str], Any]:
        return lambda data, p: codecs.decode(cls, data, p)

    match rel:
        case ["controller"]:
            return of(registration_records.ControllerInfo)
        case ["controller_epoch"]:
            return codecs.decode_epoch
        case ["brokers", "ids", _]:
            return of(registration_records.BrokerInfo)
        case ["layout"]:
            return of(admin_records.LayoutInfo)
        case ["tasks", _, _]:
            return decode_task
        case ["tasks", _, _, "owner"]:
            return of(task_records.OwnerInfo)
        case ["groups", _, "state"]:
            return of(group_messages.GroupStateInfo)
        case ["groups", _, "members", _]:
            return of(group_messages.JoinRequest)
        case ["groups", _, "join", _]:
            return of(group_messages.JoinResult)
        case ["groups", _, "sync", _]:
            return of(group_messages.SyncProposal)
        case ["groups", _, "assignment", _]:
            return of(group_messages.Assignment)
        case ["status", _, _]:
            return of(task_records.TaskStatus)
        case ["intervals", _]:
            return of(task_records.IntervalLog)
        case ["admin", "rebalance", _]:
            return of(admin_records.RebalanceRequest)
        case ["admin", "controlled_shutdown", _]:
            return of(admin_records.ControlledShutdownRequest)
        case ["admin", "reassign", _]:
            return of(admin_records.ReassignRequest)
        case ["admin", "delete_tasks", _]:
            return of(admin_records.DeleteTaskRequest)
        case ["admin", "task_history", _]:
            return of(admin_records.TaskHistory)
    return None


@dataclass(frozen=True)
class ZnodeView:
    path: str
    data: bytes
    stat: ZnodeStat
    decoded: Any
    error: str | None

    def stat_dict(self) -> dict[str, Any]:
        return {
            "version": self.stat.version,
            "czxid": self.stat.czxid,
            "mzxid": self.stat.mzxid,
            "ctime": self.stat.ctime / 1000.0,
            "mtime": self.stat.mtime / 1000.0,
            "ephemeral_owner": self.stat.ephemeralOwner or None,
            "num_children": self.stat.numChildren,
            "data_length": self.stat.dataLength,
        }


def jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True)
    return codecs.to_jsonable(value)


class ZkInspector:
    """Read-only views of the tree: ``zkctl zk tree`` and ``zkctl zk get``."""

    def __init__(self, client: KazooClient, layout: ZkLayout) -> None:
        self.client = client
        self.layout = layout

    def get(self, path: str) -> ZnodeView:
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            raise NotFound(f"no znode at {path}") from None
        decoder = payload_decoder(self.layout, path)
        decoded: Any = None
        error = None
        if decoder is not None:
            try:
                decoded = jsonable(decoder(data, path))
            except PayloadError as exc:
                error = str(exc)
        return ZnodeView(path, data or b"", stat, decoded, error)

    def tree(self, path: str, max_depth: int = 32, max_nodes: int = 100_000) -> list[tuple[int, str, ZnodeStat]]:
        return walk(self.client, path, max_depth, max_nodes)


def walk(
    client: KazooClient, path: str, max_depth: int = 32, max_nodes: int = 100_000
) -> list[tuple[int, str, ZnodeStat]]:
    """Pre-order listing of the subtree at ``path``: (depth, path, stat), bounded in depth and size."""
    stat = client.exists(path)
    if stat is None:
        raise NotFound(f"no znode at {path}")
    out: list[tuple[int, str, ZnodeStat]] = []

    def visit(depth: int, node: str, node_stat: ZnodeStat) -> None:
        if len(out) >= max_nodes:
            return
        out.append((depth, node, node_stat))
        if depth >= max_depth or node_stat.numChildren == 0:
            return
        try:
            children = sorted(client.get_children(node))
        except NoNodeError:
            return
        full = [("/" if node == "/" else node + "/") + c for c in children]
        pending = [(p, client.exists_async(p)) for p in full]
        for p, a in pending:
            child_stat = a.get(timeout=30)
            if child_stat is not None:
                visit(depth + 1, p, child_stat)

    visit(0, path, stat)
    return out
