"""Ownership of tasks: the ephemeral ``/tasks/<bucket>/<id>/owner`` znode is created before a runner starts
(tasks given together in pipelined rounds) and deleted only after its ``stop`` returned (tasks let go
together stop on pool threads; the last to stop releases them all in one multi with their last statuses; a
reconciling member's release is sent by its event thread, with its report in the same multi).

``Ownership`` is a part the worker owns: it is given the worker's shared parts (``WorkerDeps``) and the status
book (whose versions and lock a release shares with the status writes), not the worker; what it lets go of it
announces (``LetGo``) to whoever subscribed (the task supervisor reconciles), never calling back into them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError

from broker_sim.worker.deps import WorkerDeps
from broker_sim.worker.events import Owned, Released, Stopped
from broker_sim.worker.slots import TaskSlot
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.group_messages import JoinRequest
from controller.protocol.records.task_records import OwnerInfo, TaskStatus
from controller.zk.io import exists_many

log = logging.getLogger(__name__)


RELEASE_RETRY_S = 0.5  # pause before retrying a release we had no right to
RELEASE_CHUNK = 200  # tasks released per multi (two ops each: the last status, a few hundred bytes, and the owner)


class StatusBook(Protocol):
    """What a release shares with the status writes: their lock, the versions of our own last writes, the
    last statuses it writes itself."""

    status_lock: threading.Lock
    status_versions: dict[str, int]

    def final_statuses(self, tasks: list[str]) -> dict[str, bytes]: ...

    def released(self, status_paths: list[str]) -> None: ...

    def forget_versions(self, status_paths: Iterable[str]) -> None: ...


@dataclass(frozen=True)
class LetGo:
    """A release (or an acquisition given up) is over: these tasks' slots are free again."""

    tasks: tuple[str, ...]


class Ownership:
    """Acquiring and releasing owner znodes."""

    def __init__(
        self,
        deps: WorkerDeps,
        statuses: StatusBook,
        owner_wait_s: float,
        group_member: str,
        halting: threading.Event | None = None,
    ) -> None:
        #: set once the deadline watchdog escalates: from then on nothing is let go (no owner znode deleted).
        #: Killing the runners unblocks stops that hung, and a release after them would hand the tasks on
        #: while this process still lives; the session's end (after the process) is what lets them go.
        self.halting = halting or threading.Event()
        self.client: KazooClient = deps.client
        self.layout: ZkLayout = deps.layout
        self.session = deps.session
        self.table = deps.table
        self.statuses = statuses
        self.pool: ThreadPoolExecutor = deps.pool
        self.owner_wait_s = owner_wait_s
        self.group_member = group_member  # our request znode (a reconciling member's report goes with a release)
        self.enqueue = deps.enqueue
        self.members = deps.members  # whether the member follows its assignment alone (reconcile)
        self._listeners: list[Callable[[LetGo], None]] = []

    def subscribe(self, listener: Callable[[LetGo], None]) -> None:
        """Hear of every ``LetGo`` (once, at wiring: the list is not changed after the threads start)."""
        self._listeners.append(listener)

    def _emit(self, event: LetGo) -> None:
        for listener in self._listeners:
            listener(event)

    @property
    def who(self) -> str:
        return self.session.broker_id

    # ---- acquiring --------------------------------------------------------------------------------
    def acquire(self, t: str) -> bool:
        """Create the ephemeral owner znode, waiting (watch, bounded re-checks) while another holds it.

        With per-broker identities the controller hands ``/tasks/<t>`` to us (a setACL) before the
        assignment that gives us the task: NoAuth means that has not happened (yet), so we wait and
        retry within the same bound rather than give up."""
        path = self.layout.task_owner(t)
        data = codecs.encode(OwnerInfo(broker=self.who, generation=self.session.generation))
        deadline = time.monotonic() + self.owner_wait_s
        refused = 0
        while time.monotonic() < deadline:
            with self.table.lock:
                if t not in self.table.desired or self.session.closing:
                    return False
            try:
                self.client.create(path, data, ephemeral=True)
                return True
            except NoNodeError:
                return False  # the task itself is gone
            except NoAuthError:
                refused += 1
                if refused == 1:
                    log.warning("worker %s: no right (yet) to take %s: waiting for it to be handed to us", self.who, t)
                time.sleep(min(0.05 * 2 ** min(refused, 5), 1.0))
                continue
            except NodeExistsError:
                gone = threading.Event()
                stat = self.client.exists(path, watch=lambda _e: gone.set())
                if stat is None:
                    continue
                if stat.ephemeralOwner == self.client.client_id[0]:
                    return True  # ours already (e.g. reconciled twice)
                gone.wait(1.0)
        log.warning("worker %s: gave up waiting for %s to be released", self.who, path)
        return False

    def mark_held(self, tasks: list[str]) -> None:
        """Our owner znodes of these tasks exist now."""
        now = time.time()
        with self.table.lock:
            for t in tasks:
                slot = self.table.slots.setdefault(t, TaskSlot())
                slot.held = True
                slot.acquired = now
                slot.dirty = True
        self.enqueue(Owned())

    # ---- releasing --------------------------------------------------------------------------------
    def batch_stopped(self, done: tuple[list[str], list[str]] | None) -> None:
        """Tasks of a stop batch finished stopping (``StopBatch.done``/``expire``): release those that stopped."""
        if done is None:
            return
        tasks, ready = done
        if not self._hand_over_release(tasks, ready):
            self.release_and_finish(tasks, ready)

    def release_and_finish(
        self, tasks: list[str], ready: list[str], cached: bool = True, unknown: bool = False
    ) -> None:
        """Release the stopped tasks ``ready`` (``unknown``: a release multi's outcome is not known: look at
        their owner znodes instead), then clear the busy flags of ``tasks`` and tell the member."""
        try:
            if unknown:
                self.confirm_released(ready)
            else:
                self.release(ready, cached)
        except Exception as exc:  # e.g. connection loss: the next reconcile lets go of them again
            log.info("worker %s: releasing %d tasks: %s", self.who, len(ready), type(exc).__name__)
        finally:
            with self.table.lock:
                for x in tasks:
                    if x in self.table.slots:
                        self.table.slots[x].busy = False
            self.enqueue(Owned())  # only now are they let go: a busy slot counts as "may hold any moment"
            self._emit(LetGo(tuple(tasks)))

    # ---- a reconciling member's release, with its report ------------------------------------------
    def _hand_over_release(self, tasks: list[str], ready: list[str]) -> bool:
        """On a pool thread, once revoked tasks stopped: a reconciling member's release goes to the event
        thread, which sends it with the member's report in one multi (``send_release``). Only the event
        thread writes the report: a release sent from here could land after a newer report and undo it.
        (The member's mode is read here as a hint; the event thread checks again.)"""
        if not ready or not self.members.follows_assignment_alone():
            return False
        self.enqueue(Stopped(tuple(tasks), tuple(ready)))
        return True

    def send_release(self, tasks: list[str], ready: list[str], request: JoinRequest) -> bool:
        """Send one multi: the last statuses of ``ready`` at the versions of our own last writes, their
        owner znodes deleted, and our report (the request znode). Its answer comes back as ``Released``;
        the event thread does not wait for it. False (nothing sent) if a status version is not known: the
        usual release reads it first."""
        book = self.statuses
        if self.halting.is_set():
            return True  # halting: nothing is let go (see ``halting``); the process ends
        if not book.status_lock.acquire(blocking=False):
            return False  # a status write is in flight: the usual release (on a pool thread) waits for it
        try:
            paths = {t: self.layout.status(t) for t in ready}
            versions = {t: book.status_versions.get(paths[t]) for t in ready}
            if any(v is None for v in versions.values()):
                return False
            finals = book.final_statuses(ready)
        finally:
            book.status_lock.release()
        tx = self.client.transaction()
        for t in ready:
            tx.set_data(paths[t], finals[t], version=versions[t])
            tx.delete(self.layout.task_owner(t))
        tx.set_data(self.group_member, codecs.encode(request))
        pending = tx.commit_async()
        pending.rawlink(lambda result: self.enqueue(Released(tuple(tasks), tuple(ready), request, result)))
        return True

    def on_released(self, event: Released) -> bool:
        """Event thread: the answer to ``send_release``. Done (True): the tasks are let go, their busy flags
        cleared; the caller tells the member its report is written. A multi that failed did nothing (someone
        wrote a status since: the usual release reads them first); one whose outcome is unknown (connection
        lost) is checked by its owner znodes (False: a pool thread finishes it)."""
        tasks, ready = list(event.tasks), list(event.ready)
        unknown = False
        try:
            results = event.result.get(block=False)
            done = not any(isinstance(r, Exception) for r in results)
        except Exception as exc:
            log.info("worker %s: release of %d tasks unconfirmed (%s)", self.who, len(ready), type(exc).__name__)
            done, unknown = False, True
        paths = [self.layout.status(t) for t in ready]
        with self.table.lock:
            for t in ready:
                if t in self.table.slots:
                    self.table.slots[t].releasing = False
        if not done:
            self.statuses.forget_versions(paths)  # a version of ours was stale
            self.pool.submit(self.release_and_finish, tasks, ready, False, unknown)
            return False
        self._released(ready, paths)
        with self.table.lock:
            for t in tasks:
                if t in self.table.slots:
                    self.table.slots[t].busy = False
        return True

    def _released(self, tasks: list[str], status_paths: list[str]) -> None:
        """A release multi succeeded: its statuses are there, their versions the next owner's to know, and the
        tasks are someone else's to take."""
        self.statuses.released(status_paths)
        self._let_go(tasks)

    def _let_go(self, tasks: list[str]) -> None:
        """Our owner znodes of these tasks are gone: they are someone else's to take."""
        with self.table.lock:
            for t in tasks:
                slot = self.table.slots[t]
                slot.held = False
                slot.dirty = True
                slot.failures = 0
                slot.restart_at = None

    def confirm_released(self, tasks: list[str]) -> None:
        """After a release multi whose outcome is unknown: a task is let go only once its owner znode is seen
        gone (or held by another session); one still ours is deleted again. One pipelined round of
        ``exists``, one of deletes. A task whose release cannot be confirmed stays held: the next reconcile
        lets go of it again, and until then nobody else can start it (the owner znode is what a new owner
        waits for)."""
        if self.halting.is_set():
            return
        paths = {t: self.layout.task_owner(t) for t in tasks}
        gone: list[str] = []
        try:
            stats = exists_many(self.client, list(paths.values()))
        except Exception as exc:
            log.info("worker %s: confirming the release of %d tasks: %s", self.who, len(tasks), type(exc).__name__)
            stats = [False] * len(tasks)  # unknown: all stay held
        deletes = []
        for t, stat in zip(tasks, stats):
            if stat is None or (stat is not False and stat.ephemeralOwner != self.session.session_id):
                gone.append(t)
            elif stat is not False:
                deletes.append((t, self.client.delete_async(paths[t], version=stat.version)))
        for t, pending in deletes:
            try:
                pending.get()
                gone.append(t)
            except NoNodeError:
                gone.append(t)
            except Exception as exc:
                log.info("worker %s: confirming the release of %s: %s", self.who, t, type(exc).__name__)
        self._let_go(gone)
        if len(gone) < len(tasks):
            log.warning(
                "worker %s: release of %s not confirmed; still held",
                self.who,
                ", ".join(sorted(set(tasks) - set(gone))[:5]),
            )
        self.enqueue(Owned())

    def release(self, tasks: list[str], cached: bool = True) -> None:
        """Write the last status of stopped tasks and delete their owner znodes, in one multi per chunk: a new
        owner can start only after the owner znode is gone, so its RUNNING can never be overwritten by our
        STOPPED. Only a status that is still ours is written: at the version our own last write left
        (``status_versions``), or, where we have none, at the version read just before (pipelined reads; the
        controller may have marked the task FAILED meanwhile). A multi that fails (a version moved under us)
        is retried with the statuses read first, then task by task; a single task's that fails deletes the
        owner znode alone. The cached versions spare a release the read's round trip: most brokers let go
        of one task when another joins, and that read was a third of their path."""
        if not tasks or self.halting.is_set():
            return
        if len(tasks) > RELEASE_CHUNK:
            for i in range(0, len(tasks), RELEASE_CHUNK):
                self.release(tasks[i : i + RELEASE_CHUNK], cached)
            return
        book = self.statuses
        with book.status_lock:  # (after a status write in flight: its versions are then ours to know)
            finals = book.final_statuses(tasks)
        try:
            paths = {t: self.layout.status(t) for t in tasks}
            known = {t: v for t in tasks if cached and (v := book.status_versions.get(paths[t])) is not None}
            reads = {t: self.client.get_async(paths[t]) for t in tasks if t not in known}
            tx = self.client.transaction()
            for t in tasks:
                status_path = paths[t]
                if t in known:
                    tx.set_data(status_path, finals[t], version=known[t])
                else:
                    try:
                        data, stat = reads[t].get()
                        if codecs.decode(TaskStatus, data, status_path).broker == self.who:
                            tx.set_data(status_path, finals[t], version=stat.version)
                    except NoNodeError:
                        tx.create(status_path, finals[t])
                    except Exception:
                        pass
                tx.delete(self.layout.task_owner(t))
            try:
                results = tx.commit_async().get(timeout=30)
            except Exception as exc:  # timed out or lost: the multi may or may not have happened
                log.info(
                    "worker %s: release of %d tasks unconfirmed (%s); checking their owner znodes",
                    self.who,
                    len(tasks),
                    type(exc).__name__,
                )
                self.confirm_released(tasks)
                return
            failed = any(isinstance(r, Exception) for r in results)
            if failed and known:
                book.forget_versions(paths[t] for t in known)
                self.release(tasks, cached=False)  # someone wrote a status since our last write: read first
                return
            if failed and len(tasks) > 1:
                for t in tasks:
                    self.release([t], cached=False)
                return
            if failed:
                try:
                    self.client.delete(self.layout.task_owner(tasks[0]))
                except NoNodeError:
                    pass
                except NoAuthError:
                    # no right to delete it: the task was handed to another broker before we let go (we were
                    # late), or an operator's ACL. It stays held: the next reconcile tries again (paced here);
                    # the owner znode goes once we may delete it, or with our session
                    log.warning(
                        "worker %s: no right to release %s (handed to another broker before we let go?); "
                        "retrying, its owner znode stays until then or until our session ends",
                        self.who,
                        tasks[0],
                    )
                    time.sleep(RELEASE_RETRY_S)
                    raise
                book.forget_versions(paths.values())
                self._let_go(tasks)
            else:
                self._released(tasks, list(paths.values()))  # (the caller tells the member, busy flags cleared)
        finally:
            with self.table.lock:
                for t in tasks:
                    self.table.slots[t].releasing = False

    def drop(self, tasks: list[str]) -> None:
        """The worker stops: delete the owner znodes of these (stopped) tasks in one multi, best effort (the
        session's end deletes whatever is left)."""
        if not tasks or not self.client.connected or self.halting.is_set():
            return
        tx = self.client.transaction()
        for t in tasks:
            tx.delete(self.layout.task_owner(t))
        try:
            tx.commit_async().get(timeout=5)
        except Exception:
            pass
        with self.table.lock:
            for t in tasks:
                self.table.slots[t].held = False
