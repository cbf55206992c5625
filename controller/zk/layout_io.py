"""The bucketed layout on ZooKeeper: laying out a root, refusing a flat one, and listing tasks and statuses.

Every process that lays out its root (controller, broker, admin) reads ``<root>/layout`` first: present,
the root is laid out (one read); absent, the root is either fresh (its buckets are created, then the
marker) or flat, from a release before buckets, which no process of this release may run against: mixing
``/tasks/<id>`` with ``/tasks/<bucket>/<id>`` would hide tasks from one side. ``zkctl layout migrate``
(``controller/admin/migration.py``) converts a flat root.

Listings never read a whole ``/tasks`` or ``/status``: they read the 256 buckets, in multiRead requests
whose replies are sized under 1 MiB each (``zkio.multi_children``), or, when a watch is wanted, with one
children watch per bucket.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError

from controller.protocol.cluster.layout import (
    BUCKETS,
    LAYOUT_VERSION,
    InvalidName,
    ZkLayout,
    bucket_of,
    check_name,
    is_bucket,
)
from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs
from controller.protocol.records.admin_records import LayoutInfo
from controller.protocol.records.payload_validation import PayloadError
from controller.zk.io import WAIT_S, children_many
from controller.zk.multi_read import multi_children

log = logging.getLogger(__name__)


class LayoutError(ZkcError, RuntimeError):
    """The root's layout is not one this release runs on (flat, or a newer version): nothing was written."""

    status = 503
    code = "layout_not_migrated"  # a root of an earlier release: not the caller's to fix


def flat_entries(client: KazooClient, layout: ZkLayout) -> tuple[list[str], list[str]]:
    """Children of ``/tasks`` and ``/status`` that are not buckets: a flat root's tasks and statuses."""
    out: list[list[str]] = []
    pending = [client.get_children_async(parent) for parent in (layout.tasks, layout.statuses)]
    for result in pending:
        try:
            out.append(sorted(c for c in result.get(timeout=WAIT_S) if not is_bucket(c)))
        except NoNodeError:
            out.append([])
    return out[0], out[1]


def read_layout_info(client: KazooClient, layout: ZkLayout) -> LayoutInfo | None:
    """The root's ``LayoutInfo``, None when absent; a marker this release cannot run on raises LayoutError."""
    try:  # async and waited for: the admin client's reads are all pipelined (its tests count them)
        data, _ = client.get_async(layout.layout_info).get(timeout=WAIT_S)
    except NoNodeError:
        return None
    try:
        info = codecs.decode(LayoutInfo, data, layout.layout_info)
    except PayloadError as exc:
        raise LayoutError(f"{layout.root}: unreadable layout marker ({exc}); nothing was changed") from None
    if info.layout != LAYOUT_VERSION or info.buckets != BUCKETS:
        raise LayoutError(
            f"{layout.root} uses layout {info.layout} with {info.buckets} buckets; this release runs "
            f"layout {LAYOUT_VERSION} with {BUCKETS} buckets: use the release that laid it out"
        )
    return info


def flat_root_error(layout: ZkLayout, tasks: Sequence[str], statuses: Sequence[str]) -> LayoutError:
    return LayoutError(
        f"{layout.root} holds {len(tasks)} task(s) and {len(statuses)} status(es) in the flat layout of an earlier "
        f"release; stop its controllers and brokers, then run `zkctl --zk-root {layout.root} layout migrate` "
        "(nothing was changed)"
    )


def create_buckets(client: KazooClient, layout: ZkLayout, acl_of: Callable[[str], Any] | None = None) -> list[str]:
    """Create the buckets that are missing (idempotent); returns the paths created. A fresh root's 256 task
    and 256 status buckets go in two multis; where some exist already, the missing ones pipelined."""
    created: list[str] = []
    for paths in (layout.task_buckets, layout.status_buckets):
        tx = client.transaction()
        for p in paths:
            tx.create(p, b"", acl=acl_of(p) if acl_of else None)
        if not any(isinstance(r, Exception) for r in tx.commit()):
            created += paths
            continue
        pending = [(p, client.create_async(p, b"", acl=acl_of(p) if acl_of else None)) for p in paths]
        for p, result in pending:
            try:
                result.get(timeout=WAIT_S)
                created.append(p)
            except NodeExistsError:
                pass
    return created


def write_layout_info(client: KazooClient, layout: ZkLayout, acl: Any = None) -> None:
    try:
        client.create(layout.layout_info, codecs.encode(LayoutInfo(LAYOUT_VERSION, BUCKETS)), acl=acl)
    except NodeExistsError:
        read_layout_info(client, layout)  # someone else laid it out: it must be ours


def check_root(client: KazooClient, layout: ZkLayout) -> bool:
    """Whether the root is laid out in buckets already (one read); a fresh root gives False; a flat one, or
    one of a layout this release does not know, raises LayoutError. Call before writing anything."""
    if read_layout_info(client, layout) is not None:
        return True
    tasks, statuses = flat_entries(client, layout)
    if tasks or statuses:
        raise flat_root_error(layout, tasks, statuses)
    return False


def lay_out_buckets(client: KazooClient, layout: ZkLayout, acl_of: Callable[[str], Any] | None = None) -> None:
    """Create a fresh root's buckets, then its marker (idempotent). ``/tasks`` and ``/status`` must exist."""
    create_buckets(client, layout, acl_of)
    write_layout_info(client, layout, acl_of(layout.layout_info) if acl_of else None)
    log.info("laid out %s: %d task and %d status buckets", layout.root, BUCKETS, BUCKETS)


# ---- listings ----------------------------------------------------------------------------------------


def _names(bucket_names: Sequence[str], listings: Sequence[list[str] | None], what: str) -> list[str]:
    return [name for name, _bucket in _entries(bucket_names, listings, what)]


def _entries(bucket_names: Sequence[str], listings: Sequence[list[str] | None], what: str) -> list[tuple[str, str]]:
    """(entry, bucket) of the buckets listed, sorted; an entry that is not a legal id, or that sits in another
    id's bucket, is logged and left out (garbage is isolated, never a crash)."""
    out: list[tuple[str, str]] = []
    for bucket, names in zip(bucket_names, listings):
        for name in names or ():
            try:
                check_name(what, name)
            except InvalidName:
                log.warning("ignoring %s entry %r in bucket %s: not a legal id", what, name, bucket)
                continue
            if bucket_of(name) != bucket:
                log.warning("ignoring %s entry %r in bucket %s: its bucket is %s", what, name, bucket, bucket_of(name))
                continue
            out.append((name, bucket))
    return sorted(out)


def _listings(client: KazooClient, paths: Sequence[str], watch: Callable[[Any], None] | None) -> list[list[str] | None]:
    """The children of the bucket znodes ``paths``: multiRead without a watch, else one children watch each."""
    if watch is None:
        return multi_children(client, paths)
    return children_many(client, paths, watch=lambda _p: watch)


def list_buckets(
    client: KazooClient, paths: Sequence[str], what: str, watch: Callable[[Any], None] | None = None
) -> list[str]:
    """Entries of the bucket znodes ``paths`` (legal ids in their own bucket), sorted."""
    return _names([p.rsplit("/", 1)[1] for p in paths], _listings(client, paths, watch), what)


def list_task_paths(
    client: KazooClient, layout: ZkLayout, watch: Callable[[Any], None] | None = None
) -> list[tuple[str, str]]:
    """Every task as (id, spec path), sorted by id: a failover reads 100,000 of them, so each path is the
    listed bucket's plus the id, validated once (``_entries``), not built again by ``ZkLayout.task``."""
    paths = layout.task_buckets
    entries = _entries([p.rsplit("/", 1)[1] for p in paths], _listings(client, paths, watch), "task id")
    return [(t, f"{layout.tasks}/{bucket}/{t}") for t, bucket in entries]


def list_tasks(client: KazooClient, layout: ZkLayout, watch: Callable[[Any], None] | None = None) -> list[str]:
    """Every task id, sorted (a ``watch`` is armed on every bucket's children)."""
    return list_buckets(client, layout.task_buckets, "task id", watch)


def list_statuses(client: KazooClient, layout: ZkLayout, watch: Callable[[Any], None] | None = None) -> list[str]:
    """Every task id that has a status znode, sorted."""
    return list_buckets(client, layout.status_buckets, "task id", watch)


def ensure_layout(client: KazooClient, layout: ZkLayout) -> None:
    """Create the persistent containers and buckets of the layout (idempotent); a root in the flat layout of
    an earlier release raises LayoutError (``zkctl layout migrate`` converts it) before anything is written."""
    laid_out = check_root(client, layout)
    client.ensure_path(layout.root)
    # absent: the defaults (no throttle, maintenance off; creates measure their groups each time)
    optional = {layout.settings, layout.maintenance, layout.group_tallies, layout.admin_task_history}
    for path in layout.persistent_roots():
        try:
            client.ensure_path(path)
        except NoAuthError:
            if path not in optional:
                raise
            # a secured root laid out by an earlier release: only the admin role may create these, and
            # `zkctl security init` (idempotent) does; until then they read as their defaults
            log.warning("%s is missing and these credentials may not create it; run `zkctl security init`", path)
    if laid_out:
        return
    try:
        lay_out_buckets(client, layout)
    except NoAuthError:
        raise LayoutError(
            f"{layout.root} is not laid out in buckets yet and these credentials may not create them: "
            "run `zkctl security init` with admin credentials"
        ) from None
