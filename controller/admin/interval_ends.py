"""Run intervals left open by a session that has ended. A broker killed with SIGKILL never flushes the end of
its runs: its last interval per task stays open, and a timeline that draws it up to "now" shows two owners
at once on every task that moved, growing by the second, while nothing of the kind happened. A dead
session's run ended at the latest when the session did, and ZooKeeper says when that was: its owner znode
went before the next owner's was created, and its registration before the broker's next one. An open
interval of a live session is left open (it is running); a real overlap (two runs recorded as overlapping)
is never touched.

A live broker's log trails its runs too: it rewrites it at most every ``intervals_flush_s`` (2 s), and only
after it let go of the task, so for that long its log still shows a run it has ended while the next owner's
log may already show its start: two owners at once, in ZooKeeper, where none ran. ``unflushed_ends`` names
such runs; a checker of overlaps reads again until there are none (``settled_intervals``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import OwnerInfo, RunInterval


def _got(async_result: Any) -> Any:
    """A pipelined read's result, None for a znode that is not there."""
    try:
        return async_result.get(timeout=30)
    except NoNodeError:
        return None


def session_ends(
    open_intervals: Sequence[RunInterval],
    registered: dict[str, float | None],
    owners: dict[str, tuple[str, float] | None],
    flushed: dict[str, float | None],
) -> dict[int, float]:
    """Pure: for each open interval (by index) whose broker's session has ended, when it ended at the latest.

    ``registered``: broker -> when its current registration was created (None: not registered);
    ``owners``: task -> (broker, when its owner znode was created) or None; ``flushed``: broker -> when it last
    wrote its interval log (a time the session was still alive: the fallback when nothing later is known)."""
    out: dict[int, float] = {}
    for k, iv in enumerate(open_intervals):
        since = registered.get(iv.broker)
        if since is not None and since <= iv.start:
            continue  # the session that started this run is the one registered now: still running
        bounds = [since] if since is not None else []
        owner = owners.get(iv.task_id)
        if owner is not None and owner[1] > iv.start:
            bounds.append(owner[1])  # the next owner's znode: created after this session's owner znode went
        if not bounds and flushed.get(iv.broker) is not None:
            bounds.append(flushed[iv.broker] or 0.0)
        if bounds:
            out[k] = max(iv.start, min(bounds))
    return out


def unflushed_ends(
    open_intervals: Sequence[RunInterval],
    registered: dict[str, float | None],
    owners: dict[str, tuple[str, float] | None],
) -> list[int]:
    """Pure: the open intervals (by index) of live sessions whose end is not in their broker's log yet. A live
    session's run is current while its task's owner znode names its broker and was created no later than the
    run took it (``acquired``, else ``start``; the owner znode is created before either); any other open run of
    a live session was let go (the task has another owner, none, or a newer owner znode of its own) and its
    end is on its way. (Were it never to come, the broker would be running a task it does not own: a reader
    that waits for these ends and then checks for overlaps finds that too.) An ended session's runs are
    ``session_ends``'s. ``registered`` and ``owners`` as there."""
    out: list[int] = []
    for k, iv in enumerate(open_intervals):
        since = registered.get(iv.broker)
        if since is None or since > iv.start:
            continue  # the session that started this run has ended
        owner = owners.get(iv.task_id)
        took = iv.acquired if iv.acquired is not None else iv.start
        if owner is None or owner[0] != iv.broker or owner[1] > took:
            out.append(k)
    return out


def _session_facts(
    client: KazooClient, layout: ZkLayout, open_intervals: Sequence[RunInterval]
) -> tuple[dict[str, float | None], dict[str, tuple[str, float] | None], dict[str, float | None]]:
    """What ZooKeeper says of the sessions of these runs, in one pipelined round: each broker's registration
    and interval log (when created, when last written) and each task's owner znode (whose, since when)."""
    brokers = sorted({iv.broker for iv in open_intervals})
    tasks = sorted({iv.task_id for iv in open_intervals})
    reg_async = {b: client.exists_async(layout.broker(b)) for b in brokers}
    log_async = {b: client.exists_async(layout.broker_intervals(b)) for b in brokers}
    own_async = {t: client.get_async(layout.task_owner(t)) for t in tasks}
    registered = {b: (s.ctime / 1000 if (s := _got(a)) is not None else None) for b, a in reg_async.items()}
    flushed = {b: (s.mtime / 1000 if (s := _got(a)) is not None else None) for b, a in log_async.items()}
    owners: dict[str, tuple[str, float] | None] = {}
    for t, a in own_async.items():
        got = _got(a)
        owners[t] = None
        if got is not None:
            data, stat = got
            try:
                owners[t] = (codecs.decode(OwnerInfo, data, layout.task_owner(t)).broker, stat.ctime / 1000)
            except PayloadError:
                owners[t] = ("", stat.ctime / 1000)
    return registered, owners, flushed


def close_ended_sessions(client: KazooClient, layout: ZkLayout, intervals: list[RunInterval]) -> list[RunInterval]:
    """``intervals`` with every open run of an ended session closed when that session ended at the latest."""
    return settled_intervals(client, layout, intervals)[0]


def settled_intervals(
    client: KazooClient, layout: ZkLayout, intervals: list[RunInterval]
) -> tuple[list[RunInterval], list[RunInterval]]:
    """``close_ended_sessions``'s intervals, and the open runs of live sessions whose end is still on its way
    (``unflushed_ends``): until there are none of those, an overlap in the first is not yet a verdict."""
    open_intervals = [iv for iv in intervals if iv.end is None]
    if not open_intervals:
        return intervals, []
    registered, owners, flushed = _session_facts(client, layout, open_intervals)
    pending = [open_intervals[k] for k in unflushed_ends(open_intervals, registered, owners)]
    ends = session_ends(open_intervals, registered, owners, flushed)
    if not ends:
        return intervals, pending
    closed = {id(open_intervals[k]): end for k, end in ends.items()}
    return [
        dataclasses.replace(iv, end=closed[id(iv)], released=iv.released if iv.released is not None else closed[id(iv)])
        if id(iv) in closed
        else iv
        for iv in intervals
    ], pending
