"""Task operations: create (validated before anything is written), list, describe, delete, pause,
resume, restart, reassign, and the recorded run intervals."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)

from controller.admin.common import (
    WAIT_S,
    AdminError,
    Conflict,
    NotFound,
    Progress,
    ensure_layout,
    file_request,
    wait_watched,
)
from controller.admin.declarative import (
    DECLARATIVE_VALIDATOR,
    load_declarative_validator,
    run_validator,
)
from controller.admin.reads import ClusterReads, decode_read
from controller.admin.task_history import LifecycleLock
from controller.admin.views import (
    AdminRequest,
    CreateResult,
    TaskChange,
    TaskDescription,
    TaskPage,
    TaskRow,
    restart_progress,
    shown_status,
    stale_after,
    unassigned_since,
)
from controller.protocol.cluster.layout import BUCKET_NAMES, BUCKETS, InvalidName, ZkLayout, bucket_of, check_name
from controller.protocol.errors import ZkcError
from controller.protocol.group import tally
from controller.protocol.records import admin_records, codecs, group_messages, registration_records, task_records
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.tasks.spec import DeclarativePipeline, SparkPipeline, SpecError, TaskSpec, decode_task
from controller.zk.io import Op, SetData
from controller.zk.multi_read import multi_children

log = logging.getLogger(__name__)


def _in_bucket(name: str, bucket: str) -> bool:
    """Whether a bucket's child ``name`` is a task of that bucket (a legal id that hashes to it)."""
    try:
        return bucket_of(check_name("task id", name)) == bucket
    except InvalidName:
        return False


class TaskAdmin:
    """The task part of ``AdminClient``: writes through the client, reads through the shared reads."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        *,
        retries: int = 5,
        lifecycle: Callable[[str, str, str], LifecycleLock] | None = None,
        checkpoint_size: Callable[[str], Any] | None = None,
        purge: Callable[[str], str] | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        self.retries = retries
        #: the lock over a task's lifecycle (``HistoryAdmin.check_lifecycle``: task, verb, detail): refuses every
        #: verb during a reset or a deletion, else the history event its write commits with it
        self.lifecycle = lifecycle
        #: the task's checkpoint size, for ``describe`` of a streaming spark task
        self.checkpoint_size = checkpoint_size
        #: removes a deleted task's checkpoint, saying what it removed
        self.purge = purge

    # ---- tasks ------------------------------------------------------------------------------------
    def create_tasks(self, specs: Sequence[TaskSpec], dry_run: bool = False) -> CreateResult:
        """Validate every spec, refuse ids that exist (naming them), then create all in one ``multi``
        (several multis, each atomic, only for batches over 500 tasks or 512 KiB)."""
        from controller.zk.io import Create, Delete, chunk_ops, exists_many

        specs = [s if s.revision == 1 else s.model_copy(update={"revision": 1}) for s in specs]  # the cluster counts
        if not specs:
            raise SpecError("no task specs given")
        seen: set[str] = set()
        for s in specs:
            if s.id in seen:
                raise SpecError(f"task id {s.id!r} appears twice")
            seen.add(s.id)
        notes = list(self._validate_declarative(specs))
        payloads = [(s, s.encode()) for s in specs]  # SpecError for an oversized spec
        use_tally = True
        for _attempt in range(self.retries + 1):
            tally_ops = self._tally_ops(specs) if use_tally else self._check_group_payloads(specs)
            lay = self.layout
            ids = [s.id for s in specs]
            stats = exists_many(
                self.client,
                [lay.task(t) for t in ids] + [lay.status(t) for t in ids] + [lay.task_history(t) for t in ids],
            )
            existing = [t for t, st in zip(ids, stats[: len(ids)]) if st is not None]
            if existing:
                raise Conflict(
                    f"task{'s' if len(existing) > 1 else ''} already exist{'' if len(existing) > 1 else 's'}: "
                    f"{', '.join(existing[:20])}{' ...' if len(existing) > 20 else ''}; nothing was created"
                )
            stale = [t for t, st in zip(ids, stats[len(ids) : 2 * len(ids)]) if st is not None]
            old_history = [t for t, st in zip(ids, stats[2 * len(ids) :]) if st is not None]  # a deleted namesake's
            ops: list[Op] = list(tally_ops)
            ops += [Create(lay.task(s.id), data) for s, data in payloads] + [Delete(lay.status(t)) for t in stale]
            ops += [Delete(lay.task_history(t)) for t in old_history]
            batches = chunk_ops(ops)
            as_json = tuple(s.model_dump(mode="json", by_alias=True) for s in specs)
            if dry_run:
                return CreateResult(True, tuple(ids), as_json, tuple(notes + ["dry run: nothing written"]), 0)
            ensure_layout(self.client, lay)
            # the first batch carries the tallies' check-and-set: it commits alone, and a lost race retries
            first = self._commit([batches[0]])
            race = [r for op, r in first[1] + first[2] if op in tally_ops]
            if any(isinstance(r, NoNodeError) for r in race):
                use_tally = False  # a root laid out before tallies, whose container we may not create
                continue
            if any(isinstance(r, (BadVersionError, NodeExistsError)) for r in race):
                continue  # another create wrote the tally since we read it: read it again
            created, clashes, other = first
            if len(batches) > 1:
                notes.append(f"{len(specs)} specs are written in {len(batches)} multis (each one atomic)")
                more = self._commit(batches[1:])
                created, clashes, other = created + more[0], clashes + more[1], other + more[2]
            if clashes or other:
                what = (
                    [f"already exist: {', '.join(op.path.rsplit('/', 1)[1] for op, _ in clashes)}"] if clashes else []
                ) + [f"{type(r).__name__} on {op.path}" for op, r in other[:3]]
                done = f"; created {', '.join(created)}" if created else "; nothing was created"
                raise AdminError("; ".join(what) + done)
            return CreateResult(False, tuple(ids), as_json, tuple(notes), len(batches))
        raise AdminError(f"the group tallies changed under {self.retries + 1} attempts; nothing was created, retry")

    def _commit(
        self, batches: Sequence[Sequence[Op]]
    ) -> tuple[list[str], list[tuple[Op, Exception]], list[tuple[Op, Exception]]]:
        """Commit each batch as one multi, all at once: the tasks created, the ops that met an existing znode,
        and the ops that failed otherwise."""
        from controller.zk.io import Create

        pending = []
        for batch in batches:
            t = self.client.transaction()
            for op in batch:
                if isinstance(op, Create):
                    t.create(op.path, op.data)
                elif isinstance(op, SetData):
                    t.set_data(op.path, op.data, version=op.version)
                else:
                    t.delete(op.path)
            pending.append((batch, t.commit_async()))
        created: list[str] = []
        clashes: list[tuple[Op, Exception]] = []
        other: list[tuple[Op, Exception]] = []
        for batch, res in pending:
            results = res.get(timeout=WAIT_S)
            failed = [
                (op, r)
                for op, r in zip(batch, results)
                if isinstance(r, Exception) and not isinstance(r, RolledBackError)
            ]
            if not failed:
                created += [
                    op.path.rsplit("/", 1)[1]
                    for op in batch
                    if isinstance(op, Create) and self.layout.task_of(op.path) is not None
                ]
            for op, r in failed:
                (clashes if isinstance(r, NodeExistsError) else other).append((op, r))
        return created, clashes, other

    def _tally_ops(self, specs: Sequence[TaskSpec]) -> list[Op]:
        """The check-and-set of each group's tally with ``specs`` added: one read per group, not per task. A
        group without a tally, or whose bound would pass the budget, is measured from its specs (once: the
        measure is written). Raises SpecError when a group would not fit."""
        from controller.zk.io import Create

        lay = self.layout
        groups = sorted({s.group for s in specs})
        got, _ = self.reads.wave([lay.group_tally(g) for g in groups])
        ops: list[Op] = []
        unmeasured: list[str] = []
        grown: dict[str, admin_records.GroupTally] = {}
        for g, res in zip(groups, got):
            prior, _err = decode_read(admin_records.GroupTally, res, lay.group_tally(g))
            new = [s.descriptor() for s in specs if s.group == g]
            after = tally.grow(prior, new) if prior is not None else None
            if after is None:
                unmeasured.append(g)
            else:
                grown[g] = after
        measured = self._measure_groups(specs, unmeasured) if unmeasured else {}
        for g, res in zip(groups, got):
            after = grown.get(g) or measured[g]
            data = codecs.encode(after)
            ops.append(
                Create(lay.group_tally(g), data) if res is None else SetData(lay.group_tally(g), data, res[1].version)
            )
        return ops

    def _check_group_payloads(self, specs: Sequence[TaskSpec]) -> list[Op]:
        """The exact check without a tally (a root whose tally container these credentials may not create):
        every group of ``specs`` measured from the specs. No op to add."""
        self._measure_groups(specs, sorted({s.group for s in specs}))
        return []

    def _measure_groups(self, specs: Sequence[TaskSpec], groups: Sequence[str]) -> dict[str, admin_records.GroupTally]:
        """Refuse specs that would make a group's protocol payloads too large for ZooKeeper (a group whose
        join result cannot be written cannot be scheduled at all): the group's tasks as they are plus the
        new ones, measured as the join result of a loaded rebalance, against ``GROUP_PAYLOAD_BUDGET``. This
        reads every spec of the cluster (no index of a group's tasks): the tally spares it to most creates."""
        from controller.zk.multi_read import multi_read

        new_ids = {s.id for s in specs}
        lay = self.layout
        existing = [t for t in self.reads.task_ids() if t not in new_ids]
        by_group: dict[str, list[group_messages.TaskDescriptor]] = {g: [] for g in groups}
        for t, res in zip(existing, multi_read(self.client, [lay.task(t) for t in existing])):
            if res is None:
                continue
            try:
                spec = decode_task(res[0], lay.task(t))
            except (PayloadError, SpecError):
                continue  # a malformed spec is the controller's to report; it is not scheduled
            if spec.group in by_group:
                by_group[spec.group].append(spec.descriptor())
        for s in specs:
            if s.group in by_group:
                by_group[s.group].append(s.descriptor())
        out = {}
        for g, tasks in sorted(by_group.items()):
            out[g] = tally.measure(tasks)
            if out[g].payload_bytes > codecs.GROUP_PAYLOAD_BUDGET:
                raise SpecError(
                    f"group {g!r} would hold {len(tasks)} tasks whose rebalance payload is about "
                    f"{out[g].payload_bytes:,} bytes, over the {codecs.GROUP_PAYLOAD_BUDGET:,}-byte limit (ZooKeeper "
                    "keeps each znode under 1 MiB); use shorter task ids or fewer pinned brokers, or put the tasks "
                    "in several groups; nothing was created"
                )
        return out

    def _validate_declarative(self, specs: Sequence[TaskSpec]) -> list[str]:
        decl = [(s.id, s.pipeline) for s in specs if isinstance(s.pipeline, DeclarativePipeline)]
        if not decl:
            return []
        fn = load_declarative_validator()
        names = ", ".join(task_id for task_id, _ in decl)
        if fn is None:
            return [f"declarative pipelines not checked ({DECLARATIVE_VALIDATOR} is not available): {names}"]
        for task_id, pipeline in decl:
            problem = run_validator(fn, pipeline)
            if problem:
                raise SpecError(f"task {task_id!r}: pipeline.project: {problem}")
        return [f"declarative pipelines checked: {names}"]

    def list_tasks(self, group: str | None = None) -> list[TaskRow]:
        """Every task (of ``group``), sorted by id: reads the whole cluster; ``list_page`` reads a page."""
        lay = self.layout
        ids = self.reads.task_ids()
        _, (deleting,) = self.reads.wave(children=[lay.admin_delete_tasks])
        rows = self._rows(ids, set(deleting or ()))
        return [r for r in rows if group is None or r.invalid is not None or r.group == group]

    def list_page(
        self,
        *,
        group: str | None = None,
        state: str | None = None,
        broker: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of tasks matching the filters, read at the source: the buckets are listed from the
        cursor's on, a few at a time, and only the tasks examined are read (spec, owner, status). Unfiltered, a
        first page of 50 at 100,000 tasks lists one bucket and reads 50 tasks; a filter that few tasks match
        examines more of the cluster to fill its page (there is no index per group, state or broker)."""
        if limit < 1:
            raise AdminError("limit must be at least 1")
        lay = self.layout
        self.reads.check_layout()
        start, after = (0, None) if not cursor else (int(bucket_of(check_name("cursor", cursor))[1:], 16), cursor)
        filtered = group is not None or state is not None or broker is not None
        wanted = state.upper() if state else None
        _, (deleting,) = self.reads.wave(children=[lay.admin_delete_tasks])
        deleting_set = set(deleting or ())
        rows: list[TaskRow] = []
        queue: list[str] = []
        nxt, width, examined = start, 1, 0
        while len(rows) < limit:
            if not queue:
                if nxt >= BUCKETS:
                    return TaskPage(tuple(rows), None, examined)
                span = lay.task_buckets[nxt : nxt + width]
                listings = multi_children(self.client, span)  # one request, however many buckets
                for i, kids in enumerate(listings):
                    names = sorted(k for k in kids or () if _in_bucket(k, BUCKET_NAMES[nxt + i]))
                    queue += [k for k in names if after is None or nxt + i != start or k > after]
                nxt, width = nxt + len(span), min(width * 4, 64)
                continue
            take = queue[: max(limit - len(rows), 64) if filtered else limit - len(rows)]
            queue = queue[len(take) :]
            for row in self._rows(take, deleting_set):
                examined += 1
                if (
                    (group is None or row.group == group)
                    and (wanted is None or wanted in (row.state, row.status, row.shown))
                    and (broker is None or row.owner == broker)
                ):
                    rows.append(row)
                    if len(rows) == limit:
                        return TaskPage(tuple(rows), row.task_id, examined)
        return TaskPage(tuple(rows), None, examined)

    def _rows(self, ids: Sequence[str], deleting_set: set[str]) -> list[TaskRow]:
        """The rows of ``ids``, in that order, from one wave of reads (spec, owner, status of each); a task
        deleted meanwhile has none."""
        lay = self.layout
        n = len(ids)
        got, _ = self.reads.wave(
            [lay.task(t) for t in ids] + [lay.task_owner(t) for t in ids] + [lay.status(t) for t in ids]
        )
        rows = []
        for i, t in enumerate(ids):
            spec_res, owner_res, status_res = got[i], got[n + i], got[2 * n + i]
            if spec_res is None:
                continue  # deleted meanwhile
            owner, _ = decode_read(task_records.OwnerInfo, owner_res, lay.task_owner(t))
            status, status_err = decode_read(task_records.TaskStatus, status_res, lay.status(t))
            try:
                spec = decode_task(spec_res[0], lay.task(t))
            except PayloadError as exc:
                row = TaskRow(
                    t,
                    invalid=exc.reason,
                    deleting=t in deleting_set,
                    status=status.state if status else None,
                    error=exc.reason,
                    shown="INVALID",
                )
            else:
                stale = stale_after(status, owner, owner_res[1].ephemeralOwner if owner_res else None)
                since = unassigned_since(
                    spec.state,
                    owner_res is not None,
                    status,
                    spec_res[1].ctime / 1000.0,
                    status_res[1].mtime / 1000.0 if status_res else None,
                )
                row = TaskRow(
                    t,
                    spec.group,
                    spec.state,
                    spec.pipeline.kind,
                    spec.weight,
                    owner=owner.broker if owner else None,
                    owner_generation=owner.generation if owner else None,
                    status=status.state if status else None,
                    status_broker=status.broker if status else None,
                    status_stale=stale,
                    shown=shown_status(status, stale, since),
                    unassigned_since=since,
                    status_updated=status.updated if status else None,
                    restarts=status.failures if status else None,
                    error=(status.error if status else None) or status_err,
                    deleting=t in deleting_set,
                    owner_since=owner_res[1].ctime / 1000.0 if owner and owner_res[1].ctime else None,
                    metrics=dict(status.metrics)
                    if status and status.broker == (owner.broker if owner else None)
                    else {},
                    revision=spec.revision,
                    status_revision=status.revision if status else None,
                )
            rows.append(row)
        return rows

    def describe_task(self, task_id: str) -> TaskDescription:
        lay = self.layout
        paths = [
            lay.task(task_id),
            lay.task_owner(task_id),
            lay.status(task_id),
            lay.admin_delete_task(task_id),
            lay.admin_reassign_of(task_id),
            lay.task_history(task_id),
        ]
        spec_res, owner_res, status_res, delete_res, reassign_res, history_res = self.reads.wave(paths)[0]
        if spec_res is None:
            raise NotFound(f"unknown task {task_id!r}")
        spec, spec_dict, invalid = None, None, None
        try:
            spec = decode_task(spec_res[0], paths[0])
            spec_dict = spec.model_dump(mode="json", by_alias=True)
        except PayloadError as exc:
            invalid = exc.reason
        owner, owner_err = decode_read(task_records.OwnerInfo, owner_res, paths[1])
        status, status_err = decode_read(task_records.TaskStatus, status_res, paths[2])
        reassign, _ = decode_read(admin_records.ReassignRequest, reassign_res, paths[4])
        history, _ = decode_read(admin_records.TaskHistory, history_res, paths[5])
        checkpoint = None
        if (
            spec is not None
            and self.checkpoint_size is not None
            and isinstance(spec.pipeline, SparkPipeline)
            and spec.pipeline.mode == "streaming"
        ):
            try:
                checkpoint = self.checkpoint_size(task_id)
            except ZkcError as exc:  # a root this process cannot read (another scheme)
                checkpoint = {"error": str(exc)}
        stale = stale_after(status, owner, owner_res[1].ephemeralOwner if owner_res else None)
        since = None
        if spec_dict is not None:
            since = unassigned_since(
                spec_dict.get("state"),
                owner_res is not None,
                status,
                spec_res[1].ctime / 1000.0,
                status_res[1].mtime / 1000.0 if status_res else None,
            )
        owner_dict = None
        if owner_res is not None:
            owner_dict = {
                **(codecs.to_jsonable(owner) if owner else {"error": owner_err}),
                "since": owner_res[1].ctime / 1000.0,
            }
        return TaskDescription(
            task_id=task_id,
            spec=spec_dict,
            spec_version=spec.revision if spec is not None else None,
            zk_version=spec_res[1].version,
            created=spec_res[1].ctime / 1000.0,
            owner=owner_dict,
            status=codecs.to_jsonable(status) if status else None,
            last_error=(status.error if status else None) or status_err or invalid,
            deleting=delete_res is not None,
            reassign_to=reassign.to if reassign else None,
            invalid=invalid,
            status_stale=stale,
            shown="INVALID" if invalid else shown_status(status, stale, since),
            unassigned_since=since,
            restart=restart_progress(spec.restart, status) if spec is not None else None,
            checkpoint=checkpoint,
            history=history.events if history else (),
            last_failure=codecs.to_jsonable(status.last_failure) if status and status.last_failure else None,
        )

    def delete_task(
        self, task_id: str, wait: float = 0.0, progress: Progress | None = None, purge_checkpoint: bool = False
    ) -> AdminRequest:
        """Ask the controller to delete the task: it revokes it, waits for the owner to let go, deletes it. The
        checkpoint is kept, unless ``purge_checkpoint`` (which needs ``wait``): removed once the task is gone."""
        lay = self.layout
        if purge_checkpoint and (wait <= 0 or self.purge is None):
            raise AdminError("--purge-checkpoint needs --wait: the checkpoint is removed once the task is deleted")
        if self.client.exists(lay.task(task_id)) is None:
            raise NotFound(f"unknown task {task_id!r}")
        path = lay.admin_delete_task(task_id)
        already = self._request_delete(
            task_id, path, "requested" + (", checkpoint purged once deleted" if purge_checkpoint else "")
        )
        done = None
        if wait > 0:
            done = wait_watched(
                lambda w: self.client.exists(lay.task(task_id), watch=w) is None, wait, progress=progress
            )
        notes = self.reads.controller_note()
        if purge_checkpoint and done and self.purge is not None:
            notes += (self.purge(task_id),)
        return AdminRequest("delete", task_id, path, already, done, notes)

    def _request_delete(self, task_id: str, path: str, detail: str) -> bool:
        """File the delete request with its history event in one multi, under the lifecycle lock (refused
        during a reset); True if it was already pending."""
        data = codecs.encode(admin_records.DeleteTaskRequest(task_id=task_id, requested=time.time()))
        if self.lifecycle is None:
            return file_request(self.client, path, data)
        for _ in range(self.retries):
            lock = self.lifecycle(task_id, "delete", detail)
            t = self.client.transaction()
            lock.add_to(t)
            t.create(path, data)
            results = t.commit()
            if isinstance(results[-1], NodeExistsError):
                return True
            if not any(isinstance(r, Exception) for r in results):
                return False
        raise AdminError(f"task {task_id!r}: its history kept changing during the delete; try again")

    def pause(self, task_id: str) -> TaskChange:
        return self._update(task_id, "pause", lambda s: s.with_state("PAUSED") if s.state != "PAUSED" else None)

    def resume(self, task_id: str) -> TaskChange:
        """RUNNING again (from PAUSED or STOPPED); refused while a reset of its offsets or its deletion is under
        way (as every verb)."""
        return self._update(task_id, "resume", lambda s: s.with_state("RUNNING") if s.state != "RUNNING" else None)

    def restart(self, task_id: str) -> TaskChange:
        """Bump ``restart_nonce``: the owner stops and starts the task again (failure count reset)."""
        return self._update(task_id, "restart", lambda s: s.model_copy(update={"restart_nonce": s.restart_nonce + 1}))

    def _update(self, task_id: str, action: str, change: Callable[[TaskSpec], TaskSpec | None]) -> TaskChange:
        """Read-modify-write of the spec, conditional on the znode version (retried on a concurrent change),
        under the lifecycle lock: refused during a reset or a deletion, and recorded in the task's history by
        the same multi."""
        path = self.layout.task(task_id)
        for _ in range(self.retries):
            spec, stat, deleting = self.reads.spec(task_id)
            if deleting:
                raise Conflict(f"task {task_id!r} is being deleted: {action} refused")
            new = change(spec)
            detail = (
                f"was {spec.state}" if new is None or new.state != spec.state else f"nonce {spec.restart_nonce + 1}"
            )
            lock = self.lifecycle(task_id, action, detail) if self.lifecycle is not None else None
            if new is None:
                return TaskChange(task_id, action, False, spec.state, spec.restart_nonce, stat.version)
            t = self.client.transaction()
            if lock is not None:
                lock.add_to(t)
            t.set_data(path, new.encode(), version=stat.version)
            results = t.commit()
            if isinstance(results[-1], NoNodeError):
                raise NotFound(f"unknown task {task_id!r}")
            if any(isinstance(r, Exception) for r in results):
                continue  # the spec or the history changed (a reset or a deletion began?): look again
            return TaskChange(task_id, action, True, new.state, new.restart_nonce, results[-1].version)
        raise AdminError(f"task {task_id!r}: its spec kept changing during the {action}; try again")

    def reassign(self, task_id: str, to: str, wait: float = 0.0, progress: Progress | None = None) -> AdminRequest:
        """Move one task to one live broker of its group (the controller revokes it first: never two owners)."""
        lay = self.layout
        spec, _stat, deleting = self.reads.spec(task_id)
        broker_res, owner_res = self.reads.wave([lay.broker(to), lay.task_owner(task_id)])[0]
        if broker_res is None:
            live = self.reads.live_brokers()
            raise NotFound(f"broker {to!r} is not live (live brokers: {', '.join(live) or 'none'})")
        broker, err = decode_read(registration_records.BrokerInfo, broker_res, lay.broker(to))
        if broker is None:
            raise AdminError(f"broker {to!r}: {err}")
        if broker.group != spec.group:
            raise Conflict(f"broker {to!r} is in group {broker.group!r}, task {task_id!r} in group {spec.group!r}")
        if spec.state != "RUNNING":
            raise Conflict(f"task {task_id!r} is {spec.state}; resume it first")
        if deleting:
            raise Conflict(f"task {task_id!r} is being deleted")
        owner, _ = decode_read(task_records.OwnerInfo, owner_res, lay.task_owner(task_id))
        path = lay.admin_reassign_of(task_id)
        data = codecs.encode(admin_records.ReassignRequest(task_id=task_id, to=to))
        already = file_request(self.client, path, data)
        if already:  # a pending reassignment of this task: the newest target wins
            self.client.set(path, data)
        notes = list(self.reads.controller_note())
        if owner is not None and owner.broker == to:
            notes.append(f"{task_id} already runs on {to}; it is now pinned there")
        done = None
        if wait > 0:

            def owned_by_target(w: Callable[[Any], None]) -> bool:
                try:
                    data, _ = self.client.get(lay.task_owner(task_id), watch=w)
                except NoNodeError:
                    self.client.exists(lay.task_owner(task_id), watch=w)
                    return False
                info, _ = decode_read(task_records.OwnerInfo, (data, None), lay.task_owner(task_id))
                return info is not None and info.broker == to

            done = wait_watched(owned_by_target, wait, progress=progress)
        return AdminRequest("reassign", task_id, path, already, done, tuple(notes))

    # ---- run intervals (timelines) ----------------------------------------------------------------
    def intervals(self) -> list[task_records.RunInterval]:
        """Every broker's recorded run intervals (``/intervals/<broker>``), oldest first."""
        lay = self.layout
        _, (brokers,) = self.reads.wave(children=[lay.intervals])
        brokers = brokers or []
        got, _ = self.reads.wave([lay.broker_intervals(b) for b in brokers])
        out: list[task_records.RunInterval] = []
        for b, res in zip(brokers, got):
            log_, err = decode_read(task_records.IntervalLog, res, lay.broker_intervals(b))
            if err:  # one broker's garbage must not blank every timeline: logged, left out
                log.warning("ignoring %s", err[:500])
            if log_ is not None:
                out.extend(log_.intervals)
        return sorted(out, key=lambda i: (i.start, i.task_id))
