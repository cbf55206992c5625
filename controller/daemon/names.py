"""Names read from ZooKeeper are data: every listing the controller acts on goes through ``legal_children``.

A child whose name cannot be one of ours (``evil<b>`` under ``/brokers/ids``, ``bad<g>`` under ``/groups``)
was not written by any process of this release: whoever could create it (a broker's credentials can create
under several containers) must not be able to wedge an activation or hide the rest of a listing. It is
left out of the listing, logged, and deleted by the active controller (fenced by its epoch; the ACL policy
gives the controller DELETE on every container such a name can appear in). A deletion that fails (the
subtree's own ACL refuses it) is logged once and not tried again by this process: it stays left out."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial

from kazoo.exceptions import KazooException

from controller.daemon.host import Host
from controller.protocol.cluster.layout import ZkLayout
from controller.zk.io import WriteFailed

log = logging.getLogger(__name__)

# The most znodes one illegal subtree may hold for the controller to delete it (a bigger one is left out).
MAX_SWEEP_NODES = 1000
# The paths whose deletion failed once (not tried again by this process); bounded.
_FAILED: set[str] = set()
_FAILED_MAX = 10_000


def legal_children(host: Host, layout: ZkLayout, parent: str, names: Iterable[str] | None) -> list[str]:
    """The legal children of ``parent``, sorted; each illegal one is logged and swept (``sweep``)."""
    legal, illegal = layout.split_children(parent, names)
    if illegal:
        sweep(host, [f"{parent}/{n}" for n in illegal])
    return legal


def sweep(host: Host, paths: list[str]) -> int:
    """Delete ``paths`` (each with what is under it, bounded) with the fenced writer; returns how many
    subtrees went. Never raises for a refusal: the name stays isolated and the activation goes on."""
    writer = host.writer
    if writer is None:
        return 0
    deleted = 0
    for path in paths:
        if path in _FAILED:
            continue
        try:
            n = host.write(partial(writer.delete_tree, path, max_nodes=MAX_SWEEP_NODES))
        except (WriteFailed, KazooException) as exc:
            if len(_FAILED) < _FAILED_MAX:
                _FAILED.add(path)
            log.warning(
                "could not delete the illegal name %r (%s %s); it stays left out", path[:300], type(exc).__name__, exc
            )
            continue
        if n:
            deleted += 1
            log.warning("deleted %r: not a legal name of ours (%d znode(s))", path[:300], n)
    return deleted
