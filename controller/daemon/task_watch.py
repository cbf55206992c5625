"""Tasks and admin requests: task specs and their watches, deletions (batched once owners let go),
statuses of deleted tasks, manual rebalances and reassignments."""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from controller.daemon import events as ev
from controller.daemon.context import ControllerContext, TaskWatch
from controller.daemon.groups import GroupDriver
from controller.daemon.host import Host, context_of, writer_of
from controller.daemon.metrics import ControllerMetrics
from controller.daemon.names import legal_children
from controller.daemon.watchers import DeletionWatch, TaskDataWatch, TaskTreeWatch
from controller.protocol.clock import Clock
from controller.protocol.cluster.layout import ZkLayout, bucket_of
from controller.protocol.records import admin_records, codecs, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import decode_task
from controller.zk.io import InterruptibleClient, WriteFailed, exists_many, get_many
from controller.zk.layout_io import list_buckets, list_tasks
from controller.zk.multi_read import multi_read
from controller.zk.watches import PersistentWatches

log = logging.getLogger(__name__)


# Tasks whose owner has let go are deleted in batches: once this many are ready, once none is still owned,
# or once the first ready one has waited this long (the timer enforces it), whichever comes first.
DELETE_BATCH_TASKS = 500


DELETE_LINGER_S = 0.5
# A deletion held up by something other than an owner (a stray child znode) is retried with this backoff.
DELETE_RETRY_BASE_S = 0.5
DELETE_RETRY_MAX_S = 30.0


def record_task(ctx: ControllerContext, t: str, data: bytes, path: str) -> None:
    """Record a task's spec as read from ``path``; a spec that does not decode is set apart in
    ``invalid_tasks`` (the task will not run), never handed to a coordinator."""
    try:
        ctx.tasks[t] = decode_task(data, path)
        ctx.invalid_tasks.pop(t, None)
    except PayloadError as exc:
        log.warning("task %s is invalid and will not run: %s", t, exc.reason)
        ctx.tasks.pop(t, None)
        ctx.invalid_tasks[t] = str(exc)


class TaskTracker:
    """Task, deletion, status and admin-request handlers, and the watches of this activation's tasks."""

    def __init__(
        self,
        host: Host,
        zk: InterruptibleClient,
        client: KazooClient,
        layout: ZkLayout,
        clock: Clock,
        metrics: ControllerMetrics,
        controller_id: str,
        task_watch: TaskWatch,
        groups: GroupDriver,
    ) -> None:
        self._host = host
        self._zk = zk
        self._client = client  # the persistent watch of /tasks is kept per kazoo client
        self._layout = layout
        self._clock = clock
        self._metrics = metrics
        self._id = controller_id
        self._task_watch_mode = task_watch
        self._groups = groups
        self._data_watcher: TaskDataWatch | None = None  # the one data watcher of every task znode, per activation
        self._tree_watcher: TaskTreeWatch | None = None  # the persistent watch of /tasks, per activation
        self._deletion_watch: DeletionWatch | None = None  # owner watches of tasks being deleted, coalesced
        self.tree_watched = False  # this activation watches /tasks with one persistent recursive watch

    # ---- watches ----------------------------------------------------------------------------------
    def task_watch(self, path: str) -> TaskDataWatch:
        """The activation's one watcher of task znodes (whatever the path). kazoo keeps a set of watchers per
        path, so a task armed twice (by the background armer and by a re-read) still fires once."""
        if self._data_watcher is None or self._data_watcher.token != self._host.token:
            self._data_watcher = TaskDataWatch(self._host.token, self._host.put)
        return self._data_watcher

    def watch_tree(self) -> bool:
        """Arm this activation's persistent recursive watch of ``/tasks``; False where the configuration or
        the server says one-shot watches (the caller arms those)."""
        self.tree_watched = False
        if self._task_watch_mode != "persistent":
            return False
        self._tree_watcher = TaskTreeWatch(self._host.token, self._host.put, self._layout)
        self.tree_watched = PersistentWatches.for_client(self._client).add(self._layout.tasks, self._tree_watcher)
        return self.tree_watched

    def unwatch_tree(self) -> None:
        """The activation is over: its watch goes (a candidate has no use for every task's events)."""
        if self.tree_watched:
            self.tree_watched = False
            PersistentWatches.for_client(self._client).remove(self._layout.tasks)

    def deletion_watcher(self) -> DeletionWatch:
        if self._deletion_watch is None or self._deletion_watch.token != self._host.token:
            self._deletion_watch = DeletionWatch(self._host.token, self._host.put)
        return self._deletion_watch

    # ---- specs ------------------------------------------------------------------------------------
    def write_invalid_statuses(self, invalid: dict[str, str]) -> None:
        writer = self._host.writer
        if not invalid or writer is None:
            return
        now = time.time()
        session = task_records.session_hex(self._client.client_id[0] if self._client.client_id else None)
        items = [
            (
                self._layout.status(t),
                codecs.encode(
                    task_records.TaskStatus(
                        broker="controller",
                        state="FAILED",
                        generation=0,
                        updated=now,
                        error=f"invalid task spec: {reason}",
                        session=session,
                    )
                ),
            )
            for t, reason in sorted(invalid.items())
        ]
        known = self._host.ctx.known_paths if self._host.ctx else None
        self._host.write(lambda: writer.upsert(items, known))

    def on_task_change(self, token: int, bucket: str | None = None) -> None:
        """Tasks created or deleted under one-shot watches: the bucket that fired is listed again (re-arming
        its watch), or every bucket when none is named."""
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        watch = self._host.bucket_watch(ev.TaskChange)
        known = ctx.tasks.keys() | ctx.invalid_tasks.keys()
        if bucket is not None and bucket in lay.task_buckets:
            ids = set(list_buckets(self._zk, [bucket], "task id", watch))
            name = bucket.rsplit("/", 1)[1]
            known = {t for t in known if bucket_of(t) == name}
        else:
            ids = set(list_tasks(self._zk, lay, watch))
        new_ids = sorted(ids - known)
        touched: set[str] = set()
        for t, res in zip(new_ids, self._read_specs(new_ids)):
            if res is not None:
                record_task(ctx, t, res[0], lay.task(t))
                if t in ctx.tasks:
                    touched.add(ctx.tasks[t].group)
        touched |= self._forget_tasks(sorted(known - ids))
        self._tasks_changed(touched)
        self.write_invalid_statuses({t: ctx.invalid_tasks[t] for t in new_ids if t in ctx.invalid_tasks})

    def _forget_tasks(self, gone: list[str]) -> set[str]:
        """Tasks deleted behind the controller's back: drop them and their statuses; returns their groups."""
        if not gone:
            return set()
        ctx = context_of(self._host)
        groups = {spec.group for t in gone if (spec := ctx.tasks.pop(t, None)) is not None}
        for t in gone:
            ctx.invalid_tasks.pop(t, None)
        statuses = [self._layout.status(t) for t in gone]
        self._host.write(lambda: writer_of(self._host).delete_if_present(statuses))
        return groups

    def _read_specs(self, ids: list[str]) -> list[Any]:
        """Task znodes, in order (None where gone): under the persistent watch of ``/tasks`` in multiRead
        requests, else pipelined, re-arming each one's data watch."""
        paths = [self._layout.task(t) for t in ids]
        if self.tree_watched:
            return multi_read(self._zk, paths)
        return get_many(self._zk, paths, watch=self.task_watch)

    def on_task_config_changes(self, token: int, task_ids: tuple[str, ...], new: bool = False) -> None:
        """Tasks' specs created, changed (paused, resumed, edited) or deleted: one batched re-read.

        A task the context does not know is new where the persistent watch of ``/tasks`` (or a resync,
        ``new``) reports it; under one-shot watches it was deleted by us, or is new and TaskChange reads it."""
        if not self._host.current(token):
            return
        ctx = context_of(self._host)
        if new or self.tree_watched:
            ids = sorted(set(task_ids))
        else:
            ids = sorted(t for t in task_ids if t in ctx.tasks or t in ctx.invalid_tasks)
        touched: set[str] = set()
        gone: list[str] = []
        for t, res in zip(ids, self._read_specs(ids)):
            if res is None:
                if t in ctx.tasks or t in ctx.invalid_tasks:
                    gone.append(t)
                continue
            before = ctx.tasks.get(t)
            record_task(ctx, t, res[0], self._layout.task(t))
            after = ctx.tasks.get(t)
            if before != after:
                touched |= {s.group for s in (before, after) if s is not None}
        touched |= self._forget_tasks(gone)
        self._tasks_changed(touched)
        self.write_invalid_statuses({t: ctx.invalid_tasks[t] for t in ids if t in ctx.invalid_tasks})

    def on_tasks_resync(self, token: int) -> None:
        """The tasks' watches may have missed changes (a dropped connection): re-arm them, then read every
        task again, the known ones and the listed ones, and apply what differs."""
        if not self._host.current(token):
            return
        watcher = self._tree_watcher if self.tree_watched else self._data_watcher
        if watcher is not None:
            watcher.taken()
        if self.tree_watched:
            PersistentWatches.for_client(self._client).ensure(self._layout.tasks)
        watch = None if self.tree_watched else self._host.bucket_watch(ev.TaskChange)
        listed = list_tasks(self._zk, self._layout, watch)
        ctx = context_of(self._host)
        known = ctx.tasks.keys() | ctx.invalid_tasks.keys()
        log.info("controller %s: reading %d tasks again after a dropped connection", self._id, len(known | set(listed)))
        self.on_task_config_changes(token, tuple(sorted(known | set(listed))), new=True)

    def _tasks_changed(self, groups: set[str]) -> None:
        ctx = context_of(self._host)
        self._metrics.tasks.set(len(ctx.tasks))
        self._metrics.invalid_tasks.set(len(ctx.invalid_tasks))
        for g in sorted(groups):
            coord = self._groups.coordinator(g)
            self._host.apply(g, coord.on_tasks(ctx.group_tasks(g)))

    # ---- deletions --------------------------------------------------------------------------------
    def on_task_deletion(self, token: int) -> None:
        """Delete requested tasks once their owner has let go (revoke first, never under a runner).

        Each requested task's owner is looked up once (pipelined ``exists``, arming a watch); after that
        the watch says when it is released, and only owners that reappeared are looked up again. Tasks
        whose owner is gone are deleted in batches (see ``flush_deletions``).
        """
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        watch = self.deletion_watcher()
        released, recheck, rescan = watch.take()
        requested = set(
            legal_children(
                self._host, lay, lay.admin_delete_tasks, self._zk.get_children(lay.admin_delete_tasks, watch=watch)
            )
        )
        newly, withdrawn = requested - ctx.deleting, ctx.deleting - requested
        ctx.deleting = requested
        for t in withdrawn:
            ctx.deletable.pop(t, None)
        self._tasks_changed({ctx.tasks[t].group for t in newly | withdrawn if t in ctx.tasks})
        check = sorted(requested if rescan else (newly | recheck) & requested)
        owners = exists_many(self._zk, [lay.task_owner(t) for t in check], watch=lambda _p: watch)
        now = self._clock.now()
        for t, owner in zip(check, owners):
            if owner is None:
                ctx.deletable.setdefault(t, now)
            else:
                ctx.deletable.pop(t, None)
        for t in (released & requested) - set(check):
            ctx.deletable.setdefault(t, now)
        self.flush_deletions()

    def deletion_deadline(self) -> float | None:
        """When the next batch of deletions is due: the linger of the oldest deletable task, or the next
        retry of one that failed (backing off), whichever is first."""
        ctx = self._host.ctx
        if not ctx or not ctx.deletable:
            return None
        retry = ctx.deletion_retry
        return min(
            max(since + DELETE_LINGER_S, retry[t][1] if t in retry else 0.0) for t, since in ctx.deletable.items()
        )

    def flush_deletions(self) -> None:
        """Delete the tasks whose owner is gone, with their statuses, histories and requests: a task, its status,
        its history and its request go in the same fenced multi; the statuses to delete come from one listing,
        the histories from one pipelined ``exists``."""
        ctx, lay = context_of(self._host), self._layout
        now = self._clock.now()
        ready = {
            t: since
            for t, since in ctx.deletable.items()
            if t not in ctx.deletion_retry or ctx.deletion_retry[t][1] <= now
        }
        if not ready:
            return  # only retries backing off: the timer brings us back
        still_owned = ctx.deleting - ctx.deletable.keys()
        if still_owned and len(ready) < DELETE_BATCH_TASKS and now < min(ready.values()) + DELETE_LINGER_S:
            return  # more releases are on their way: delete them together
        done = sorted(ready)
        statuses = set(list_buckets(self._zk, sorted({lay.status_bucket(t) for t in done}), "task id"))
        history = {t for t, st in zip(done, exists_many(self._zk, [lay.task_history(t) for t in done])) if st}
        groups = [
            [lay.task(t)]
            + ([lay.status(t)] if t in statuses else [])
            + ([lay.task_history(t)] if t in history else [])
            + [lay.admin_delete_task(t)]
            for t in done
        ]
        present = {p for t, g in zip(done, groups) for p in g[1:]}  # the listings say so
        present |= {lay.task(t) for t in done if t in ctx.tasks or t in ctx.invalid_tasks}
        blocked = {done[i] for i in self._host.write(lambda: writer_of(self._host).delete_groups(groups, present))}
        owned, stuck = self._why_blocked(sorted(blocked))
        for t in done:
            if t in stuck:
                continue  # stays deletable, retried after its backoff
            ctx.deletable.pop(t, None)
            ctx.deletion_retry.pop(t, None)
            if t not in blocked:
                ctx.tasks.pop(t, None)
                ctx.invalid_tasks.pop(t, None)
                ctx.deleting.discard(t)
        if owned:  # an owner came back meanwhile: wait for it again
            self.deletion_watcher().recheck(owned)
        self._metrics.tasks.set(len(ctx.tasks))
        self._metrics.invalid_tasks.set(len(ctx.invalid_tasks))
        log.info("deleted %d tasks %s", len(done) - len(blocked), done[:10])

    def _why_blocked(self, blocked: list[str]) -> tuple[set[str], set[str]]:
        """Tasks whose deletion found children: those with an ``owner`` again (wait for its release), and
        those held up by anything else (a stray znode someone created under the task). A stray child is
        deleted with its subtree (bounded), and the task retried with exponential backoff, so a child we
        may not delete costs a retry every few seconds at most, never a busy loop."""
        ctx, lay = context_of(self._host), self._layout
        owned: set[str] = set()
        stuck: set[str] = set()
        for t in blocked:
            try:
                children = self._zk.get_children(lay.task(t))
            except NoNodeError:
                continue  # gone after all: the next look finds nothing to do
            if "owner" in children:
                owned.add(t)
                continue
            failures = ctx.deletion_retry.get(t, (0, 0.0))[0] + 1
            delay = min(DELETE_RETRY_MAX_S, DELETE_RETRY_BASE_S * 2 ** (failures - 1))
            ctx.deletion_retry[t] = (failures, self._clock.now() + delay)
            stuck.add(t)
            for child in children:
                path = f"{lay.task(t)}/{child}"
                try:
                    self._host.write(partial(writer_of(self._host).delete_tree, path))
                    log.warning("deleting task %s: removed %s, a znode that is not ours", t, path)
                except (KazooException, WriteFailed) as exc:
                    log.warning(
                        "deleting task %s: cannot remove %s (%s); retrying in %.1fs", t, path, type(exc).__name__, delay
                    )
        return owned, stuck

    def on_statuses_change(self, token: int, bucket: str | None = None) -> None:
        """Delete statuses of tasks that no longer exist: a worker's status write for a task it was letting
        go of can land after the task and its status were deleted. One listing of the bucket that fired, or
        of every bucket (re-arming their watches); the orphans go in fenced multis."""
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        watch = self._host.bucket_watch(ev.StatusesChange)
        buckets = [bucket] if bucket is not None and bucket in lay.status_buckets else list(lay.status_buckets)
        names = list_buckets(self._zk, buckets, "task id", watch)  # illegal names are logged and left out
        orphans = [lay.status(t) for t in names if t not in ctx.tasks and t not in ctx.invalid_tasks]
        if orphans:
            log.info("deleting %d statuses of tasks that no longer exist %s", len(orphans), orphans[:5])
            self._host.write(lambda: writer_of(self._host).delete_if_present(orphans, present=set(orphans)))

    # ---- admin requests ---------------------------------------------------------------------------
    def on_admin_rebalance(self, token: int) -> None:
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        names = sorted(self._zk.get_children(lay.admin_rebalance, watch=self._host.watch(ev.Rebalance)))
        paths = [f"{lay.admin_rebalance}/{n}" for n in names]
        for path, res in zip(paths, get_many(self._zk, paths)):
            if res is None:
                continue
            try:
                req = codecs.decode(admin_records.RebalanceRequest, res[0], path)
            except PayloadError as exc:
                log.warning("dropping %s", exc)
                continue
            groups = [req.group] if req.group else sorted(ctx.groups)
            for g in groups:
                if g in ctx.groups:
                    self._host.apply(
                        g, ctx.groups[g].on_rebalance_request(f"requested: {req.reason}", preferred=req.preferred)
                    )
        if paths:
            self._host.write(lambda: writer_of(self._host).delete_if_present(paths))

    def on_reassign(self, token: int) -> None:
        if not self._host.current(token):
            return
        ctx, lay = context_of(self._host), self._layout
        listed = self._zk.get_children(lay.admin_reassign, watch=self._host.watch(ev.Reassign))
        names = legal_children(self._host, lay, lay.admin_reassign, listed)
        paths = [lay.admin_reassign_of(n) for n in names]
        for path, res in zip(paths, get_many(self._zk, paths)):
            if res is None:
                continue
            try:
                req = codecs.decode(admin_records.ReassignRequest, res[0], path)
            except PayloadError as exc:
                log.warning("dropping %s", exc)
                continue
            spec = ctx.tasks.get(req.task_id)
            if spec is not None:
                self._host.apply(spec.group, self._groups.coordinator(spec.group).on_reassign(req.task_id, req.to))
        if paths:
            self._host.write(lambda: writer_of(self._host).delete_if_present(paths))
