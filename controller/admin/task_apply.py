"""``task apply`` and ``task rollback``: change a task's spec in place, judged by Spark's rules, recorded in its
history with who did it, and conditional on the spec version the caller saw.

The spec version is the spec's ``revision``: 1 at create, one more at each applied change (pause, resume, stop
and restart do not count: they have their own verbs). Each update is one ``multi``: the spec set at the znode
version read, and the task's history set at the version its ``resetting`` check read, so neither a concurrent
change nor a reset that begins meanwhile can be overwritten. The owner of a RUNNING task sees its spec change
and restarts it in place, from its checkpoint (no move, no rebalance)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError

from controller.admin.common import AdminError, Conflict, NotFound
from controller.admin.reads import ClusterReads
from controller.admin.views import CreateResult
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import admin_records, codecs, payload_validation
from controller.protocol.tasks.spec import SpecError, TaskSpec, decode_task
from controller.protocol.tasks.spec_changes import FieldChange, diff_specs


class StaleVersion(Conflict):
    """The caller's spec version is not the task's: its change was made against another spec (HTTP 412)."""

    status = 412
    code = "stale_version"


@dataclass(frozen=True)
class ApplyItem:
    """What apply did (or, dry, would do) to one task: ``create``, ``update`` or ``unchanged``."""

    task_id: str
    action: str
    from_revision: int | None = None
    to_revision: int | None = None
    changes: tuple[FieldChange, ...] = ()
    notes: tuple[str, ...] = ()
    reset: bool = False
    #: the task's run state (RUNNING, PAUSED, STOPPED): what a wait after the apply waits for
    state: str | None = None


@dataclass(frozen=True)
class ApplyResult:
    dry_run: bool
    items: tuple[ApplyItem, ...]

    @property
    def changed(self) -> bool:
        return any(i.action != "unchanged" for i in self.items)


def identity_of(client: KazooClient) -> str:
    """Who the history names for this client's writes: its ZooKeeper digest user, else ``anonymous``."""
    ident = getattr(client, "identity", None)
    return f"digest:{str(ident).partition(':')[0]}" if ident else "anonymous"


class ApplyAdmin:
    """Applies specs to existing tasks and creates the others; rolls a task back to a kept spec."""

    def __init__(
        self,
        client: KazooClient,
        layout: ZkLayout,
        reads: ClusterReads,
        *,
        create: Callable[..., CreateResult],
        reset_guard: Callable[[str, str], int | None],
        reset: Callable[[str], str],
        retries: int = 5,
    ) -> None:
        self.client = client
        self.layout = layout
        self.reads = reads
        #: ``TaskAdmin.create_tasks``: the tasks that do not exist yet
        self.create = create
        #: refuses while a reset of the task's checkpoint is under way, else the history znode's version
        self.reset_guard = reset_guard
        #: resets a STOPPED task's checkpoint to the earliest offsets, saying what it did
        self.reset = reset
        self.retries = retries

    def apply(
        self,
        specs: Sequence[TaskSpec],
        *,
        dry_run: bool = False,
        if_version: int | None = None,
        reset: bool = False,
        who: str | None = None,
    ) -> ApplyResult:
        """Create the tasks that do not exist and update those that do. Every spec is checked first (the whole
        apply is refused, changing nothing, when one change is refused); then the new tasks are created in one
        multi and each update is written in one multi of its own."""
        specs = list(specs)
        if not specs:
            raise SpecError("no task specs given")
        if len({s.id for s in specs}) != len(specs):
            raise SpecError("a task id appears twice")
        if if_version is not None and len(specs) != 1:
            raise SpecError("--if-version applies to one task: the file holds several")
        who = who or identity_of(self.client)
        plans = [self._plan(s, if_version, reset) for s in specs]
        new = [s for s, p in zip(specs, plans) if p is None]
        items: list[ApplyItem] = []
        if new:
            created = self.create(new, dry_run=dry_run)
            items += [ApplyItem(s.id, "create", None, 1, notes=created.notes, state=s.state) for s in new]
        for spec, plan in zip(specs, plans):
            if plan is None:
                continue
            if dry_run or plan.action == "unchanged":
                items.append(plan)
                continue
            try:
                items.append(self._update(spec, if_version, reset, who, "apply"))
            except AdminError as exc:
                done = [i.task_id for i in items if i.action != "unchanged"]
                if not done:
                    raise
                raise type(exc)(f"{exc} (applied before it: {', '.join(done[:20])})") from None
        order = {s.id: i for i, s in enumerate(specs)}
        return ApplyResult(dry_run, tuple(sorted(items, key=lambda i: order[i.task_id])))

    def rollback(
        self, task_id: str, to_version: int, *, dry_run: bool = False, reset: bool = False, who: str | None = None
    ) -> ApplyItem:
        """Apply again the spec the task had at version ``to_version`` (one of those its history keeps), as a
        new version: the same rules as an apply."""
        hist = self._history(task_id)
        kept = {r.revision: r for r in hist.specs}
        if to_version not in kept:
            have = ", ".join(str(v) for v in sorted(kept)) or "none"
            raise NotFound(f"task {task_id!r}: spec version {to_version} is not kept (kept: {have})")
        try:
            old = decode_task(kept[to_version].spec.encode(), self.layout.task(task_id))
        except payload_validation.PayloadError as exc:
            raise AdminError(
                f"task {task_id!r}: the kept spec version {to_version} is unreadable: {exc.reason}"
            ) from None
        plan = self._plan(old, None, reset)
        if plan is None:
            raise NotFound(f"unknown task {task_id!r}")
        if dry_run or plan.action == "unchanged":
            return plan
        return self._update(old, None, reset, who or identity_of(self.client), f"rollback to {to_version}")

    # ---- one task -----------------------------------------------------------------------------------
    def _plan(self, spec: TaskSpec, if_version: int | None, reset: bool) -> ApplyItem | None:
        """What applying ``spec`` would do (None: the task does not exist, it is created); raises when refused."""
        try:
            old, _stat, deleting = self.reads.spec(spec.id)
        except NotFound:
            if if_version is not None:
                raise StaleVersion(f"task {spec.id!r} does not exist (expected spec version {if_version})") from None
            return None
        return self._judge(old, spec, deleting, if_version, reset)

    def _judge(self, old: TaskSpec, spec: TaskSpec, deleting: bool, if_version: int | None, reset: bool) -> ApplyItem:
        t = old.id
        if deleting:
            raise Conflict(f"task {t!r} is being deleted; nothing was changed")
        if if_version is not None and old.revision != if_version:
            raise StaleVersion(
                f"task {t!r} is at spec version {old.revision}, not {if_version}: it changed since; nothing was changed"
            )
        new = self._next(old, spec)
        diff = diff_specs(old, new)
        if not diff.changed:
            note = "unchanged" + (": nothing reset (`task reset-offsets` resets alone)" if reset else "")
            return ApplyItem(t, "unchanged", old.revision, old.revision, notes=(note,), state=old.state)
        if reset and old.state != "STOPPED":
            raise Conflict(f"task {t!r} is {old.state}: a reset needs it STOPPED (`task stop --wait`); nothing changed")
        refusal = diff.refusal(stopped=old.state == "STOPPED", reset=reset)
        if refusal:
            raise Conflict(f"task {t!r}: {refusal}; nothing was changed")
        notes = list(diff.notes)
        if spec.state != old.state and "state" in spec.model_fields_set:
            notes.append(f"state is kept {old.state}: pause, resume and stop change it")
        return ApplyItem(t, "update", old.revision, new.revision, diff.changes, tuple(notes), reset, old.state)

    @staticmethod
    def _next(old: TaskSpec, spec: TaskSpec) -> TaskSpec:
        """``spec`` as the task's next version: its run state and restart nonce kept, its revision one more."""
        return spec.model_copy(
            update={"state": old.state, "restart_nonce": old.restart_nonce, "revision": old.revision + 1}
        )

    def _update(self, spec: TaskSpec, if_version: int | None, reset: bool, who: str, action: str) -> ApplyItem:
        lay = self.layout
        t = spec.id
        for _ in range(self.retries):
            old, stat, deleting = self.reads.spec(t)
            item = self._judge(old, spec, deleting, if_version, reset)
            if item.action == "unchanged":
                return item  # a concurrent apply of the same spec
            history_version = self.reset_guard(t, action)  # refuses while a reset or a delete is under way
            new = self._next(old, spec)
            data = new.encode()
            hist_data = codecs.encode(self._recorded(t, old, new, item, who, action))
            tx = self.client.transaction()
            tx.set_data(lay.task(t), data, version=stat.version)
            if history_version is None:
                tx.create(lay.task_history(t), hist_data)
            else:
                tx.set_data(lay.task_history(t), hist_data, version=history_version)
            results = tx.commit()
            failed = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if isinstance(results[0], NoNodeError):
                raise NotFound(f"unknown task {t!r}")
            if not failed:
                if reset:
                    return replace(item, notes=(*item.notes, self.reset(t)))
                return item
            if not all(isinstance(r, (BadVersionError, NoNodeError)) for r in failed):
                raise AdminError(f"task {t!r}: the {action} failed: {type(failed[0]).__name__}")
        raise AdminError(f"task {t!r}: its spec kept changing during the {action}; nothing was changed, try again")

    def _history(self, task_id: str) -> admin_records.TaskHistory:
        path = self.layout.task_history(task_id)
        try:
            data, _ = self.client.get(path)
        except NoNodeError:
            return admin_records.TaskHistory()
        try:
            return codecs.decode(admin_records.TaskHistory, data, path)
        except payload_validation.PayloadError:
            return admin_records.TaskHistory()  # unreadable: replaced by the next record, as every history write does

    def _recorded(
        self, task_id: str, old: TaskSpec, new: TaskSpec, item: ApplyItem, who: str, action: str
    ) -> admin_records.TaskHistory:
        """The history with this change appended and both specs kept (bounded in count and bytes)."""
        hist = self._history(task_id)
        what = "; ".join(f"{c.path}: {c.old} -> {c.new}" for c in item.changes)
        if item.reset:
            what += "; checkpoint reset"
        event = admin_records.HistoryEvent(time.time(), action, what[:500], who[:200], old.revision, new.revision)
        specs = [r for r in hist.specs if r.revision not in (old.revision, new.revision)]
        specs += [
            admin_records.SpecRevision(
                old.revision, _stored(old), next((r.at for r in hist.specs if r.revision == old.revision), 0.0)
            ),
            admin_records.SpecRevision(new.revision, _stored(new), event.at),
        ]
        specs = sorted(specs, key=lambda r: r.revision)[-admin_records.HISTORY_SPECS :]
        while len(specs) > 2 and sum(len(r.spec) for r in specs) > admin_records.HISTORY_SPEC_BYTES:
            specs = specs[1:]
        events = (*hist.events, event)[-admin_records.HISTORY_EVENTS :]
        return admin_records.TaskHistory(events, hist.resetting, tuple(specs))


def _stored(spec: TaskSpec) -> str:
    """The spec as kept for a rollback: its configuration (run state and nonce are the task's at the time)."""
    return json.dumps(spec.model_dump(mode="json", by_alias=True), separators=(",", ":"), sort_keys=True)
