"""The admin client library: everything the CLI does, usable from Python and tests.

The CLI only parses and prints; this module talks to ZooKeeper through the layout and the codecs.
"""

from __future__ import annotations

import importlib
import inspect
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, NodeExistsError, NotEmptyError, RolledBackError
from kazoo.protocol.states import ZnodeStat

from controller import codecs
from controller.codecs import PayloadError
from controller.layout import ZkLayout
from controller.taskspec import DeclarativePipeline, SpecError, TaskSpec, decode_task


class AdminError(RuntimeError):
    """An operator request that cannot be carried out (unknown task, no such broker, ...)."""


def ensure_layout(client: KazooClient, layout: ZkLayout) -> None:
    """Create the persistent containers of the layout (idempotent, one pipelined batch)."""
    client.ensure_path(layout.root)
    for path in layout.persistent_roots():
        client.ensure_path(path)


def payload_decoder(layout: ZkLayout, path: str) -> Callable[[bytes | None, str], Any] | None:
    """The decoder for the znode at ``path`` according to the layout, or None if it has no payload of ours."""
    if not path.startswith(layout.root.rstrip("/") + "/"):
        return None
    rel = path[len(layout.root.rstrip("/")) + 1 :].split("/")

    def of(cls: type) -> Callable[[bytes | None, str], Any]:
        return lambda data, p: codecs.decode(cls, data, p)

    match rel:
        case ["controller"]:
            return of(codecs.ControllerInfo)
        case ["controller_epoch"]:
            return codecs.decode_epoch
        case ["brokers", "ids", _]:
            return of(codecs.BrokerInfo)
        case ["tasks", _]:
            return decode_task
        case ["tasks", _, "owner"]:
            return of(codecs.OwnerInfo)
        case ["groups", _, "state"]:
            return of(codecs.GroupStateInfo)
        case ["groups", _, "members", _]:
            return of(codecs.JoinRequest)
        case ["groups", _, "join", _]:
            return of(codecs.JoinResult)
        case ["groups", _, "sync", _]:
            return of(codecs.SyncProposal)
        case ["groups", _, "assignment", _]:
            return of(codecs.Assignment)
        case ["status", _]:
            return of(codecs.TaskStatus)
        case ["intervals", _]:
            return of(codecs.IntervalLog)
        case ["admin", "rebalance", _]:
            return of(codecs.RebalanceRequest)
        case ["admin", "controlled_shutdown", _]:
            return of(codecs.ControlledShutdownRequest)
        case ["admin", "reassign", _]:
            return of(codecs.ReassignRequest)
        case ["admin", "delete_tasks", _]:
            return of(codecs.DeleteTaskRequest)
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


def _jsonable(value: Any) -> Any:
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
            raise AdminError(f"no znode at {path}") from None
        decoder = payload_decoder(self.layout, path)
        decoded: Any = None
        error = None
        if decoder is not None:
            try:
                decoded = _jsonable(decoder(data, path))
            except PayloadError as exc:
                error = str(exc)
        return ZnodeView(path, data or b"", stat, decoded, error)

    def tree(self, path: str, max_depth: int = 32, max_nodes: int = 100_000) -> list[tuple[int, str, ZnodeStat]]:
        return walk(self.client, path, max_depth, max_nodes)


def walk(client: KazooClient, path: str, max_depth: int = 32, max_nodes: int = 100_000) -> list[tuple[int, str, ZnodeStat]]:
    """Pre-order listing of the subtree at ``path``: (depth, path, stat), bounded in depth and size."""
    stat = client.exists(path)
    if stat is None:
        raise AdminError(f"no znode at {path}")
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


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (bounded); returns whether it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ==================================================================================================
# The admin client: every operator request, as plain dataclasses (``to_dict`` gives their JSON form)
# ==================================================================================================

WAIT_S = 30.0
DECLARATIVE_VALIDATOR = "broker_sim.runners.declarative.validate_declarative"


def to_dict(value: Any) -> Any:
    """A result of this module (dataclasses, tuples, payloads) as plain JSON-compatible data."""
    return _jsonable(value) if hasattr(value, "model_dump") else codecs.to_jsonable(value)


@dataclass(frozen=True)
class CreateResult:
    dry_run: bool
    tasks: tuple[str, ...]
    specs: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()
    multis: int = 0


@dataclass(frozen=True)
class TaskRow:
    task_id: str
    group: str | None = None
    state: str | None = None          # the spec's state: RUNNING | PAUSED (None when the spec is invalid)
    kind: str | None = None           # pipeline kind
    weight: int | None = None
    owner: str | None = None          # broker holding /tasks/<id>/owner
    owner_generation: int | None = None
    status: str | None = None         # what the owner reports: RUNNING, FAILED, STOPPED, COMPLETED, ...
    status_broker: str | None = None  # who reported it
    status_stale: bool = False        # reported as running by a broker that no longer holds the task
    error: str | None = None
    deleting: bool = False
    invalid: str | None = None        # why the spec cannot be decoded


@dataclass(frozen=True)
class TaskDescription:
    task_id: str
    spec: dict[str, Any] | None
    spec_version: int
    created: float
    owner: dict[str, Any] | None      # {"broker", "generation", "since"}
    status: dict[str, Any] | None
    last_error: str | None
    deleting: bool = False
    reassign_to: str | None = None
    invalid: str | None = None
    status_stale: bool = False


@dataclass(frozen=True)
class TaskChange:
    task_id: str
    action: str                        # pause | resume | restart
    changed: bool
    state: str
    restart_nonce: int
    zk_version: int


@dataclass(frozen=True)
class AdminRequest:
    """A request written under ``/admin``; ``done`` says whether it completed within the wait (None: not waited)."""

    kind: str
    subject: str | None
    path: str
    already_pending: bool = False
    done: bool | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BrokerView:
    broker_id: str
    epoch: int                         # the broker znode's czxid
    host: str | None = None
    pid: int | None = None
    group: str | None = None
    capacity: int | None = None
    rack: str | None = None
    instance_id: str | None = None
    runner: str | None = None
    tasks: int = 0                     # owner znodes it holds
    shutting_down: bool = False
    since: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class GroupSummary:
    group: str
    state: str | None
    generation: int | None = None
    join_generation: int | None = None
    protocol: str | None = None
    assignor: str | None = None
    leader: str | None = None
    members: tuple[str, ...] = ()      # members of the current generation
    live_members: tuple[str, ...] = () # members with a join request znode
    reason: str = ""
    controller_epoch: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class MemberView:
    member_id: str
    live: bool
    request: dict[str, Any] | None     # the join request (JoinRequest)
    assignment: dict[str, Any] | None  # the published assignment (Assignment)
    owns: tuple[str, ...] = ()         # owner znodes it holds right now
    error: str | None = None


@dataclass(frozen=True)
class GroupDescription:
    summary: GroupSummary
    members: tuple[MemberView, ...]
    tasks: int = 0                     # RUNNING-state specs of this group


@dataclass(frozen=True)
class ClusterStatus:
    root: str
    controller: dict[str, Any] | None
    controller_epoch: int | None
    brokers: tuple[BrokerView, ...]
    groups: tuple[GroupSummary, ...]
    tasks: dict[str, Any]
    pending: dict[str, int]


@dataclass(frozen=True)
class ClusterEvent:
    """One change seen by :meth:`AdminClient.watch`."""

    time: float
    kind: str       # watching | controller | broker_joined | broker_left | broker_bounced | group |
                    # task_created | task_deleted | task_state | task_owner
    subject: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)


def load_declarative_validator() -> Callable[..., Any] | None:
    """``broker_sim.runners.declarative.validate_declarative`` if it exists (imported lazily), else None."""
    module_name, func = DECLARATIVE_VALIDATOR.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (module_name, "broker_sim.runners", "broker_sim"):
            return None
        raise AdminError(f"cannot load the declarative pipeline validator: {exc}") from None
    fn = getattr(module, func, None)
    return fn if callable(fn) else None


def _run_validator(fn: Callable[..., Any], pipeline: DeclarativePipeline) -> str | None:
    """Call the validator with the pipeline (or its project directory, if that is what it takes);
    return the problem it reports, or None. It may raise, or return False / a message / a list of them."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    wants_path = bool(params) and params[0] in ("project", "path", "project_dir", "project_path", "directory", "root")
    try:
        out = fn(pipeline.project if wants_path else pipeline)
    except Exception as exc:  # the validator's verdict, whatever type it uses
        text = str(exc).strip() or type(exc).__name__
        return text if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {text}"
    if out is None or out is True:
        return None
    if out is False:
        return "refused by the declarative pipeline validator"
    if isinstance(out, str):
        return out or None
    if isinstance(out, (list, tuple)):
        return "; ".join(str(p) for p in out) or None
    return None


_LIVE_STATES = frozenset({"RUNNING", "STARTING", "RESTARTING"})


def _stale(status: codecs.TaskStatus | None, owner: codecs.OwnerInfo | None) -> bool:
    """A status that says running, from a broker that does not hold the task (workers do not rewrite it
    after letting a task go)."""
    return status is not None and status.state in _LIVE_STATES and (owner is None or owner.broker != status.broker)


class AdminClient:
    """Operator requests over one kazoo client. Reads are pipelined with the async API (a few waves of
    requests whatever the number of tasks); writes are single requests or one ``multi``."""

    def __init__(self, client: KazooClient, layout: ZkLayout, *, retries: int = 5) -> None:
        self.client = client
        self.layout = layout
        self.retries = retries

    # ---- pipelined reads --------------------------------------------------------------------------
    def _wave(self, gets: Sequence[str] = (), children: Sequence[str] = ()) -> tuple[list[Any], list[list[str] | None]]:
        """Issue every get and get_children at once, then collect: one round trip of latency."""
        ga = [self.client.get_async(p) for p in gets]
        ca = [self.client.get_children_async(p) for p in children]
        got: list[Any] = []
        for a in ga:
            try:
                got.append(a.get(timeout=WAIT_S))
            except NoNodeError:
                got.append(None)
        kids: list[list[str] | None] = []
        for a in ca:
            try:
                kids.append(sorted(a.get(timeout=WAIT_S)))
            except NoNodeError:
                kids.append(None)
        return got, kids

    @staticmethod
    def _decode(cls: type, res: Any, path: str) -> tuple[Any, str | None]:
        if res is None:
            return None, None
        try:
            return codecs.decode(cls, res[0], path), None
        except PayloadError as exc:
            return None, str(exc)

    def _owners(self, task_ids: Sequence[str]) -> dict[str, tuple[codecs.OwnerInfo | None, ZnodeStat]]:
        lay = self.layout
        got, _ = self._wave([lay.task_owner(t) for t in task_ids])
        out = {}
        for t, res in zip(task_ids, got):
            if res is not None:
                info, _err = self._decode(codecs.OwnerInfo, res, lay.task_owner(t))
                out[t] = (info, res[1])
        return out

    def _read_spec(self, task_id: str) -> tuple[TaskSpec, ZnodeStat, bool]:
        """The task's spec, its stat and whether a deletion is pending (one wave)."""
        lay = self.layout
        path = lay.task(task_id)
        got, _ = self._wave([path, lay.admin_delete_task(task_id)])
        if got[0] is None:
            raise AdminError(f"unknown task {task_id!r}")
        try:
            spec = decode_task(got[0][0], path)
        except PayloadError as exc:
            raise AdminError(f"task {task_id!r} has an invalid spec: {exc.reason}") from None
        return spec, got[0][1], got[1] is not None

    def _live_brokers(self) -> list[str]:
        _, (kids,) = self._wave(children=[self.layout.broker_ids])
        return kids or []

    def _wait(self, check: Callable[[Callable[[Any], None]], bool], timeout: float, interval: float = 0.25) -> bool:
        """Wait until ``check(watch)`` is true: it arms ``watch`` on what it reads, and is re-run when a
        watch fires or at least every ``interval`` (bounded by ``timeout``)."""
        fired = threading.Event()
        watch = lambda _event: fired.set()  # one callable: kazoo keeps a set, so re-arming does not pile up
        deadline = time.monotonic() + timeout
        while True:
            fired.clear()
            if check(watch):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            fired.wait(min(remaining, interval))

    # ---- tasks ------------------------------------------------------------------------------------
    def create_tasks(self, specs: Sequence[TaskSpec], dry_run: bool = False) -> CreateResult:
        """Validate every spec, refuse ids that exist (naming them), then create all in one ``multi``
        (several multis, each atomic, only for batches over 500 tasks or 512 KiB)."""
        from controller.zkio import Create, Delete, chunk_ops, exists_many

        specs = list(specs)
        if not specs:
            raise SpecError("no task specs given")
        seen: set[str] = set()
        for s in specs:
            if s.id in seen:
                raise SpecError(f"task id {s.id!r} appears twice")
            seen.add(s.id)
        notes = list(self._validate_declarative(specs))
        payloads = [(s, s.encode()) for s in specs]  # SpecError for an oversized spec
        lay = self.layout
        ids = [s.id for s in specs]
        stats = exists_many(self.client, [lay.task(t) for t in ids] + [lay.status(t) for t in ids])
        existing = [t for t, st in zip(ids, stats[: len(ids)]) if st is not None]
        if existing:
            raise AdminError(f"task{'s' if len(existing) > 1 else ''} already exist{'' if len(existing) > 1 else 's'}: "
                             f"{', '.join(existing[:20])}{' ...' if len(existing) > 20 else ''}; nothing was created")
        stale = [t for t, st in zip(ids, stats[len(ids):]) if st is not None]
        ops = [Create(lay.task(s.id), data) for s, data in payloads] + [Delete(lay.status(t)) for t in stale]
        batches = chunk_ops(ops)
        if len(batches) > 1:
            notes.append(f"{len(specs)} specs are written in {len(batches)} multis (each one atomic)")
        as_json = tuple(s.model_dump(mode="json", by_alias=True) for s in specs)
        if dry_run:
            return CreateResult(True, tuple(ids), as_json, tuple(notes + ["dry run: nothing written"]), 0)
        ensure_layout(self.client, lay)
        pending = []
        for batch in batches:
            t = self.client.transaction()
            for op in batch:
                if isinstance(op, Create):
                    t.create(op.path, op.data)
                else:
                    t.delete(op.path)
            pending.append((batch, t.commit_async()))
        created, clashes, other = [], [], []
        for batch, res in pending:
            results = res.get(timeout=WAIT_S)
            failed = [(op, r) for op, r in zip(batch, results) if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
            if not failed:
                created += [op.path.rsplit("/", 1)[1] for op in batch if isinstance(op, Create)]
            for op, r in failed:
                (clashes if isinstance(r, NodeExistsError) else other).append((op, r))
        if clashes or other:
            what = ([f"already exist: {', '.join(op.path.rsplit('/', 1)[1] for op, _ in clashes)}"] if clashes else []) + \
                   [f"{type(r).__name__} on {op.path}" for op, r in other[:3]]
            done = f"; created {', '.join(created)}" if created else "; nothing was created"
            raise AdminError("; ".join(what) + done)
        return CreateResult(False, tuple(ids), as_json, tuple(notes), len(batches))

    def _validate_declarative(self, specs: Sequence[TaskSpec]) -> list[str]:
        decl = [s for s in specs if isinstance(s.pipeline, DeclarativePipeline)]
        if not decl:
            return []
        fn = load_declarative_validator()
        names = ", ".join(s.id for s in decl)
        if fn is None:
            return [f"declarative pipelines not checked ({DECLARATIVE_VALIDATOR} is not available): {names}"]
        for s in decl:
            problem = _run_validator(fn, s.pipeline)
            if problem:
                raise SpecError(f"task {s.id!r}: pipeline.project: {problem}")
        return [f"declarative pipelines checked: {names}"]

    def list_tasks(self, group: str | None = None) -> list[TaskRow]:
        lay = self.layout
        _, (ids, deleting) = self._wave(children=[lay.tasks, lay.admin_delete_tasks])
        ids = ids or []
        deleting_set = set(deleting or ())
        n = len(ids)
        got, _ = self._wave([lay.task(t) for t in ids] + [lay.task_owner(t) for t in ids] + [lay.status(t) for t in ids])
        rows = []
        for i, t in enumerate(ids):
            spec_res, owner_res, status_res = got[i], got[n + i], got[2 * n + i]
            if spec_res is None:
                continue  # deleted meanwhile
            owner, _ = self._decode(codecs.OwnerInfo, owner_res, lay.task_owner(t))
            status, status_err = self._decode(codecs.TaskStatus, status_res, lay.status(t))
            try:
                spec = decode_task(spec_res[0], lay.task(t))
            except PayloadError as exc:
                row = TaskRow(t, invalid=exc.reason, deleting=t in deleting_set,
                              status=status.state if status else None, error=exc.reason)
            else:
                if group is not None and spec.group != group:
                    continue
                row = TaskRow(
                    t, spec.group, spec.state, spec.pipeline.kind, spec.weight,
                    owner=owner.broker if owner else None, owner_generation=owner.generation if owner else None,
                    status=status.state if status else None, status_broker=status.broker if status else None,
                    status_stale=_stale(status, owner),
                    error=(status.error if status else None) or status_err, deleting=t in deleting_set)
            rows.append(row)
        return rows

    def describe_task(self, task_id: str) -> TaskDescription:
        lay = self.layout
        paths = [lay.task(task_id), lay.task_owner(task_id), lay.status(task_id), lay.admin_delete_task(task_id),
                 lay.admin_reassign_of(task_id)]
        spec_res, owner_res, status_res, delete_res, reassign_res = self._wave(paths)[0]
        if spec_res is None:
            raise AdminError(f"unknown task {task_id!r}")
        spec_dict, invalid = None, None
        try:
            spec_dict = decode_task(spec_res[0], paths[0]).model_dump(mode="json", by_alias=True)
        except PayloadError as exc:
            invalid = exc.reason
        owner, owner_err = self._decode(codecs.OwnerInfo, owner_res, paths[1])
        status, status_err = self._decode(codecs.TaskStatus, status_res, paths[2])
        reassign, _ = self._decode(codecs.ReassignRequest, reassign_res, paths[4])
        owner_dict = None
        if owner_res is not None:
            owner_dict = {**(codecs.to_jsonable(owner) if owner else {"error": owner_err}),
                          "since": owner_res[1].ctime / 1000.0}
        return TaskDescription(
            task_id=task_id, spec=spec_dict, spec_version=spec_res[1].version, created=spec_res[1].ctime / 1000.0,
            owner=owner_dict, status=codecs.to_jsonable(status) if status else None,
            last_error=(status.error if status else None) or status_err or invalid,
            deleting=delete_res is not None, reassign_to=reassign.to if reassign else None, invalid=invalid,
            status_stale=_stale(status, owner))

    def _file_request(self, path: str, payload: Any) -> bool:
        """Create an admin request znode once; True if the same request was already pending."""
        try:
            data = payload if isinstance(payload, bytes) else codecs.encode(payload)
            self.client.create(path, data, makepath=True)
            return False
        except NodeExistsError:
            return True

    def delete_task(self, task_id: str, wait: float = 0.0) -> AdminRequest:
        """Ask the controller to delete the task: it revokes it, waits for the owner to let go, deletes it."""
        lay = self.layout
        if self.client.exists(lay.task(task_id)) is None:
            raise AdminError(f"unknown task {task_id!r}")
        path = lay.admin_delete_task(task_id)
        already = self._file_request(path, codecs.DeleteTaskRequest(task_id=task_id, requested=time.time()))
        done = None
        if wait > 0:
            done = self._wait(lambda w: self.client.exists(lay.task(task_id), watch=w) is None, wait)
        return AdminRequest("delete", task_id, path, already, done, self._controller_note())

    def pause(self, task_id: str) -> TaskChange:
        return self._update(task_id, "pause", lambda s: s.with_state("PAUSED") if s.state != "PAUSED" else None)

    def resume(self, task_id: str) -> TaskChange:
        return self._update(task_id, "resume", lambda s: s.with_state("RUNNING") if s.state != "RUNNING" else None)

    def restart(self, task_id: str) -> TaskChange:
        """Bump ``restart_nonce``: the owner stops and starts the task again (failure count reset)."""
        return self._update(task_id, "restart", lambda s: s.model_copy(update={"restart_nonce": s.restart_nonce + 1}))

    def _update(self, task_id: str, action: str, change: Callable[[TaskSpec], TaskSpec | None]) -> TaskChange:
        """Read-modify-write of the spec, conditional on the znode version (retried on a concurrent change)."""
        path = self.layout.task(task_id)
        for _ in range(self.retries):
            spec, stat, deleting = self._read_spec(task_id)
            if deleting:
                raise AdminError(f"task {task_id!r} is being deleted")
            new = change(spec)
            if new is None:
                return TaskChange(task_id, action, False, spec.state, spec.restart_nonce, stat.version)
            try:
                new_stat = self.client.set(path, new.encode(), version=stat.version)
            except BadVersionError:
                continue
            except NoNodeError:
                raise AdminError(f"unknown task {task_id!r}") from None
            return TaskChange(task_id, action, True, new.state, new.restart_nonce, new_stat.version)
        raise AdminError(f"task {task_id!r}: its spec kept changing during the {action}; try again")

    def reassign(self, task_id: str, to: str, wait: float = 0.0) -> AdminRequest:
        """Move one task to one live broker of its group (the controller revokes it first: never two owners)."""
        lay = self.layout
        spec, _stat, deleting = self._read_spec(task_id)
        broker_res, owner_res = self._wave([lay.broker(to), lay.task_owner(task_id)])[0]
        if broker_res is None:
            live = self._live_brokers()
            raise AdminError(f"broker {to!r} is not live (live brokers: {', '.join(live) or 'none'})")
        broker, err = self._decode(codecs.BrokerInfo, broker_res, lay.broker(to))
        if broker is None:
            raise AdminError(f"broker {to!r}: {err}")
        if broker.group != spec.group:
            raise AdminError(f"broker {to!r} is in group {broker.group!r}, task {task_id!r} in group {spec.group!r}")
        if spec.state != "RUNNING":
            raise AdminError(f"task {task_id!r} is {spec.state}; resume it first")
        if deleting:
            raise AdminError(f"task {task_id!r} is being deleted")
        owner, _ = self._decode(codecs.OwnerInfo, owner_res, lay.task_owner(task_id))
        path = lay.admin_reassign_of(task_id)
        data = codecs.encode(codecs.ReassignRequest(task_id=task_id, to=to))
        already = self._file_request(path, data)
        if already:  # a pending reassignment of this task: the newest target wins
            self.client.set(path, data)
        notes = list(self._controller_note())
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
                info, _ = self._decode(codecs.OwnerInfo, (data, None), lay.task_owner(task_id))
                return info is not None and info.broker == to
            done = self._wait(owned_by_target, wait)
        return AdminRequest("reassign", task_id, path, already, done, tuple(notes))

    # ---- cluster ----------------------------------------------------------------------------------
    def status(self) -> ClusterStatus:
        lay = self.layout
        (ctl_res, epoch_res), (brokers, groups, tasks, deleting, shutdowns, reassigns, rebalances) = self._wave(
            [lay.controller, lay.controller_epoch],
            [lay.broker_ids, lay.groups, lay.tasks, lay.admin_delete_tasks, lay.admin_controlled_shutdown,
             lay.admin_reassign, lay.admin_rebalance])
        brokers, groups, tasks = brokers or [], groups or [], tasks or []
        controller, _ = self._decode(codecs.ControllerInfo, ctl_res, lay.controller)
        epoch = None
        if epoch_res is not None:
            try:
                epoch = codecs.decode_epoch(epoch_res[0], lay.controller_epoch)
            except PayloadError:
                epoch = None
        n = len(tasks)
        got, kids = self._wave(
            [lay.task(t) for t in tasks] + [lay.task_owner(t) for t in tasks] + [lay.status(t) for t in tasks]
            + [lay.broker(b) for b in brokers] + [lay.group_state(g) for g in groups],
            [lay.group_members(g) for g in groups])
        spec_res, owner_res, status_res = got[:n], got[n:2 * n], got[2 * n:3 * n]
        broker_res, state_res = got[3 * n:3 * n + len(brokers)], got[3 * n + len(brokers):]
        by_state: Counter[str] = Counter()
        by_status: Counter[str] = Counter()
        owned_by: Counter[str] = Counter()
        invalid = unowned = 0
        for t, s, o, st in zip(tasks, spec_res, owner_res, status_res):
            if s is None:
                continue
            try:
                spec = decode_task(s[0], lay.task(t))
                by_state[spec.state] += 1
            except PayloadError:
                invalid += 1
                spec = None
            owner, _ = self._decode(codecs.OwnerInfo, o, lay.task_owner(t))
            if owner is not None:
                owned_by[owner.broker] += 1
            elif spec is not None and spec.state == "RUNNING":
                unowned += 1
            status, _ = self._decode(codecs.TaskStatus, st, lay.status(t))
            if status is not None:
                by_status["STALE" if _stale(status, owner) else status.state] += 1
        shutting = set(shutdowns or ())
        views = tuple(self._broker_view(b, r, owned_by[b], b in shutting) for b, r in zip(brokers, broker_res) if r is not None)
        summaries = tuple(self._group_summary(g, r, m) for g, r, m in zip(groups, state_res, kids))
        return ClusterStatus(
            root=lay.root,
            controller=codecs.to_jsonable(controller) if controller else None,
            controller_epoch=epoch,
            brokers=views,
            groups=summaries,
            tasks={"total": sum(1 for s in spec_res if s is not None), "by_state": dict(sorted(by_state.items())),
                   "by_status": dict(sorted(by_status.items())), "unowned": unowned, "invalid": invalid,
                   "deleting": len(deleting or ())},
            pending={"delete_tasks": len(deleting or ()), "controlled_shutdown": len(shutting),
                     "reassign": len(reassigns or ()), "rebalance": len(rebalances or ())},
        )

    def _broker_view(self, b: str, res: tuple[bytes, ZnodeStat], tasks: int, shutting: bool) -> BrokerView:
        info, err = self._decode(codecs.BrokerInfo, res, self.layout.broker(b))
        stat = res[1]
        if info is None:
            return BrokerView(b, stat.czxid, tasks=tasks, shutting_down=shutting, since=stat.ctime / 1000.0, error=err)
        return BrokerView(b, stat.czxid, info.host, info.pid, info.group, info.capacity, info.rack, info.instance_id,
                          info.runner, tasks, shutting, stat.ctime / 1000.0)

    def _group_summary(self, g: str, res: Any, live: list[str] | None) -> GroupSummary:
        info, err = self._decode(codecs.GroupStateInfo, res, self.layout.group_state(g))
        live_t = tuple(live or ())
        if info is None:
            return GroupSummary(g, None, live_members=live_t, error=err)
        return GroupSummary(g, info.state, info.generation, info.join_generation, info.protocol, info.assignor,
                            info.leader, tuple(info.members), live_t, info.reason, info.controller_epoch)

    def brokers(self) -> list[BrokerView]:
        lay = self.layout
        _, (ids, tasks, shutdowns) = self._wave(children=[lay.broker_ids, lay.tasks, lay.admin_controlled_shutdown])
        ids, tasks = ids or [], tasks or []
        got, _ = self._wave([lay.broker(b) for b in ids] + [lay.task_owner(t) for t in tasks])
        owned_by: Counter[str] = Counter()
        for t, o in zip(tasks, got[len(ids):]):
            owner, _ = self._decode(codecs.OwnerInfo, o, lay.task_owner(t))
            if owner is not None:
                owned_by[owner.broker] += 1
        shutting = set(shutdowns or ())
        return [self._broker_view(b, r, owned_by[b], b in shutting) for b, r in zip(ids, got[: len(ids)]) if r is not None]

    def describe_group(self, group: str | None = None) -> list[GroupDescription]:
        """Each group (or the one named): its state, and per member the join request, the published
        assignment and the tasks it holds right now."""
        lay = self.layout
        _, (groups, tasks) = self._wave(children=[lay.groups, lay.tasks])
        groups, tasks = groups or [], tasks or []
        if group is not None:
            lay.group(group)  # InvalidName for a malformed name
            if group not in groups:
                raise AdminError(f"unknown group {group!r} (groups: {', '.join(groups) or 'none'})")
            groups = [group]
        n = len(tasks)
        got, kids = self._wave([lay.task_owner(t) for t in tasks] + [lay.task(t) for t in tasks]
                               + [lay.group_state(g) for g in groups],
                               [lay.group_members(g) for g in groups] + [lay.group_assignments(g) for g in groups])
        owns: dict[str, list[str]] = {}
        runnable: Counter[str] = Counter()
        for t, o, s in zip(tasks, got[:n], got[n:2 * n]):
            owner, _ = self._decode(codecs.OwnerInfo, o, lay.task_owner(t))
            if owner is not None:
                owns.setdefault(owner.broker, []).append(t)
            if s is not None:
                try:
                    spec = decode_task(s[0], lay.task(t))
                except PayloadError:
                    continue
                if spec.state == "RUNNING":
                    runnable[spec.group] += 1
        states = got[2 * n:]
        member_lists, assignment_lists = kids[: len(groups)], kids[len(groups):]
        pairs = [(g, m, True) for g, ms in zip(groups, member_lists) for m in (ms or [])]
        pairs_a = [(g, m) for g, ms in zip(groups, assignment_lists) for m in (ms or [])]
        got2, _ = self._wave([lay.group_member(g, m) for g, m, _ in pairs] + [lay.group_assignment(g, m) for g, m in pairs_a])
        requests = {(g, m): r for (g, m, _), r in zip(pairs, got2[: len(pairs)])}
        assignments = {(g, m): r for (g, m), r in zip(pairs_a, got2[len(pairs):])}
        out = []
        for g, state_res, live in zip(groups, states, member_lists):
            summary = self._group_summary(g, state_res, live)
            names = sorted({m for (gg, m) in requests if gg == g} | {m for (gg, m) in assignments if gg == g}
                           | set(summary.members))
            members = []
            for m in names:
                req, req_err = self._decode(codecs.JoinRequest, requests.get((g, m)), lay.group_member(g, m))
                asg, asg_err = self._decode(codecs.Assignment, assignments.get((g, m)), lay.group_assignment(g, m))
                live_m = requests.get((g, m)) is not None
                if not live_m and m not in summary.members and (asg is None or asg.generation < (summary.generation or 0)):
                    continue  # an old assignment of a member long gone
                members.append(MemberView(m, live_m, codecs.to_jsonable(req) if req else None,
                                          codecs.to_jsonable(asg) if asg else None, tuple(sorted(owns.get(m, ()))),
                                          req_err or asg_err))
            out.append(GroupDescription(summary, tuple(members), runnable[g]))
        return out

    # ---- admin requests ---------------------------------------------------------------------------
    def _controller_note(self) -> tuple[str, ...]:
        if self.client.exists(self.layout.controller) is None:
            return ("no active controller: the request waits for one",)
        return ()

    def rebalance(self, group: str | None = None, reason: str = "manual", wait: float = 0.0) -> AdminRequest:
        """Ask for a rebalance of one group (or all): a sequential ``/admin/rebalance/req-`` znode."""
        lay = self.layout
        _, (groups,) = self._wave(children=[lay.groups])
        groups = groups or []
        if group is not None:
            lay.group(group)
            if group not in groups:
                raise AdminError(f"unknown group {group!r} (groups: {', '.join(groups) or 'none'})")
        targets = [group] if group else groups
        before = {s.group: s for s in self._summaries(targets)}
        path = self.client.create(lay.admin_rebalance_request_prefix,
                                  codecs.encode(codecs.RebalanceRequest(group=group, reason=reason)),
                                  sequence=True, makepath=True)
        notes = list(self._controller_note())
        busy = [g for g, s in before.items() if s.live_members]
        if not busy:
            notes.append("no group has live members: nothing to rebalance")
        done = None
        if wait > 0:
            def settled(_w: Callable[[Any], None]) -> bool:
                now = {s.group: s for s in self._summaries(busy)}
                return all(now[g].state == "Stable" and (now[g].generation or 0) > (before[g].generation or 0) for g in busy)
            done = self._wait(settled, wait)
        return AdminRequest("rebalance", group, path, False, done, tuple(notes))

    def _summaries(self, groups: Sequence[str]) -> list[GroupSummary]:
        lay = self.layout
        got, kids = self._wave([lay.group_state(g) for g in groups], [lay.group_members(g) for g in groups])
        return [self._group_summary(g, r, m) for g, r, m in zip(groups, got, kids)]

    def shutdown_broker(self, broker_id: str, wait: float = 0.0) -> AdminRequest:
        """Controlled shutdown: the controller moves the broker's tasks away; the broker exits when it owns
        nothing. ``wait`` waits (bounded) until it holds no task or is gone."""
        lay = self.layout
        if self.client.exists(lay.broker(broker_id)) is None:
            live = self._live_brokers()
            raise AdminError(f"unknown broker {broker_id!r} (live brokers: {', '.join(live) or 'none'})")
        path = lay.admin_controlled_shutdown_of(broker_id)
        already = self._file_request(path, codecs.ControlledShutdownRequest(broker=broker_id, requested=time.time()))
        done = None
        if wait > 0:
            def released(w: Callable[[Any], None]) -> bool:
                if self.client.exists(lay.broker(broker_id), watch=w) is None:
                    return True
                tasks = self._wave(children=[lay.tasks])[1][0] or []
                return not any(o is not None and o[0] is not None and o[0].broker == broker_id
                               for o in self._owners(tasks).values())
            done = self._wait(released, wait)
        return AdminRequest("controlled_shutdown", broker_id, path, already, done, self._controller_note())

    # ---- run intervals (timelines) ----------------------------------------------------------------
    def intervals(self) -> list[codecs.RunInterval]:
        """Every broker's recorded run intervals (``/intervals/<broker>``), oldest first."""
        lay = self.layout
        _, (brokers,) = self._wave(children=[lay.intervals])
        brokers = brokers or []
        got, _ = self._wave([lay.broker_intervals(b) for b in brokers])
        out: list[codecs.RunInterval] = []
        for b, res in zip(brokers, got):
            log_, err = self._decode(codecs.IntervalLog, res, lay.broker_intervals(b))
            if err:
                raise AdminError(err)
            if log_ is not None:
                out.extend(log_.intervals)
        return sorted(out, key=lambda i: (i.start, i.task_id))

    # ---- watch ------------------------------------------------------------------------------------
    def watch(self, duration: float | None = None, max_events: int | None = None) -> Iterator[ClusterEvent]:
        """Yield cluster events as ZooKeeper watches report them: controller changes, brokers joining,
        leaving or bouncing, group state/generation changes, tasks created/deleted/paused/resumed and task
        owner moves. The first event (kind ``watching``) summarises the state watched from. Bounded by
        ``duration`` seconds and ``max_events`` (the ``watching`` event not counted); None = unbounded."""
        w = _ClusterWatch(self)
        deadline = None if duration is None else time.monotonic() + duration
        count = 0
        try:
            yield w.start()
            while max_events is None or count < max_events:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    key = w.queue.get(timeout=0.5 if remaining is None else min(remaining, 0.5))
                except queue.Empty:
                    continue
                keys = [key]
                while True:
                    try:
                        keys.append(w.queue.get_nowait())
                    except queue.Empty:
                        break
                for event in w.refresh(list(dict.fromkeys(keys))):
                    yield event
                    count += 1
                    if max_events is not None and count >= max_events:
                        return
        finally:
            w.close()


class _ClusterWatch:
    """The state behind :meth:`AdminClient.watch`: one-shot ZooKeeper watches enqueue a key; the
    generator re-reads what the key names (pipelined, re-arming the watch) and reports the difference."""

    def __init__(self, admin: AdminClient) -> None:
        self.admin = admin
        self.client = admin.client
        self.layout = admin.layout
        self.queue: queue.Queue[tuple[str, ...]] = queue.Queue()
        self.closed = False
        self._watchers: dict[tuple[str, ...], Callable[[Any], None]] = {}
        self.controller: tuple[str, int] | None = None
        self.brokers: dict[str, int] = {}
        self.groups: dict[str, GroupSummary] = {}
        self.tasks: dict[str, str | None] = {}       # task -> spec state (None: invalid spec)
        self.owners: dict[str, str | None] = {}      # task -> owning broker
        self.started = False

    def _w(self, *key: str) -> Callable[[Any], None]:
        fn = self._watchers.get(key)
        if fn is None:
            fn = self._watchers[key] = lambda _event, key=key: None if self.closed else self.queue.put(key)
        return fn

    def close(self) -> None:
        self.closed = True

    # reads that (re-)arm watches; NoNode arms an exists watch instead, to see the znode appear
    def _get_watched(self, items: Sequence[tuple[str, tuple[str, ...]]]) -> list[Any]:
        asyncs = [self.client.get_async(p, watch=self._w(*key)) for p, key in items]
        out, missing = [], []
        for (p, key), a in zip(items, asyncs):
            try:
                out.append(a.get(timeout=WAIT_S))
            except NoNodeError:
                out.append(None)
                missing.append((key, self.client.exists_async(p, watch=self._w(*key))))
        for key, a in missing:
            if a.get(timeout=WAIT_S) is not None:
                self.queue.put(key)  # created in between the two reads: read it again
        return out

    def _children_watched(self, path: str, key: tuple[str, ...]) -> list[str]:
        try:
            return sorted(self.client.get_children(path, watch=self._w(*key)))
        except NoNodeError:
            self.client.exists(path, watch=self._w(*key))
            return []

    def start(self) -> ClusterEvent:
        list(self.refresh([("controller",), ("brokers",), ("groups",), ("tasks",)]))
        self.started = True
        ctl = f"controller {self.controller[0]} (epoch {self.controller[1]})" if self.controller else "no controller"
        running = sum(1 for o in self.owners.values() if o)
        msg = (f"watching {self.layout.root}: {ctl}, {len(self.brokers)} brokers, {len(self.groups)} groups, "
               f"{len(self.tasks)} tasks ({running} owned)")
        return ClusterEvent(time.time(), "watching", self.layout.root, msg, {
            "controller": self.controller[0] if self.controller else None,
            "epoch": self.controller[1] if self.controller else None,
            "brokers": dict(self.brokers), "groups": {g: s.state for g, s in self.groups.items()},
            "tasks": len(self.tasks), "owned": running})

    def refresh(self, keys: Sequence[tuple[str, ...]]) -> list[ClusterEvent]:
        events: list[ClusterEvent] = []
        for key in keys:
            if key == ("controller",):
                events += self._controller()
        if ("brokers",) in keys:
            events += self._brokers(None)
        bkeys = [k[1] for k in keys if k[0] == "broker"]
        if bkeys:
            events += self._brokers(bkeys)
        if ("groups",) in keys:
            events += self._groups(None)
        gkeys = [k[1] for k in keys if k[0] == "group"]
        if gkeys:
            events += self._groups(gkeys)
        if ("tasks",) in keys:
            events += self._tasks(None, None)
        tkeys = [k[1] for k in keys if k[0] == "task"]
        okeys = [k[1] for k in keys if k[0] == "owner"]
        if tkeys or okeys:
            events += self._tasks(tkeys, okeys)
        return events

    def _ev(self, kind: str, subject: str, message: str, **detail: Any) -> ClusterEvent:
        return ClusterEvent(time.time(), kind, subject, message, detail)

    def _controller(self) -> list[ClusterEvent]:
        lay = self.layout
        (res,) = self._get_watched([(lay.controller, ("controller",))])
        info, _ = AdminClient._decode(codecs.ControllerInfo, res, lay.controller)
        now = (info.controller_id, info.epoch) if info else None
        if now == self.controller:
            return []
        before, self.controller = self.controller, now
        if now is None:
            return [self._ev("controller", "-", f"controller {before[0]} gone (epoch {before[1]}); electing", controller=None,
                             previous=before[0])]
        return [self._ev("controller", now[0], f"controller {now[0]} active at epoch {now[1]}", controller=now[0],
                         epoch=now[1], previous=before[0] if before else None)]

    def _brokers(self, which: list[str] | None) -> list[ClusterEvent]:
        lay = self.layout
        events = []
        if which is None:
            ids = self._children_watched(lay.broker_ids, ("brokers",))
            for b in sorted(set(self.brokers) - set(ids)):
                del self.brokers[b]
                events.append(self._ev("broker_left", b, f"broker {b} left"))
            which = [b for b in ids if b not in self.brokers]
        got = self._get_watched([(lay.broker(b), ("broker", b)) for b in which])
        for b, res in zip(which, got):
            old = self.brokers.get(b)
            if res is None:
                if old is not None:
                    del self.brokers[b]
                    events.append(self._ev("broker_left", b, f"broker {b} left"))
                continue
            info, _ = AdminClient._decode(codecs.BrokerInfo, res, lay.broker(b))
            epoch = res[1].czxid
            group = info.group if info else None
            if old is None:
                events.append(self._ev("broker_joined", b, f"broker {b} joined (epoch {epoch}, group {group})",
                                       epoch=epoch, group=group))
            elif old != epoch:
                events.append(self._ev("broker_bounced", b, f"broker {b} bounced (epoch {old} -> {epoch})",
                                       epoch=epoch, previous_epoch=old))
            self.brokers[b] = epoch
        return events

    def _groups(self, which: list[str] | None) -> list[ClusterEvent]:
        lay = self.layout
        if which is None:
            names = self._children_watched(lay.groups, ("groups",))
            which = [g for g in names if g not in self.groups]
        got = self._get_watched([(lay.group_state(g), ("group", g)) for g in which])
        events = []
        for g, res in zip(which, got):
            info, err = AdminClient._decode(codecs.GroupStateInfo, res, lay.group_state(g))
            now = self.admin._group_summary(g, res, None) if res is not None else GroupSummary(g, None, error=err)
            old = self.groups.get(g)
            self.groups[g] = now
            if info is None:
                continue
            if old is not None and (old.state, old.generation, old.members) == (now.state, now.generation, now.members):
                continue
            was = f"{old.state} gen {old.generation}" if old is not None and old.state else "new"
            events.append(self._ev(
                "group", g, f"group {g}: {was} -> {now.state} gen {now.generation}"
                + (f" leader {now.leader} {now.protocol}" if now.leader else "") + f" members [{','.join(now.members)}]"
                + (f" ({now.reason})" if now.reason else ""),
                state=now.state, generation=now.generation, previous_state=old.state if old else None,
                previous_generation=old.generation if old else None, protocol=now.protocol, leader=now.leader,
                members=list(now.members), reason=now.reason))
        return events

    def _tasks(self, specs: list[str] | None, owners: list[str] | None) -> list[ClusterEvent]:
        lay = self.layout
        events = []
        if specs is None:
            ids = self._children_watched(lay.tasks, ("tasks",))
            for t in sorted(set(self.tasks) - set(ids)):
                del self.tasks[t]
                self.owners.pop(t, None)
                events.append(self._ev("task_deleted", t, f"task {t} deleted"))
            new = [t for t in ids if t not in self.tasks]
            specs, owners = new, new
        owners = owners or []
        got = self._get_watched([(lay.task(t), ("task", t)) for t in specs]
                                + [(lay.task_owner(t), ("owner", t)) for t in owners])
        initial = not self.started
        for t, res in zip(specs, got[: len(specs)]):
            if res is None:
                continue
            try:
                state: str | None = decode_task(res[0], lay.task(t)).state
            except PayloadError:
                state = None
            known = t in self.tasks
            old = self.tasks.get(t)
            self.tasks[t] = state
            if initial:
                continue
            if not known:
                events.append(self._ev("task_created", t, f"task {t} created ({state or 'invalid spec'})", state=state))
            elif old != state:
                events.append(self._ev("task_state", t, f"task {t}: {old} -> {state}", state=state, previous=old))
        for t, res in zip(owners, got[len(specs):]):
            if t not in self.tasks:
                continue
            info, _ = AdminClient._decode(codecs.OwnerInfo, res, lay.task_owner(t))
            now = info.broker if info else None
            old = self.owners.get(t)
            self.owners[t] = now
            if initial or now == old:
                continue
            events.append(self._ev("task_owner", t, f"task {t}: {old or '(none)'} -> {now or '(none)'}", owner=now,
                                   previous=old, generation=info.generation if info else None))
        return events


__all__ = ["AdminError", "ensure_layout", "payload_decoder", "ZkInspector", "ZnodeView", "walk", "wait_for",
           "AdminClient", "CreateResult", "TaskRow", "TaskDescription", "TaskChange", "AdminRequest", "BrokerView",
           "GroupSummary", "MemberView", "GroupDescription", "ClusterStatus", "ClusterEvent", "to_dict",
           "load_declarative_validator", "NodeExistsError", "NotEmptyError"]
