"""Run intervals left open by a session that has ended. A broker killed with SIGKILL never flushes the end of
its runs: its last interval per task stays open, and a timeline that draws it up to "now" shows two owners
at once on every task that moved, growing by the second, while nothing of the kind happened. A dead
session's run ended at the latest when the session did, and ZooKeeper says when that was: its owner znode
went before the next owner's was created, and its registration before the broker's next one. An open
interval of a live session is left open (it is running); a real overlap (two runs recorded as overlapping)
is never touched."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from controller.protocol import codecs
from controller.protocol.codecs import OwnerInfo, PayloadError, RunInterval
from controller.protocol.layout import ZkLayout


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


def close_ended_sessions(client: KazooClient, layout: ZkLayout, intervals: list[RunInterval]) -> list[RunInterval]:
    """``intervals`` with every open run of an ended session closed when that session ended at the latest."""
    open_intervals = [iv for iv in intervals if iv.end is None]
    if not open_intervals:
        return intervals
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
    ends = session_ends(open_intervals, registered, owners, flushed)
    if not ends:
        return intervals
    closed = {id(open_intervals[k]): end for k, end in ends.items()}
    return [
        dataclasses.replace(iv, end=closed[id(iv)], released=iv.released if iv.released is not None else closed[id(iv)])
        if id(iv) in closed
        else iv
        for iv in intervals
    ]
