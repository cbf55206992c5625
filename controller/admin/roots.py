"""Which cluster roots a ZooKeeper holds: a root is set up once it carries the layout marker (or, for a root
of a release before buckets, its task container); ``zkctl init`` sets one up."""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError

from controller.protocol.cluster.layout import ZkLayout
from controller.zk.io import WAIT_S

#: at most this many top-level znodes are looked into when naming the roots there
MAX_CANDIDATES = 200


def is_set_up(client: KazooClient, layout: ZkLayout) -> bool:
    """Whether ``layout``'s root was ever set up (one round trip); unreadable counts as set up (its ACL
    exists: someone made it)."""
    pending = [client.exists_async(layout.layout_info), client.exists_async(layout.tasks)]
    try:
        return any(p.get(timeout=WAIT_S) is not None for p in pending)
    except NoAuthError:
        return True


def cluster_roots(client: KazooClient) -> list[str]:
    """The top-level znodes that are cluster roots (the first ``MAX_CANDIDATES`` looked into)."""
    try:
        names = sorted(n for n in client.get_children("/") if n != "zookeeper")[:MAX_CANDIDATES]
    except KazooException:
        return []
    layouts = [ZkLayout("/" + n) for n in names]
    found: list[str] = []
    pending = [(lay, client.exists_async(lay.layout_info), client.exists_async(lay.tasks)) for lay in layouts]
    for lay, marker, tasks in pending:
        try:
            if marker.get(timeout=WAIT_S) is not None or tasks.get(timeout=WAIT_S) is not None:
                found.append(lay.root)
        except KazooException:
            continue
    return found


def missing_root_message(client: KazooClient, layout: ZkLayout, hosts: str) -> str | None:
    """None if the root is set up, else the operator's error naming the roots there and how to create one."""
    if is_set_up(client, layout):
        return None
    roots = cluster_roots(client)
    there = ", ".join(roots) if roots else "none"
    return (
        f"no zkcontroller cluster at {layout.root} on {hosts} (roots there: {there}); "
        f"zkctl init --zk-root {layout.root} creates one"
    )


__all__ = ["is_set_up", "cluster_roots", "missing_root_message", "MAX_CANDIDATES"]
