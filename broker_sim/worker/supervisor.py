"""The worker's tasks: reconciling what runs with what is assigned, starting runners on pool threads,
spec changes, restarts with backoff after failures, and stopping (alone, in batches, or all of them).

``TaskSupervisor`` is a part the worker owns: it is given the worker's shared parts (``WorkerDeps``), the
runner, the owner znodes (``Owners``), the deadline watchdog's stop bookkeeping (``StopDeadlines``), the fence
(whether it is up) and where a run is recorded, not the worker. It reconciles when the owner znodes announce
that tasks were let go (``on_let_go``)."""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NodeExistsError, NoNodeError

from broker_sim.runners import RunState, TaskRunner
from broker_sim.worker.deps import WorkerDeps
from broker_sim.worker.events import Owned
from broker_sim.worker.ownership import LetGo
from broker_sim.worker.phases import STARTABLE, TaskPhase
from broker_sim.worker.registration import BrokerSession
from broker_sim.worker.slots import StopBatch, TaskSlot, TaskTable
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import OwnerInfo
from controller.protocol.tasks.spec import TaskSpec, decode_task

log = logging.getLogger(__name__)

CREATE_CHUNK = 200  # owner znodes created per multi when tasks are taken together
SPEC_RETRY_S = 1.0  # pause before reading a held task's spec again when the read that re-arms its watch failed
BATCH_LINGER_S = 1.0  # how long tasks stopped together wait for the slowest stop before going on their own


class Owners(Protocol):
    """The owner znodes, as the task supervisor needs them: take one, record some taken, let go of stopped
    ones (``StopBatch`` results), drop them all at the end."""

    def acquire(self, t: str) -> bool: ...

    def mark_held(self, tasks: list[str]) -> None: ...

    def batch_stopped(self, done: tuple[list[str], list[str]] | None) -> None: ...

    def drop(self, tasks: list[str]) -> None: ...


class StopDeadlines(Protocol):
    """The deadline watchdog's side of a stop: its budget, when it begins and ends, escalation if it fails."""

    stop_timeout_s: float

    def stop_begins(self, task: str) -> None: ...

    def stop_ends(self, task: str) -> None: ...

    def escalate(self, reason: str) -> None: ...


def _class_of(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


class FenceView(Protocol):
    """Whether the fence is up (read under the table's lock, the fence's own)."""

    up: bool


class TaskSupervisor:
    """Starting, restarting and stopping the assigned tasks' runners."""

    def __init__(
        self,
        deps: WorkerDeps,
        runner: TaskRunner,
        owners: Owners,
        deadlines: StopDeadlines,
        fence: FenceView,
        record: Callable[[str, TaskSlot, float, float | None], None],
    ) -> None:
        self.client: KazooClient = deps.client
        self.layout: ZkLayout = deps.layout
        self.session: BrokerSession = deps.session
        self.table: TaskTable = deps.table
        self.runner = runner
        self.pool: ThreadPoolExecutor = deps.pool
        self.owners = owners
        self.deadlines = deadlines
        self.fence = fence
        self.record = record
        self.enqueue = deps.enqueue
        self.stopped: threading.Event = deps.stopped

    def fenced(self) -> bool:
        return self.fence.up

    def on_let_go(self, _event: LetGo) -> None:
        """Owner znodes were let go of (or an acquisition given up): bring what runs in line again."""
        self.reconcile()

    @property
    def who(self) -> str:
        return self.session.broker_id

    def reconcile(self) -> None:
        """Bring held/running tasks in line with ``desired``: stops first, then starts. (Called after every
        start and stop: it looks at each slot once and allocates nothing for tasks it already knows.)"""
        with self.table.lock:
            if self.session.closing:
                return
            desired, slots, fenced = self.table.desired, self.table.slots, self.fenced()
            stop = []
            for t, slot in slots.items():
                if slot.busy or not slot.held:
                    continue
                if t not in desired:
                    slot.busy = True
                    stop.append(t)
                elif slot.phase in STARTABLE and not fenced:
                    if slot.restart_at is None or slot.restart_at <= time.monotonic():
                        slot.busy = True
                        self.pool.submit(self._start_task, t, False)
            if len(stop) == 1:
                self.pool.submit(self._stop_task, stop[0])
            elif stop:
                batch = StopBatch(len(stop))
                for t in stop:
                    self.pool.submit(self._stop_in_batch, t, batch)
                self._batch_timer(batch)
            acquire = []
            if not fenced:
                for t in sorted(desired):
                    wanted = slots.get(t)
                    if wanted is None:
                        wanted = slots[t] = TaskSlot()
                    if not wanted.held and not wanted.busy:
                        wanted.busy = True
                        acquire.append(t)
            if len(acquire) == 1:
                self.pool.submit(self._start_task, acquire[0], True)
            elif acquire:
                self.pool.submit(self._start_tasks, acquire)

    def _start_task(self, t: str, acquire: bool) -> None:
        try:
            if acquire:
                if not self.owners.acquire(t):
                    return
                self.owners.mark_held([t])
            with self.table.lock:
                if t not in self.table.desired or self.fenced():
                    return
            spec = self._read_spec(t)
            if spec is None:
                return
            self._run(t, spec)
        finally:
            with self.table.lock:
                held = t in self.table.slots and self.table.slots[t].held
                if t in self.table.slots:
                    self.table.slots[t].busy = False
            if acquire and not held:
                self.enqueue(Owned())  # an acquisition given up: no longer "may hold any moment"
            self.reconcile()

    def _start_tasks(self, tasks: list[str]) -> None:
        """Start several newly desired tasks together: their owner znodes are created in one multi per
        ``CREATE_CHUNK`` and their specs read in one pipelined round (the reads sent right behind the
        creates), then each runner starts on a pool thread (``_launch``). A multi one of whose owner znodes
        is not free does nothing: its tasks are then taken one create each. (One ``_start_task`` per task
        took two round trips each, ``pool_size`` tasks at a time: a broker given ~50 tasks in a rebalance
        started its last one a dozen round trips after its first; a hundred creates, one request each, were
        most of a joiner's start at 10,000 tasks.) A task whose owner znode is still there (its previous owner has not let go yet, or it is
        ours already) goes through ``_start_task``'s bounded wait instead (its spec read here is unused;
        the watch it armed only re-checks a task we hold). Every task in ``tasks`` is marked busy by the
        caller; the busy flag passes to the job that carries the task on, or is cleared here."""
        handed: set[str] = set()
        try:
            with self.table.lock:
                live = [t for t in tasks if t in self.table.desired and not self.session.closing and not self.fenced()]
            owner = codecs.encode(OwnerInfo(broker=self.who, generation=self.session.generation))
            together = []
            for i in range(0, len(live), CREATE_CHUNK):
                tx = self.client.transaction()
                for t in live[i : i + CREATE_CHUNK]:
                    tx.create(self.layout.task_owner(t), owner, ephemeral=True)
                together.append((live[i : i + CREATE_CHUNK], tx.commit_async()))
            reads = {
                t: self.client.get_async(self.layout.task(t), watch=lambda _e, t=t: self._spec_changed(t)) for t in live
            }
            held: list[str] = []
            creates = []
            for chunk, pending in together:
                try:
                    results = pending.get()
                except Exception as exc:  # e.g. connection loss: one by one below, whatever happened
                    log.info("worker %s: taking %d tasks: %s", self.who, len(chunk), type(exc).__name__)
                    results = [exc]
                if not any(isinstance(r, Exception) for r in results):
                    held += chunk
                else:  # one of them not free (or gone): the multi did nothing; each on its own
                    creates += [
                        (t, self.client.create_async(self.layout.task_owner(t), owner, ephemeral=True)) for t in chunk
                    ]
            for t, pending in creates:
                try:
                    pending.get()
                    held.append(t)
                except (NodeExistsError, NoAuthError):  # held by another, or not handed to us yet: wait
                    handed.add(t)
                    self.pool.submit(self._start_task, t, True)
                except NoNodeError:
                    pass  # the task itself is gone
                except Exception as exc:  # e.g. connection loss: the next reconcile tries again
                    log.info("worker %s: taking %s: %s", self.who, t, type(exc).__name__)
            if held:
                self.owners.mark_held(held)
            with self.table.lock:
                runnable = [t for t in held if t in self.table.desired and not self.fenced()]
            for t in runnable:
                try:
                    data, _ = reads[t].get()
                except NoNodeError:
                    continue
                except Exception as exc:  # held, not running: the next reconcile starts it
                    log.info("worker %s: reading %s: %s", self.who, t, type(exc).__name__)
                    continue
                spec = self._decode_spec(t, data)
                if spec is not None:
                    handed.add(t)
                    self.pool.submit(self._launch, t, spec)
        finally:
            with self.table.lock:
                given_up = False
                for t in tasks:
                    if t not in handed and t in self.table.slots:
                        self.table.slots[t].busy = False
                        given_up = given_up or not self.table.slots[t].held
            if given_up:
                self.enqueue(Owned())  # acquisitions given up: no longer "may hold any moment"
            self.reconcile()

    def _launch(self, t: str, spec: TaskSpec) -> None:
        """Start the runner of a task ``_start_tasks`` took (owner held, spec read)."""
        try:
            with self.table.lock:
                if t not in self.table.desired or self.fenced():
                    return
            self._run(t, spec)
        finally:
            with self.table.lock:
                if t in self.table.slots:
                    self.table.slots[t].busy = False
            self.reconcile()

    def _run(self, t: str, spec: TaskSpec) -> None:
        """Start the runner of a task whose owner znode we hold (the caller holds its busy flag)."""
        slot = self.table.begin_start(t, spec)
        try:
            self.runner.start(t, spec, self.session.generation)
        except Exception as exc:
            self.failed(t, f"{type(exc).__name__}: {exc}", traceback.format_exc(), kind=_class_of(exc))
            self.enqueue(Owned())  # no longer starting: the member's report says so
            return
        with self.table.lock:
            self.table.start_done(t, slot)
            fenced = self.fenced() or self.session.closing
        self.enqueue(Owned())  # it runs: the member's report says so once every start is over (Stable means running)
        if fenced:  # the fence fired while the runner was starting: it stopped the others, now this one
            log.warning("worker %s: %s finished starting after the fence; stopping it", self.who, t)
            self.stop_runner(t)

    def _read_spec(self, t: str) -> TaskSpec | None:
        path = self.layout.task(t)
        try:
            data, _ = self.client.get(path, watch=lambda _e: self._spec_changed(t))
        except NoNodeError:
            return None
        return self._decode_spec(t, data)

    def _decode_spec(self, t: str, data: bytes) -> TaskSpec | None:
        try:
            return decode_task(data, self.layout.task(t))
        except PayloadError as exc:
            self.failed(t, str(exc), None, kind=_class_of(exc), permanent=True)
            return None

    def _spec_changed(self, t: str, rearm: bool = True) -> None:
        """Our task's spec changed: a `task restart` (nonce) or new pipeline settings (`task apply`) restart it in
        place. ``rearm`` False: a look again after a start or stop that was under way (the watch is armed)."""

        def check() -> None:
            with self.table.lock:
                slot = self.table.slots.get(t)
                if slot is None or not slot.held:
                    return
            try:
                data, _ = self.client.get(
                    self.layout.task(t), watch=(lambda _e: self._spec_changed(t)) if rearm else None
                )
                spec = decode_task(data, self.layout.task(t))
            except PayloadError as exc:
                # the spec became garbage: the controller marks it FAILED and revokes it; say the same
                # in our own status writes until we let go, and stop running it now
                self.stop_runner(t)
                self.failed(t, f"invalid task spec: {exc}", None, kind=_class_of(exc), permanent=True)
                return
            except NoNodeError:
                return
            except KazooException as exc:
                # the read that re-arms the watch failed (the connection dropped after the firing): without a
                # watch a later restart or settings change would go unseen while we run the task, so look
                # again shortly, for as long as we hold it (a lost session lets go of it, and ends this)
                log.info(
                    "worker %s: re-reading the spec of %s: %s; again in %gs",
                    self.who,
                    t,
                    type(exc).__name__,
                    SPEC_RETRY_S,
                )
                retry = threading.Timer(SPEC_RETRY_S, self._spec_changed, args=(t,))
                retry.name = f"worker-{self.who}-spec-retry"
                retry.daemon = True
                retry.start()
                return
            with self.table.lock:
                slot = self.table.slots.get(t)
                if slot is None or slot.spec is None:
                    return
                restart = spec.restart_nonce != slot.spec.restart_nonce or spec.pipeline != slot.spec.pipeline
                # its spec was garbage (FAILED for good) and is valid again while we still hold the task
                # (the controller's revocation had not reached us): run it again, or it stays FAILED forever
                restart = restart or (
                    slot.phase is TaskPhase.FAILED and (slot.error or "").startswith("invalid task spec")
                )
                if not restart:
                    self.table.spec_kept(t, spec)
                    return
                if slot.busy:  # a start or stop is under way: it keeps the spec it runs; look again after it
                    again = threading.Timer(SPEC_RETRY_S, self._spec_changed, args=(t, False))
                    again.name = f"worker-{self.who}-spec-again"
                    again.daemon = True
                    again.start()
                    return
                slot.busy = True
                slot.failures = 0
                slot.restart_at = None
            self.pool.submit(self._restart, t, spec)

        if self.session.closing or self.stopped.is_set():
            return  # (a retry coming due after the worker stopped)
        try:
            self.pool.submit(check)
        except RuntimeError:  # the pool is shut down: the worker is stopping
            return

    def _restart(self, t: str, spec: TaskSpec) -> None:
        try:
            self.stop_runner(t)
            self.table.restarted(t, spec)
        finally:
            with self.table.lock:
                self.table.slots[t].busy = False
            self.reconcile()

    def failed(self, t: str, error: str, trace: str | None, kind: str = "Error", permanent: bool = False) -> None:
        """Count a failure: restart after the backoff of the spec's restart policy, or, once its attempts are
        spent (or the failure is permanent), stay FAILED with this last error until `task restart`."""
        slot, delay = self.table.failed(t, error, trace, kind, permanent)
        if delay is None:
            log.warning("worker %s: task %s FAILED for good after %d failures: %s", self.who, t, slot.failures, error)
        else:
            log.info("worker %s: task %s failed (%d), restart in %.1fs: %s", self.who, t, slot.failures, delay, error)

    def stop_runner(self, t: str, fence: bool = False) -> None:
        """Stop a task's runner; return only once it has stopped. The stop is bounded: the deadline watchdog
        escalates (kills the runner's processes, halts the broker) if it has not returned within its own
        budget or by the session's fence deadline; a stop that raises did not confirm the task stopped, so it
        is escalated at once (never counted as done). ``fence``: the fence's stop (it starts again on the lift)."""
        slot = self.table.begin_stop(t, fence)
        if slot is None:
            return
        end = time.time()
        self.deadlines.stop_begins(t)
        confirmed = False
        try:
            self.runner.stop(t, self.deadlines.stop_timeout_s)
            confirmed = True
        except Exception as exc:
            self.deadlines.escalate(f"the stop of {t} failed ({type(exc).__name__}: {exc}); it may still run")
            raise
        finally:
            self.deadlines.stop_ends(t)
            with self.table.lock:
                self.table.stop_done(t, slot, confirmed)
                if confirmed:
                    self.record(t, slot, end, time.time())

    def stop_runners(self, tasks: list[str], why: str) -> None:
        """Stop these runners in parallel on fresh named threads (a graceful stop costs one stop latency, not
        one per task); a stop that raises is logged (the deadline watchdog escalates it)."""

        def stop_one(t: str) -> None:
            try:
                self.stop_runner(t, fence=why == "fence")
            except Exception as exc:
                log.warning("worker %s: %s of %s: %s: %s", self.who, why, t, type(exc).__name__, exc)

        if tasks:
            with ThreadPoolExecutor(
                max_workers=min(32, len(tasks)), thread_name_prefix=f"worker-{self.who}-{why}"
            ) as pool:
                list(pool.map(stop_one, tasks))

    def _stop_in_batch(self, t: str, batch: StopBatch) -> None:
        """Stop one of several tasks let go of together (a revocation, an eager rejoin): the runners stop in
        parallel on pool threads, and whichever stop finishes last releases them all together (``Ownership
        .release``: one pipelined read of their statuses, one multi). The member rejoins only once all of them
        are let go. A slow stop holds the others at most ``BATCH_LINGER_S`` (``StopBatch.expire``, on a timer); a
        stop that hangs past its own budget, or raises, is escalated by the deadline watchdog (kill, halt).
        The busy flags are cleared as tasks are released."""
        stopped = False
        try:
            self.stop_runner(t)
            stopped = True
        except Exception:
            log.exception("worker %s: stopping %s", self.who, t)
        finally:
            self.owners.batch_stopped(batch.done(t, stopped))

    def _batch_timer(self, batch: StopBatch) -> None:
        timer = threading.Timer(BATCH_LINGER_S, lambda: self.owners.batch_stopped(batch.expire()))
        timer.name = f"worker-{self.who}-batch"
        timer.daemon = True
        timer.start()

    def _stop_task(self, t: str) -> None:
        """One task let go alone: a batch of one (stop, then release; see ``_stop_in_batch``)."""
        self._stop_in_batch(t, StopBatch(1))

    def stop_all(self, release: bool) -> None:
        """Stop every runner; ``release``: then delete the owner znodes held when this began."""
        with self.table.lock:
            running = [t for t, s in self.table.slots.items() if s.running]
            held = [t for t, s in self.table.slots.items() if s.held]
        self.stop_runners(running, "stop")
        if release and held:
            self.owners.drop(held)

    # ---- the status thread's poll -------------------------------------------------------------------
    def poll(self) -> None:
        """Poll the runner: metrics, failures (restarted with backoff), completions; start what is due.

        The runner is read outside the table's lock, so a stop (the fence's, a restart's) can begin or end
        meanwhile: a run being stopped looks ended (a stopped streaming query is inactive with no error, i.e.
        COMPLETED). A FAILED or COMPLETED read counts only if no stop began since the run was picked and
        none is under way: else the stop's own bookkeeping holds (a task the fence stopped and marked
        COMPLETED was never started again after the lift)."""
        table = self.table
        with table.lock:
            running = [(t, s.stops) for t, s in table.slots.items() if s.running and not s.busy and not s.stopping]
        for t, stops in running:
            st = self.runner.status(t)
            with table.lock:
                slot = table.slots[t]
                ended = slot.running and not slot.stopping and slot.stops == stops
                if st.metrics != slot.metrics:
                    # a run's first batch is a milestone (what "running" means to a reader), written at once
                    first_batch = not slot.metrics.get("batches") and bool(st.metrics.get("batches"))
                    slot.metrics = dict(st.metrics)
                    slot.metrics_dirty = True
                    slot.dirty = slot.dirty or first_batch
            if st.state is RunState.FAILED and ended:
                self.stop_runner(t)
                self.failed(t, st.error or "failed", st.trace, kind=st.error_type or "Error")
            elif st.state is RunState.COMPLETED:
                table.ended(t, slot, stops)
        with table.lock:
            due = [t for t, s in table.slots.items() if s.restart_at is not None and s.restart_at <= time.monotonic()]
        if due:
            with table.lock:
                for t in due:
                    table.slots[t].restart_at = None
            self.reconcile()
