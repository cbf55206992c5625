"""Migrating a flat root (``/tasks/<id>``, ``/status/<id>`` of releases before buckets) to the bucketed layout.

Offline, by design: a running task's ``owner`` is an ephemeral znode of its broker's session, which no other
session can move, so the migration refuses while a controller or a broker is registered; and every process
of this release refuses a flat root (``layout_io.check_root``) until the marker is written, which happens
last. Each task and each status moves in a multi (create it in its bucket with its data and ACL, delete the
flat znode at the version read), so an interruption leaves every one in exactly one place, and running the
migration again takes up where it stopped. What cannot move (an owner left behind, a stray child, a name
that is not a task id, a znode changed meanwhile) is reported and keeps the marker unwritten.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from controller.protocol.cluster.layout import InvalidName, ZkLayout, check_name
from controller.protocol.records import codecs, registration_records
from controller.protocol.records.payload_validation import PayloadError
from controller.zk.io import MAX_BYTES_PER_MULTI, WAIT_S
from controller.zk.layout_io import LayoutError, create_buckets, flat_entries, read_layout_info, write_layout_info
from controller.zk.multi_read import multi_children, multi_read

log = logging.getLogger(__name__)

# znodes read and moved per round (two operations each); a multi also stops at MAX_BYTES_PER_MULTI of data
MOVES_PER_MULTI = 100
#: one znode to move, as read: (flat path, bucketed path, data, version, ACL)
Move = tuple[str, str, bytes, int, list[Any]]


@dataclass(frozen=True)
class MigrationResult:
    root: str
    dry_run: bool
    already: bool  # the root was laid out in buckets already: nothing to do
    tasks: int  # flat task znodes found
    statuses: int  # flat status znodes found
    moved: int  # znodes moved (0 in a dry run)
    multis: int
    blocked: tuple[tuple[str, str], ...]  # (path, why it cannot move)
    done: bool  # the marker is written: the root is bucketed
    seconds: float


def _refuse_if_live(client: KazooClient, layout: ZkLayout) -> None:
    """A registered controller or broker may be running the flat layout: stop them first."""
    live: list[str] = []
    try:
        data, _ = client.get(layout.controller)
        try:
            live.append(
                f"controller {codecs.decode(registration_records.ControllerInfo, data, layout.controller).controller_id}"
            )
        except PayloadError:
            live.append("a controller")
    except NoNodeError:
        pass
    try:
        brokers = sorted(client.get_children(layout.broker_ids))
    except NoNodeError:
        brokers = []
    if brokers:
        live.append(f"{len(brokers)} broker(s) ({', '.join(brokers[:5])}{', ...' if len(brokers) > 5 else ''})")
    if live:
        raise LayoutError(
            f"{layout.root}: {' and '.join(live)} still registered; stop every controller and broker "
            "of this root, then migrate (nothing was changed)"
        )


def _plan(client: KazooClient, layout: ZkLayout) -> tuple[list[tuple[str, str, str]], list[tuple[str, str]], int, int]:
    """The moves ``(kind, old path, new path)`` and what is blocked, from one read of the flat entries."""
    tasks, statuses = flat_entries(client, layout)
    moves: list[tuple[str, str, str]] = []
    blocked: list[tuple[str, str]] = []
    for kind, parent, names, new_path in (
        ("task", layout.tasks, tasks, layout.task),
        ("status", layout.statuses, statuses, layout.status),
    ):
        legal = []
        for name in names:
            try:
                check_name("task id", name)
                legal.append(name)
            except InvalidName:
                blocked.append((f"{parent}/{name}", "not a task id: delete or rename it"))
        old = [f"{parent}/{n}" for n in legal]
        children = multi_children(client, old) if kind == "task" else [[] for _ in old]
        for name, path, kids in zip(legal, old, children):
            if kids:
                why = (
                    "its owner znode is still there (a broker's session is alive)"
                    if "owner" in kids
                    else f"it has child znodes ({', '.join(sorted(kids)[:5])}) that are not ours: delete them"
                )
                blocked.append((path, why))
            elif kids is not None:
                moves.append((kind, path, new_path(name)))
    return moves, blocked, len(tasks), len(statuses)


def _move(client: KazooClient, moves: list[tuple[str, str, str]]) -> tuple[int, int, list[tuple[str, str]]]:
    """Move the znodes in multis; returns (moved, multis, blocked)."""
    moved = multis = 0
    blocked: list[tuple[str, str]] = []
    for lo in range(0, len(moves), MOVES_PER_MULTI):
        batch = moves[lo : lo + MOVES_PER_MULTI]
        reads = multi_read(client, [old for _k, old, _n in batch])
        acls = [client.get_acls_async(old) for _k, old, _n in batch]
        items: list[Move] = []
        for (_kind, old, new), res, acl in zip(batch, reads, acls):
            try:
                acl_list = acl.get(timeout=WAIT_S)[0]
            except NoNodeError:
                res = None
            if res is None:
                continue  # gone since the listing: nothing to move
            items.append((old, new, res[0], res[1].version, acl_list))
        for part in _parts(items):
            m, n, b = _move_part(client, part)
            moved, multis = moved + m, multis + n
            blocked += b
    return moved, multis, blocked


def _parts(items: list[Move]) -> list[list[Move]]:
    """Items in multis of at most ``MAX_BYTES_PER_MULTI`` of data (a spec may be up to 900 KiB)."""
    parts: list[list[Move]] = []
    size = 0
    for item in items:
        if not parts or size + len(item[2]) > MAX_BYTES_PER_MULTI:
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += len(item[2])
    return parts


def _move_part(client: KazooClient, items: list[Move]) -> tuple[int, int, list[tuple[str, str]]]:
    """One multi for ``items``; if it fails, one per item. Returns (moved, multis, blocked)."""
    moved, multis = 0, 1
    blocked: list[tuple[str, str]] = []
    if _commit(client, items) is None:
        return len(items), multis, blocked
    for item in items:  # one of them failed, so none moved: one by one, to name what cannot move
        multis += 1
        error = _commit(client, [item])
        if error is None:
            moved += 1
        elif isinstance(error, NodeExistsError):
            blocked.append((item[0], "it exists in its bucket too: delete one of the two"))
        else:
            blocked.append(
                (item[0], f"it changed or went while migrating ({type(error).__name__}): run the migration again")
            )
    return moved, multis, blocked


def _commit(client: KazooClient, items: list[Move]) -> Exception | None:
    """One multi: each item created in its bucket, its flat znode deleted at the version read; the first
    error (the multi then changed nothing), or None."""
    tx = client.transaction()
    for old, new, data, version, acl_list in items:
        tx.create(new, data, acl=acl_list)
        tx.delete(old, version=version)
    errors = [r for r in tx.commit() if isinstance(r, Exception)]
    return next((e for e in errors if type(e).__name__ != "RolledBackError"), errors[0]) if errors else None


def _lock_held(client: KazooClient, layout: ZkLayout, session_timeout_s: float | None) -> str:
    """Why the lock cannot be taken: whose session holds it, and when it goes if that migration was killed."""
    stat = client.exists(layout.layout_migration)
    if stat is None:
        return f"{layout.root}: another migration was running a moment ago; run it again"
    age = max(0.0, time.time() - stat.ctime / 1000)
    timeout = f"{session_timeout_s:g}s" if session_timeout_s else "its session timeout"
    by = (
        f", by about {time.strftime('%H:%M:%S', time.localtime(time.time() + session_timeout_s))}"
        if session_timeout_s
        else ""
    )
    return (
        f"{layout.root}: the migration lock {layout.layout_migration} is held by ZooKeeper session "
        f"0x{stat.ephemeralOwner:x} (taken {age:.0f}s ago), which has not expired yet. Another migration is "
        f"running, or one was killed: its lock goes when its session expires, at most {timeout} after it "
        f"died{by}; run this again then"
    )


def migrate(
    client: KazooClient, layout: ZkLayout, dry_run: bool = False, session_timeout_s: float | None = None
) -> MigrationResult:
    """Migrate ``layout.root`` from the flat layout to buckets (see the module's docstring); a dry run reads
    and reports what would move, and writes nothing. ``session_timeout_s`` (the migrating clients' session
    timeout) lets a held lock say when it goes."""
    started = time.monotonic()
    if read_layout_info(client, layout) is not None:
        return MigrationResult(layout.root, dry_run, True, 0, 0, 0, 0, (), True, time.monotonic() - started)
    if client.exists(layout.root) is None:
        raise LayoutError(f"no cluster root at {layout.root}: nothing to migrate")
    _refuse_if_live(client, layout)
    moves, blocked, n_tasks, n_statuses = _plan(client, layout)
    if dry_run:
        return MigrationResult(
            layout.root, True, False, n_tasks, n_statuses, 0, 0, tuple(blocked), False, time.monotonic() - started
        )
    try:
        client.create(layout.layout_migration, b"", ephemeral=True)
    except NodeExistsError:
        raise LayoutError(_lock_held(client, layout, session_timeout_s)) from None
    try:
        for path in (layout.tasks, layout.statuses):
            client.ensure_path(path)
        create_buckets(client, layout)
        moved, multis, failed = _move(client, moves)
        blocked += failed
        left = flat_entries(client, layout)
        done = not blocked and not left[0] and not left[1]
        if done:
            write_layout_info(client, layout)
    finally:
        try:
            client.delete(layout.layout_migration)
        except NoNodeError:
            pass
    log.info(
        "migrated %s: %d znodes moved in %d multis, %d blocked%s",
        layout.root,
        moved,
        multis,
        len(blocked),
        "; laid out in buckets" if done else "",
    )
    return MigrationResult(
        layout.root, False, False, n_tasks, n_statuses, moved, multis, tuple(blocked), done, time.monotonic() - started
    )
