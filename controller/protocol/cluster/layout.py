"""The ZooKeeper layout: every path the product reads or writes, under one configurable root.

No other module builds a path string. Several clusters can share one ensemble by using different roots.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from controller.protocol.errors import ZkcError

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/zkc"

# Version 2 of the layout keeps task specs and statuses in buckets (``/tasks/<bucket>/<id>``,
# ``/status/<bucket>/<id>``) so that no listing grows with the number of tasks: at 100,000 tasks one flat
# listing is ~1.6 MB, past the 1 MB reply that ZooKeeper's own Java clients accept (``jute.maxbuffer``); a
# bucket holds ~1/256 of them. Version 1 (flat) is what ``zkctl layout migrate`` converts.
LAYOUT_VERSION = 2
BUCKETS = 256
# A bucket's name starts with "_", which no task id may: a flat root's task can never pass for a bucket.
_BUCKET = re.compile(r"_[0-9a-f]{2}")

# Names that become one path segment: broker ids, task ids, group names, member ids. Always ``fullmatch``:
# ``$`` in ``match`` also matches before a trailing newline ("bb3\n" would pass).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
# ZooKeeper keeps its own system znodes under /zookeeper (quotas, config): no cluster may live there.
RESERVED_ROOTS = ("zookeeper",)


class InvalidName(ZkcError, ValueError):
    """A broker, task, group or member name that cannot be one ZooKeeper path segment."""

    status = 404
    code = "not_found"  # a name that cannot exist names nothing


# How much of a refused name an error shows: a name comes from a URL, a file or ZooKeeper, of any size.
SHOWN_NAME_CHARS = 64


def shown_name(name: object) -> str:
    """``name`` as an error shows it: escaped (``repr``), at most ``SHOWN_NAME_CHARS`` of it, and its length."""
    if not isinstance(name, str):
        return f"of type {type(name).__name__}"
    if len(name) <= SHOWN_NAME_CHARS:
        return repr(name)
    return f"{name[:SHOWN_NAME_CHARS]!r}... ({len(name)} characters)"


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a legal single path segment, else raise InvalidName naming the kind."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidName(
            f"invalid {kind} {shown_name(name)}: use 1-200 characters from A-Z a-z 0-9 . _ - starting with a "
            "letter or digit"
        )
    return name


def is_name(name: object) -> bool:
    """Whether ``name`` is a legal single path segment (``check_name`` without the error)."""
    return isinstance(name, str) and bool(_NAME.fullmatch(name))


# The illegal children reported already (warned once each, then quiet: a listing is read on every poll).
_REPORTED: set[str] = set()
_REPORTED_MAX = 10_000


def report_illegal(kind: str, path: str) -> None:
    """Log a child whose name is not a legal ``kind``: a warning the first time, debug after that."""
    if path in _REPORTED:
        log.debug("ignoring %s: not a legal %s", path, kind)
        return
    if len(_REPORTED) < _REPORTED_MAX:
        _REPORTED.add(path)
    parent, _, name = path.rpartition("/")
    log.warning("ignoring %s under %s: not a legal %s (left out of every listing)", shown_name(name), parent, kind)


def bucket_of(task_id: str) -> str:
    """The bucket of a task: a stable hash of its id (the same in every process and release)."""
    return f"_{zlib.crc32(task_id.encode()) % BUCKETS:02x}"


def is_bucket(name: str) -> bool:
    return bool(_BUCKET.fullmatch(name))


BUCKET_NAMES: tuple[str, ...] = tuple(f"_{i:02x}" for i in range(BUCKETS))


def normalize_root(root: str) -> str:
    """``root`` as an absolute path of legal segments; refuses ZooKeeper's own subtree (``/zookeeper``)."""
    root = "/" + root.strip("/")
    if root != "/":
        segments = root.strip("/").split("/")
        for segment in segments:
            check_name("root segment", segment)
        if segments[0] in RESERVED_ROOTS:
            raise InvalidName(
                f"invalid root {root!r}: /{segments[0]} is ZooKeeper's own system subtree; "
                "choose another --zk-root (default /zkc)"
            )
    return root


@dataclass(frozen=True)
class ZkLayout:
    """Every path of docs/zookeeper-layout.md under ``root``."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", normalize_root(self.root))

    def _p(self, *parts: str) -> str:
        base = "" if self.root == "/" else self.root
        return base + "/" + "/".join(parts)

    # controller
    @property
    def controller(self) -> str:
        return self._p("controller")

    @property
    def controller_epoch(self) -> str:
        return self._p("controller_epoch")

    @property
    def controller_candidates(self) -> str:
        """One ephemeral znode per running controller candidate (``CandidateInfo``), named by its id."""
        return self._p("controller_candidates")

    def controller_candidate(self, controller_id: str) -> str:
        return self._p("controller_candidates", check_name("controller id", controller_id))

    @property
    def cluster_summary(self) -> str:
        """Task counts kept by the active controller (``ClusterSummary``), read by ``status``."""
        return self._p("cluster_summary")

    # brokers
    @property
    def broker_ids(self) -> str:
        return self._p("brokers", "ids")

    def broker(self, broker_id: str) -> str:
        return self._p("brokers", "ids", check_name("broker id", broker_id))

    @property
    def layout_info(self) -> str:
        """The layout's version and bucket count, written once the root is laid out (``LayoutInfo``)."""
        return self._p("layout")

    @property
    def layout_migration(self) -> str:
        """Held (ephemeral) by the one ``zkctl layout migrate`` at work on the root."""
        return self._p("layout_migration")

    # tasks
    @property
    def tasks(self) -> str:
        """The container of the task buckets (never list it for tasks: see ``task_buckets``)."""
        return self._p("tasks")

    @cached_property
    def task_buckets(self) -> tuple[str, ...]:
        return tuple(self._p("tasks", b) for b in BUCKET_NAMES)

    def task_bucket(self, task_id: str) -> str:
        return self._p("tasks", bucket_of(check_name("task id", task_id)))

    def task(self, task_id: str) -> str:
        return self._p("tasks", bucket_of(check_name("task id", task_id)), task_id)

    def task_owner(self, task_id: str) -> str:
        return self.task(task_id) + "/owner"

    def task_of(self, path: str) -> str | None:
        """The task whose spec znode ``path`` is (None for a bucket, an owner, or anything else)."""
        prefix = self.tasks + "/"
        if not path.startswith(prefix):
            return None
        parts = path[len(prefix) :].split("/")
        if (
            len(parts) != 2
            or not is_bucket(parts[0])
            or not _NAME.fullmatch(parts[1])
            or bucket_of(parts[1]) != parts[0]
        ):
            return None
        return parts[1]

    # groups
    @property
    def groups(self) -> str:
        return self._p("groups")

    def group(self, group: str) -> str:
        return self._p("groups", check_name("group", group))

    def group_state(self, group: str) -> str:
        return self._p("groups", check_name("group", group), "state")

    def group_members(self, group: str) -> str:
        return self._p("groups", check_name("group", group), "members")

    def group_member(self, group: str, member: str) -> str:
        return self._p("groups", check_name("group", group), "members", check_name("member", member))

    def group_joins(self, group: str) -> str:
        return self._p("groups", check_name("group", group), "join")

    def group_join(self, group: str, generation: int) -> str:
        return self._p("groups", check_name("group", group), "join", str(int(generation)))

    def group_syncs(self, group: str) -> str:
        return self._p("groups", check_name("group", group), "sync")

    def group_sync(self, group: str, generation: int) -> str:
        return self._p("groups", check_name("group", group), "sync", str(int(generation)))

    def group_assignments(self, group: str) -> str:
        return self._p("groups", check_name("group", group), "assignment")

    def group_assignment(self, group: str, member: str) -> str:
        return self._p("groups", check_name("group", group), "assignment", check_name("member", member))

    # status
    @property
    def statuses(self) -> str:
        return self._p("status")

    @cached_property
    def status_buckets(self) -> tuple[str, ...]:
        return tuple(self._p("status", b) for b in BUCKET_NAMES)

    def status_bucket(self, task_id: str) -> str:
        return self._p("status", bucket_of(check_name("task id", task_id)))

    def status(self, task_id: str) -> str:
        return self._p("status", bucket_of(check_name("task id", task_id)), task_id)

    # run intervals (recorded by workers for the timeline and the invariant checker)
    @property
    def intervals(self) -> str:
        return self._p("intervals")

    def broker_intervals(self, broker_id: str) -> str:
        return self._p("intervals", check_name("broker id", broker_id))

    # admin requests
    @property
    def admin(self) -> str:
        return self._p("admin")

    @property
    def admin_rebalance(self) -> str:
        return self._p("admin", "rebalance")

    @property
    def admin_rebalance_request_prefix(self) -> str:
        """Prefix of a sequential rebalance request znode (ZooKeeper appends the sequence number)."""
        return self._p("admin", "rebalance", "req-")

    @property
    def admin_controlled_shutdown(self) -> str:
        return self._p("admin", "controlled_shutdown")

    def admin_controlled_shutdown_of(self, broker_id: str) -> str:
        return self._p("admin", "controlled_shutdown", check_name("broker id", broker_id))

    @property
    def admin_reassign(self) -> str:
        return self._p("admin", "reassign")

    def admin_reassign_of(self, task_id: str) -> str:
        return self._p("admin", "reassign", check_name("task id", task_id))

    @property
    def admin_delete_tasks(self) -> str:
        return self._p("admin", "delete_tasks")

    def admin_delete_task(self, task_id: str) -> str:
        return self._p("admin", "delete_tasks", check_name("task id", task_id))

    @property
    def admin_task_history(self) -> str:
        """Per task, its operator actions on run state and offsets (``TaskHistory``)."""
        return self._p("admin", "task_history")

    def task_history(self, task_id: str) -> str:
        return self._p("admin", "task_history", check_name("task id", task_id))

    @property
    def admin_storage(self) -> str:
        """Per task, the one storage request under way (``StorageRequest``): offsets, reset, purge, size, logs."""
        return self._p("admin", "storage")

    def storage_request(self, task_id: str) -> str:
        return self._p("admin", "storage", check_name("task id", task_id))

    def storage_claim(self, task_id: str) -> str:
        """Ephemeral: the broker carrying the request out (``StorageClaim``)."""
        return self.storage_request(task_id) + "/claim"

    def storage_result(self, task_id: str) -> str:
        """What the broker did (``StorageResult``)."""
        return self.storage_request(task_id) + "/result"

    def storage_miss(self, task_id: str, broker_id: str) -> str:
        """A broker asked "anyone" that does not hold the checkpoint (``StorageMiss``)."""
        return self.storage_request(task_id) + "/miss-" + check_name("broker id", broker_id)

    @property
    def group_tallies(self) -> str:
        """Per group, the task count and payload size a create checks against the budget (``GroupTally``)."""
        return self._p("admin", "group_tasks")

    def group_tally(self, group: str) -> str:
        return self._p("admin", "group_tasks", check_name("group", group))

    @property
    def admin_roll(self) -> str:
        """The planned roll (``RollState``): written by ``zkctl broker roll``, then by the controller, fenced."""
        return self._p("admin", "roll")

    @property
    def settings(self) -> str:
        """Operator settings (move throttles, automatic maintenance), honoured live by the controller."""
        return self._p("admin", "settings")

    @property
    def maintenance(self) -> str:
        """The maintenance mode: empty or ``on: false`` when off."""
        return self._p("admin", "maintenance")

    # security
    @property
    def security(self) -> str:
        """The ACL policy (digest identities per role), written by ``zkctl security init``."""
        return self._p("security")

    # the names of children
    def child_kind(self, parent: str) -> str | None:
        """The kind of name every child of ``parent`` must be (``check_name``'s ``kind``), None for a parent
        whose children are not named after anything of ours (generations, sequential requests)."""
        base = "" if self.root == "/" else self.root
        if not parent.startswith(base + "/"):
            return None
        parts = parent[len(base) + 1 :].split("/")
        match parts:
            case ["brokers", "ids"] | ["intervals"] | ["admin", "controlled_shutdown"]:
                return "broker id"
            case ["groups"] | ["admin", "group_tasks"]:
                return "group"
            case ["groups", _, "members" | "assignment"]:
                return "member"
            case ["admin", "reassign" | "delete_tasks" | "task_history"]:
                return "task id"
            case ["tasks" | "status", bucket] if is_bucket(bucket):
                return "task id"
        return None

    def split_children(self, parent: str, names: Iterable[str] | None) -> tuple[list[str], list[str]]:
        """(legal, illegal) children of ``parent``, each sorted. A name read from ZooKeeper is data: one that
        cannot be a path segment of ours is logged and set apart, so that it hides nothing else."""
        kind = self.child_kind(parent)
        legal: list[str] = []
        illegal: list[str] = []
        for name in names or ():
            if kind is None or is_name(name):
                legal.append(name)
            else:
                report_illegal(kind, f"{parent}/{name}")
                illegal.append(name)
        return sorted(legal), sorted(illegal)

    def legal_children(self, parent: str, names: Iterable[str] | None) -> list[str]:
        """The children of ``parent`` whose names are legal, sorted; the others are logged and left out."""
        return self.split_children(parent, names)[0]

    def persistent_roots(self) -> tuple[str, ...]:
        """Containers that must exist before anything else runs (created idempotently)."""
        return (
            self.broker_ids,
            self.tasks,
            self.groups,
            self.statuses,
            self.intervals,
            self.admin_rebalance,
            self.admin_controlled_shutdown,
            self.admin_reassign,
            self.admin_delete_tasks,
            self.group_tallies,
            self.admin_task_history,
            self.admin_storage,
            self.settings,
            self.maintenance,
        )
