"""The checks of a chaos run, independent of the code under test: samples of the epoch and the
generations, the cluster as ZooKeeper shows it, run intervals for the overlap checker, sinks."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

from broker_sim.chaos.processes import read_journal
from broker_sim.chaos.schedule import GROUP
from broker_sim.chaos.sinks import sink_ids
from broker_sim.chaos.summary import Sample, Verdict
from broker_sim.sim.checker import close_open, concurrent_moves, double_ownership, move_runs
from controller.protocol import codecs
from controller.protocol.codecs import (
    GroupStateInfo,
    OwnerInfo,
    PayloadError,
    RunInterval,
    TaskStatus,
)
from controller.protocol.taskspec import decode_task
from controller.zk.client import make_client
from controller.zk.layout_io import list_tasks
from controller.zk.io import exists_many, get_many

log = logging.getLogger(__name__)


class Checks:
    """Sampling and the invariants' verdicts."""

    # ---- the sampler ------------------------------------------------------------------------------
    def _sample_loop(self) -> None:
        client = make_client(self.settings(), connect=False)
        try:
            client.start(timeout=30)
        except Exception:
            log.exception("sampler could not connect")
            return
        try:
            while not self._sampling.wait(self.copts.sample_interval_s):
                try:
                    if not client.connected:
                        continue
                    e = client.get_async(self.layout.controller_epoch)
                    g = client.get_async(self.layout.group_state(GROUP))
                    epoch = state = gen = None
                    try:
                        epoch = codecs.decode_epoch(e.get(timeout=1.0)[0], self.layout.controller_epoch)
                    except Exception:
                        pass
                    try:
                        info = codecs.decode(GroupStateInfo, g.get(timeout=1.0)[0], self.layout.group_state(GROUP))
                        state, gen = info.state, info.generation
                    except Exception:
                        pass
                    if epoch is not None or state is not None:
                        self.samples.append(Sample(time.time(), epoch, state, gen))
                except Exception:
                    continue
        finally:
            client.stop()
            client.close()

    # ---- the ZooKeeper view of invariant 2 --------------------------------------------------------
    def zk_view(self) -> list[str]:
        """What is wrong with 'every RUNNING task runs on exactly one live broker' right now (empty = ok)."""
        c, lay = self.admin, self.layout
        problems: list[str] = []
        tasks = list_tasks(c, lay)
        deleting = c.get_children(lay.admin_delete_tasks)
        if deleting:
            problems.append(f"{len(deleting)} deletions pending")
        brokers = sorted(c.get_children(lay.broker_ids))
        sessions = {b: st.ephemeralOwner for b, st in zip(brokers, exists_many(c, [lay.broker(b) for b in brokers]))
                    if st is not None}
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
        running = self.running_now()
        where = "broker processes" if self.copts.process_brokers else "in-process workers"
        for t in sorted(expected):
            if running[t] != 1:
                problems.append(f"{t}: running on {running[t]} {where}")
        extra = sorted(set(running) - expected)
        if extra:
            problems.append(f"running but not expected: {extra[:5]}")
        return problems

    def running_now(self) -> Counter[str]:
        """Task -> how many live brokers run it now: a process broker's from its journal (a start not yet
        followed by a stop), an in-process worker's from its runner."""
        if not self.copts.process_brokers:
            return Counter(t for w in self.workers.values() for t in w.running_tasks())
        with self._procs_lock:
            journals = [(bid, self.journals[bid][-1]) for bid in self.broker_procs]
        return Counter(i.task_id for bid, journal in journals for i in read_journal(journal, bid, None) if i.end is None)

    # ---- the run ----------------------------------------------------------------------------------
    def all_run_intervals(self) -> list[RunInterval]:
        if not self.copts.process_brokers:
            return self.all_intervals()
        now = time.time()
        out = list(self.process_intervals)
        for bid in self.broker_procs:
            out += read_journal(self.journals[bid][-1], bid, None)
        return close_open(out, now)

    def _check_sinks(self, pipes: dict[str, tuple[Path, Path]], gens: dict[str, Any]) -> tuple[dict[str, dict[str, int]], Verdict]:
        """Invariant 5: once the generators are done, every sink holds every record exactly once."""
        o = self.copts
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

    def _verdict_1(self, intervals: list[RunInterval]) -> Verdict:
        overlaps = double_ownership(intervals)
        return Verdict(1, "no task ever had two running owners", not overlaps,
                       [str(x) for x in overlaps[:10]] or [f"{len(intervals)} run intervals, no overlap"])

    def _verdict_3(self) -> Verdict:
        bad: list[str] = []
        last_epoch = last_gen = None
        for s in self.samples:
            if s.epoch is not None:
                if last_epoch is not None and s.epoch < last_epoch:
                    bad.append(f"epoch {last_epoch} -> {s.epoch} at {s.t:.3f}")
                last_epoch = s.epoch if last_epoch is None else max(last_epoch, s.epoch)
            if s.generation is not None:
                if last_gen is not None and s.generation < last_gen:
                    bad.append(f"generation {last_gen} -> {s.generation} at {s.t:.3f}")
                last_gen = s.generation if last_gen is None else max(last_gen, s.generation)
        return Verdict(3, "controller epoch and generations only grow", not bad,
                       bad[:10] or [f"{len(self.samples)} samples; epoch up to {last_epoch}, generation up to {last_gen}"])

    def _verdict_halted_back(self) -> Verdict:
        """Invariant 6 (when a broker halted): every halted broker was restarted and is a member of the group
        again at the end (registered with a live session and a join request in the group)."""
        lay = self.layout

        def missing_now() -> list[str]:
            registered = set(self.admin.get_children(lay.broker_ids))
            members = set(self.admin.get_children(lay.group_members(GROUP)))
            return sorted(b for b in self.halts if b not in registered or b not in members)

        # a restarted broker registers once its old session expired (and a Spark one starts its JVM): it has
        # the convergence bound from its restart to be back
        until = (self.last_restart or time.monotonic()) + self.copts.convergence_bound_s
        missing = missing_now()
        while missing and time.monotonic() < until:
            time.sleep(0.2)
            missing = missing_now()
        details = [f"{b}: halted {n}x, " + ("back" if b not in missing else "NOT back in the group")
                   for b, n in sorted(self.halts.items())]
        return Verdict(6, "every broker that halted at its fence deadline is restarted and back in the group",
                       not missing, details[:10])

    def _verdict_throttle(self, intervals: list[RunInterval], since: float) -> Verdict:
        """Invariant 7 (with a move throttle): from the brokers' own run intervals, never more moves in flight
        (owner taken, runner not yet started) than ``max_moves`` at once, nor more than ``max_moves_per_broker``
        starting on one broker."""
        o = self.copts
        moves = move_runs(intervals, (since, float("inf")))
        most, per = concurrent_moves(moves)
        busiest = max(per.items(), key=lambda kv: kv[1]) if per else ("-", 0)
        ok = (o.max_moves is None or most <= o.max_moves) and (
            o.max_moves_per_broker is None or busiest[1] <= o.max_moves_per_broker)
        return Verdict(7, "no more moves in flight than the throttle allows, in all and per broker", ok,
                       [f"{len(moves)} moves; at most {most} in flight at once (max_moves {o.max_moves}), "
                        f"at most {busiest[1]} starting on {busiest[0]} (max_moves_per_broker {o.max_moves_per_broker})"])

    def _verdict_maintenance(self, intervals: list[RunInterval], grace_s: float = 3.0) -> Verdict:
        """Invariant 8 (with maintenance windows): nothing moves while maintenance mode is on. A move counts
        when a task that ran somewhere after the window opened (plus ``grace_s``, for a move decided just
        before it) starts on another broker before the window closes; moves under way when it opened finish."""
        bad: list[str] = []
        for on, off in self.maintenance_windows:
            if on is None:
                continue
            end = off if off is not None else float("inf")
            for m in move_runs(intervals, (on + grace_s, end)):
                if m.source is None:
                    continue
                left = max((i.released or i.end or float("inf")) for i in intervals
                           if i.task_id == m.task_id and i.broker == m.source
                           and (i.acquired or i.start) < m.acquired)
                if left > on + grace_s:
                    bad.append(f"{m.task_id}: {m.source} -> {m.broker} at {m.acquired:.2f} in [{on:.2f}, {end:.2f}]")
        return Verdict(8, "nothing moves while maintenance mode is on", not bad,
                       bad[:10] or [f"{len(self.maintenance_windows)} windows, no move inside"])

    def _verdict_4(self, faults_end: float) -> tuple[Verdict, float]:
        o = self.copts
        after = [s for s in self.samples if s.t >= faults_end and s.state is not None]
        longest = 0.0
        bad: list[str] = []
        run_start: Sample | None = None
        for s in after + [None]:  # type: ignore[list-item]
            unstable = s is not None and s.state != "Stable"
            if run_start is not None and (not unstable or s.generation != run_start.generation):
                prev_t = s.t if s is not None else after[-1].t
                length = prev_t - max(run_start.t, faults_end)
                longest = max(longest, length)
                if length > o.stable_bound_s:
                    bad.append(f"{run_start.state} at generation {run_start.generation} for {length:.1f}s")
                run_start = None
            if unstable and run_start is None:
                run_start = s
        if not after:
            bad.append("no samples after the faults stopped")
        elif after[-1].state != "Stable":
            bad.append(f"ends {after[-1].state}")
        return Verdict(4, "no group out of Stable longer than rebalance timeout + delay after the faults", not bad,
                       bad[:10] or [f"longest out of Stable {longest:.2f}s (bound {o.stable_bound_s:.0f}s)"]), longest
