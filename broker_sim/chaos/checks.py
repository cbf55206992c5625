"""The checks of a chaos run that look at the live cluster, independent of the code under test: samples of
the epoch and the group's state and generation, the cluster as ZooKeeper shows it (invariant 2), every
halted broker back (6) and the sinks (5). The verdicts over what was recorded are pure: ``verdicts``."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from broker_sim.chaos.schedule import GROUP, ChaosOptions
from broker_sim.chaos.sinks import sink_ids
from broker_sim.chaos.summary import Placement, Sample, Verdict
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, registration_records
from controller.protocol.records.group_messages import Assignment, GroupStateInfo, JoinRequest
from controller.protocol.records.payload_validation import PayloadError
from controller.protocol.records.task_records import OwnerInfo, TaskStatus
from controller.protocol.tasks.spec import decode_task
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import exists_many, get_many
from controller.zk.layout_io import list_tasks

if TYPE_CHECKING:
    from kazoo.client import KazooClient

log = logging.getLogger(__name__)


def current_placements(info: GroupStateInfo | None, assignments: dict[str, Assignment]) -> dict[str, tuple[str, ...]]:
    """What the group places where, as its protocol means it: the assignment znodes of the members of its
    current generation (the group state's ``members``), and in a join round's Stable only those of that
    generation. An assignment znode outlives its member's place in the group (a member that left, or whose
    rejoin maintenance mode put off, keeps its last one until it is given another): it places nothing."""
    if info is None:
        return {m: a.assigned for m, a in assignments.items() if a.assigned and a.error is None}
    in_generation = set(info.members)
    join_round_stable = info.protocol != "reconcile" and info.state == "Stable"
    return {
        m: a.assigned
        for m, a in assignments.items()
        if a.assigned
        and a.error is None
        and m in in_generation
        and not (join_round_stable and a.generation != info.generation)
    }


def settle_look(
    placement: Placement | None, began: float, took_s: float, interrupted: bool, interval_s: float
) -> tuple[Placement, float]:
    """What one look of the placement sampler records, and the pause before the next.

    A look is a dozen reads and then what the brokers run: one instant only while its connection holds. A
    look that failed (None), or during which its client's connection dropped (``interrupted``), is blind:
    requests sent while kazoo reconnects wait for the new connection, so such a look read the group's
    state before the drop and what runs after it (a soak's look began just before the ensemble's leader was
    killed, read the state then, and what ran 6.5 s later, when one broker had not yet restarted its tasks).
    A blind look, dated when it began (``began``, wall clock), ends a stretch of invariant 9 there: while
    ZooKeeper cannot be read nothing can act on a placement. The next look comes after ``interval_s``;
    after a good one, after twice as long as it took if longer (a look costs more as task storms add tasks:
    at most a third of the time goes to looking)."""
    if placement is None or interrupted:
        return Placement(began, None, controller_up=False), interval_s
    return placement, max(interval_s, 2 * took_s)


class ConnectionWatch:
    """Counts the state changes of a kazoo client (SUSPENDED, CONNECTED, LOST): a look that saw the count
    change was cut by a connection loss."""

    def __init__(self, client: KazooClient) -> None:
        self.changes = 0
        client.add_listener(self._changed)

    def _changed(self, _state: object) -> None:
        self.changes += 1  # (kazoo's connection thread alone calls it)


class CheckedRun(Protocol):
    """What the checks read of a chaos run: its options and ZooKeeper client, how to connect another, the
    brokers that halted, and what its brokers run right now (their own account, not ZooKeeper's)."""

    copts: ChaosOptions
    admin: KazooClient
    layout: ZkLayout
    halts: Counter[str]
    last_restart: float | None

    def settings(self, hosts: str | None = None) -> ZkSettings: ...

    def running_now(self) -> Counter[str]: ...

    def broker_life(self, bid: str) -> float | None: ...

    def known_broker(self, bid: str) -> bool: ...

    def controller_up(self, cid: str) -> bool: ...


class Checks:
    """The sampler and the checks of the live cluster; ``samples`` is what the sampler saw."""

    def __init__(self, run: CheckedRun) -> None:
        self.run = run
        self.samples: list[Sample] = []
        self.placements: list[Placement] = []

    @contextmanager
    def _own_client(self, who: str) -> Iterator[KazooClient | None]:
        """A sampler's own client, connected (None: it could not connect, which is logged), closed after."""
        client = make_client(self.run.settings(), connect=False)
        try:
            client.start(timeout=30)
        except Exception:
            log.exception("%s could not connect", who)
            yield None
            return
        try:
            yield client
        finally:
            client.stop()
            client.close()

    # ---- the sampler ------------------------------------------------------------------------------
    def sample_loop(self, stop: threading.Event) -> None:
        """Sample ``/controller_epoch`` and the group state every ``sample_interval_s`` until ``stop``."""
        run = self.run
        with self._own_client("sampler") as client:
            if client is None:
                return
            while not stop.wait(run.copts.sample_interval_s):
                try:
                    if not client.connected:
                        continue
                    e = client.get_async(run.layout.controller_epoch)
                    g = client.get_async(run.layout.group_state(GROUP))
                    epoch = state = gen = None
                    try:
                        epoch = codecs.decode_epoch(e.get(timeout=1.0)[0], run.layout.controller_epoch)
                    except Exception:
                        pass
                    try:
                        info = codecs.decode(GroupStateInfo, g.get(timeout=1.0)[0], run.layout.group_state(GROUP))
                        state, gen = info.state, info.generation
                    except Exception:
                        pass
                    if epoch is not None or state is not None:
                        self.samples.append(Sample(time.time(), epoch, state, gen))
                except Exception:
                    continue

    # ---- the placement sampler (invariants 9 and 10) ------------------------------------------------
    def placement_loop(self, stop: threading.Event) -> None:
        """Every ``placement_interval_s`` (or twice as long as a look took, if longer) until ``stop``: which
        placed tasks have no running owner, and which members that are no broker of the run hold tasks
        (read-only, on a client of its own)."""
        with self._own_client("placement sampler") as client:
            if client is None:
                return
            watch = ConnectionWatch(client)
            pause = self.run.copts.placement_interval_s
            while not stop.wait(pause):
                placement, pause = self.look(client, watch)
                self.placements.append(placement)

    def look(self, client: KazooClient, watch: ConnectionWatch) -> tuple[Placement, float]:
        """One look of the placement sampler, as recorded (``settle_look``), and the pause before the next."""
        began, began_wall, drops = time.monotonic(), time.time(), watch.changes
        placement: Placement | None = None
        try:
            if not client.connected:
                raise ConnectionError("the placement sampler is not connected")
            placement = self.placement(client)
        except Exception as exc:  # ZooKeeper restarting, a znode gone between two reads: next look
            log.debug("placement sample: %s", exc)
        return settle_look(
            placement,
            began_wall,
            time.monotonic() - began,
            watch.changes != drops,
            self.run.copts.placement_interval_s,
        )

    def placement(self, c: KazooClient) -> Placement:
        """One look: the group's state, its assignments, its members, the brokers and the placed tasks' owners,
        against what the brokers run (their journals, or the workers' runners)."""
        run, lay = self.run, self.run.layout
        t = time.time()
        info: GroupStateInfo | None = None
        try:
            info = codecs.decode(GroupStateInfo, c.get(lay.group_state(GROUP))[0], lay.group_state(GROUP))
        except Exception:
            pass  # unreadable or missing: the sample says no state
        state = info.state if info is not None else None
        active = None
        try:
            active = codecs.decode(
                registration_records.ControllerInfo, c.get(lay.controller)[0], lay.controller
            ).controller_id
        except Exception:
            pass  # no controller now
        members = sorted(c.get_children(lay.group_assignments(GROUP)))
        found: dict[str, Assignment] = {}
        for m, res in zip(members, get_many(c, [lay.group_assignment(GROUP, m) for m in members])):
            if res is None:
                continue
            try:
                found[m] = codecs.decode(Assignment, res[0], lay.group_assignment(GROUP, m))
            except PayloadError:
                continue
        placed = current_placements(info, found)
        joined = dict(zip(placed, exists_many(c, [lay.group_member(GROUP, m) for m in placed])))
        brokers = sorted(c.get_children(lay.broker_ids))
        sessions = {st.ephemeralOwner for st in exists_many(c, [lay.broker(b) for b in brokers]) if st is not None}
        tasks = sorted({task for ts in placed.values() for task in ts})
        owners = dict(zip(tasks, get_many(c, [lay.task_owner(task) for task in tasks])))
        running = run.running_now()
        unowned: list[tuple[str, str]] = []
        # no path of the coordinator's writes tasks to a member with no broker behind it, in any generation
        strangers = [
            (m, len(a.assigned)) for m, a in found.items() if a.assigned and a.error is None and not run.known_broker(m)
        ]
        for m, ts in placed.items():
            if run.known_broker(m):
                life = run.broker_life(m)
                member = joined.get(m)
                if life is None or (member is not None and member.ctime / 1000.0 < life - 0.5):
                    continue  # killed, frozen, or a previous life: its session's expiry tells the controller
            for task in ts:
                res = owners.get(task)
                if res is not None and res[1].ephemeralOwner in sessions and running[task] >= 1:
                    continue
                unowned.append((task, m))
        up = active is not None and run.controller_up(active)
        return Placement(t, state, tuple(sorted(unowned)), tuple(sorted(strangers)), up)

    # ---- the ZooKeeper view of invariant 2 --------------------------------------------------------
    def zk_view(self) -> list[str]:
        """What is wrong with 'every RUNNING task runs on exactly one live broker' right now (empty = ok)."""
        c, lay = self.run.admin, self.run.layout
        problems: list[str] = []
        tasks = list_tasks(c, lay)
        deleting = c.get_children(lay.admin_delete_tasks)
        if deleting:
            problems.append(f"{len(deleting)} deletions pending")
        brokers = sorted(c.get_children(lay.broker_ids))
        sessions = {
            b: st.ephemeralOwner
            for b, st in zip(brokers, exists_many(c, [lay.broker(b) for b in brokers]))
            if st is not None
        }
        specs = get_many(c, [lay.task(t) for t in tasks])
        owners = get_many(c, [lay.task_owner(t) for t in tasks])
        statuses = get_many(c, [lay.status(t) for t in tasks])
        expected: set[str] = set()
        for t, spec_res, owner_res, status_res in zip(tasks, specs, owners, statuses):
            if spec_res is None:
                continue
            try:
                spec = decode_task(spec_res[0], lay.task(t))
            except PayloadError:
                continue
            if spec.state != "RUNNING":
                continue
            expected.add(t)
            if owner_res is None:
                problems.append(f"{t}: no owner")
                continue
            try:
                owner = codecs.decode(OwnerInfo, owner_res[0], lay.task_owner(t))
            except PayloadError as exc:
                problems.append(str(exc))
                continue
            if sessions.get(owner.broker) != owner_res[1].ephemeralOwner:
                problems.append(f"{t}: owner {owner.broker} is not a live broker's session")
                continue
            if status_res is None:
                problems.append(f"{t}: no status")
                continue
            st = codecs.decode(TaskStatus, status_res[0], lay.status(t))
            if st.state != "RUNNING" or st.broker != owner.broker:
                problems.append(f"{t}: status {st.state} on {st.broker}, owner {owner.broker}")
        # what runs for real, not what the brokers wrote: a broker fenced for good keeps its owner znodes and
        # RUNNING statuses while its runners are stopped (the processes' journals record every start and stop)
        running = self.run.running_now()
        where = "broker processes" if self.run.copts.process_brokers else "in-process workers"
        for t in sorted(expected):
            if running[t] != 1:
                problems.append(f"{t}: running on {running[t]} {where}")
        extra = sorted(set(running) - expected)
        if extra:
            problems.append(f"running but not expected: {extra[:5]}")
        return problems

    def sinks(
        self, pipes: dict[str, tuple[Path, Path]], gens: dict[str, Any]
    ) -> tuple[dict[str, dict[str, int]], Verdict]:
        """Invariant 5: once the generators are done, every sink holds every record exactly once."""
        o = self.run.copts
        deadline = time.monotonic() + o.sink_timeout_s
        results = {t: g.join(max(1.0, deadline - time.monotonic())) for t, g in gens.items()}
        expected = {t: set(results[t].ids()) for t in pipes}
        held: dict[str, list[int]] = {}
        while True:  # bounded: until complete or the deadline
            held = {t: sink_ids(out) for t, (_, out) in pipes.items()}
            if all(set(held[t]) >= expected[t] for t in pipes) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        figures: dict[str, dict[str, int]] = {}
        bad: list[str] = []
        for t in pipes:
            ids = held[t]
            dup = len(ids) - len(set(ids))
            missing = len(expected[t] - set(ids))
            extra = len(set(ids) - expected[t])
            figures[t] = {"expected": len(expected[t]), "held": len(ids), "duplicates": dup, "missing": missing}
            if dup or missing or extra:
                bad.append(f"{t}: {dup} duplicates, {missing} missing, {extra} unexpected of {len(expected[t])}")
        details = bad or [f"{t}: {f['held']} records, each once" for t, f in figures.items()]
        return figures, Verdict(5, "every sink holds every record exactly once", not bad, details)

    def reports_rewritten_back(self, rewritten: dict[str, float]) -> Verdict:
        """Invariant 11 (with rewritten reports): every member whose report was rewritten wrote a valid one of
        its own again (it was told, and rejoined) within the convergence bound of the rewrite, and holds one at
        the end (a member now gone, or a broker down now, is not held to it)."""
        run, lay = self.run, self.run.layout
        until = max(rewritten.values(), default=time.time()) + run.copts.convergence_bound_s

        def wrong_now() -> dict[str, str]:
            out: dict[str, str] = {}
            for bid in sorted(rewritten):
                path = lay.group_member(GROUP, bid)
                try:
                    data, _ = run.admin.get(path)
                except Exception:
                    continue  # not a member now (killed, left): nothing of ours to fix
                try:
                    req = codecs.decode(JoinRequest, data, path)
                except PayloadError as exc:
                    out[bid] = f"still the rewritten report ({exc})"
                    continue
                if req.member_id != bid:
                    out[bid] = f"a report naming {req.member_id!r}"
            return out

        wrong = wrong_now()
        while wrong and time.time() < until:
            time.sleep(0.5)
            wrong = wrong_now()
        details = [
            f"{b}: {why}, {time.time() - rewritten[b]:.0f}s after its report was last rewritten"
            for b, why in wrong.items()
        ] or [f"{len(rewritten)} member(s) rewrote their report"]
        return Verdict(11, "a member whose report was rewritten reports again, validly", not wrong, details[:10])

    def halted_back(self) -> Verdict:
        """Invariant 6 (when a broker halted): every halted broker was restarted and is a member of the group
        again at the end (registered with a live session and a join request in the group)."""
        run = self.run
        lay = run.layout

        def missing_now() -> list[str]:
            registered = set(run.admin.get_children(lay.broker_ids))
            members = set(run.admin.get_children(lay.group_members(GROUP)))
            return sorted(b for b in run.halts if b not in registered or b not in members)

        # a restarted broker registers once its old session expired (and a Spark one starts its JVM): it has
        # the convergence bound from its restart to be back
        until = (run.last_restart or time.monotonic()) + run.copts.convergence_bound_s
        missing = missing_now()
        while missing and time.monotonic() < until:
            time.sleep(0.2)
            missing = missing_now()
        details = [
            f"{b}: halted {n}x, " + ("back" if b not in missing else "NOT back in the group")
            for b, n in sorted(run.halts.items())
        ]
        return Verdict(
            6,
            "every broker that halted at its fence deadline is restarted and back in the group",
            not missing,
            details[:10],
        )
