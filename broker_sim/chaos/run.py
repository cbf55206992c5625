"""The chaos run: ``ChaosRun`` starts the cluster (ZooKeeper, controllers, brokers, pipelines), plays the
schedule, and once the last fault is over asks the checks for their verdicts. ``run_chaos`` is the entry point."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from broker_sim.chaos import faults, verdicts
from broker_sim.chaos.checks import Checks
from broker_sim.chaos.ensemble import ChaosEnsemble
from broker_sim.chaos.player import play
from broker_sim.chaos.processes import ChaosProcess, JournalTail, dump_and_tail, read_journal, zkctl_command
from broker_sim.chaos.record import PLACEMENTS_FILE, write_placements
from broker_sim.chaos.schedule import FAULT_KINDS, GROUP, ChaosOptions, broker_id, left_out, make_schedule
from broker_sim.chaos.sinks import pipeline_spec
from broker_sim.chaos.summary import ChaosSummary, Verdict
from broker_sim.chaos.write_stall import WriteStall
from broker_sim.sim.checker import close_open, double_ownership
from broker_sim.sim.netproxy import NetProxy
from broker_sim.sim.simulation_types import NotConverged, SimOptions
from broker_sim.sim.simulator import Simulation
from controller.admin import AdminClient
from controller.daemon import Controller, ControllerConfig
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records import codecs, registration_records
from controller.protocol.records.task_records import RunInterval
from controller.zk.client import ZkSettings
from controller.zk.layout_io import list_tasks

log = logging.getLogger(__name__)


class ChaosRun(Simulation):
    """One chaos run: the cluster and its brokers' lives, the fault phase and the verdicts. The faults
    (``faults.INJECTORS``) reach it through ``faults.ChaosCluster``, ``player.play`` times them, the
    ``checks`` watch the live cluster and ``verdicts`` judge what was recorded."""

    def __init__(self, opts: ChaosOptions, echo: Callable[[str], None] = lambda s: None) -> None:
        super().__init__(
            SimOptions(
                brokers=opts.brokers,
                tasks=opts.tasks,
                session_timeout_s=opts.session_timeout_s,
                rebalance_timeout_s=opts.rebalance_timeout_s,
                scheduled_delay_s=opts.scheduled_delay_s,
                zk_hosts=opts.zk_hosts,
                root=opts.root,
                seed=opts.seed,
                use_proxies=True,
                converge_timeout_s=opts.convergence_bound_s,
                protocol=opts.protocol,
            ),
            echo,
        )
        self.copts = opts
        self.schedule = make_schedule(opts)
        self.checks = Checks(self)
        self._sampling = threading.Event()
        self.ctl_proxies: dict[str, NetProxy] = {}
        self.write_stalls: dict[str, WriteStall] = {}
        self.ctl_procs: dict[str, ChaosProcess] = {}
        self.broker_procs: dict[str, ChaosProcess] = {}
        self.journals: dict[str, list[Path]] = {}
        self.process_intervals: list[RunInterval] = []
        self._ctl_seq = 0
        self._incarnation: Counter[str] = Counter()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []  # the sampler and the supervisor
        self.halts: Counter[str] = Counter()  # brokers that halted at their fence deadline, restarted by us
        self.wedged_busy = 0  # wedged-stop faults whose broker ran a task when it was cut off
        #: when the last halted broker exited (wall clock): the halted life's session lives until it expires
        self.last_halt: float | None = None
        self.crashes: list[str] = []  # broker processes that exited with nothing asking them to, restarted by us
        self.last_restart: float | None = None
        self._procs_lock = threading.Lock()
        self.maintenance_windows: list[list[float | None]] = []  # [on, off] wall-clock times
        self._tails: dict[Path, JournalTail] = {}
        self._tails_lock = threading.Lock()
        self._born: dict[str, float] = {}  # in-process broker -> when its current life began
        self.ghosts: list[str] = []  # member ids of the ghost members injected (verdict 10)
        self.rewritten: dict[str, float] = {}  # member -> when its report was last rewritten (verdict 11)
        self.ensemble: ChaosEnsemble | None = None  # the run's own three servers (--ensemble 3)
        self._ensemble_dir: tempfile.TemporaryDirectory[str] | None = None
        self.quorum_returns: list[float | None] = []  # per quorum loss: until every task ran again (verdict 12)

    def __enter__(self) -> Self:
        """With ``ensemble`` > 1 the run's ZooKeeper is an ensemble of its own (in a directory apart: its
        servers are stopped by the pids their data directories keep, after everything that uses them)."""
        if self.copts.ensemble > 1 and self.copts.zk_hosts is None:
            self._ensemble_dir = tempfile.TemporaryDirectory(prefix="zkc-ensemble-")
            self.ensemble = ChaosEnsemble(Path(self._ensemble_dir.name), self.copts.ensemble)
            try:
                self.ensemble.start()
            except BaseException:
                self._close_ensemble()
                raise
            self.opts = dataclasses.replace(self.opts, zk_hosts=self.ensemble.hosts)
        try:
            return super().__enter__()
        except BaseException:
            self._close_ensemble()
            raise

    def _close_ensemble(self) -> None:
        if self.ensemble is not None:
            self.ensemble.close()
            self.ensemble = None
        if self._ensemble_dir is not None:
            self._ensemble_dir.cleanup()
            self._ensemble_dir = None

    def tasks_running_within(self, timeout: float) -> float | None:
        """Seconds until every RUNNING task runs on exactly one live broker, as the checks see it (None: not
        within ``timeout``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 <= timeout and not self._stop.is_set():
            try:
                if not self.checks.zk_view():
                    return time.monotonic() - t0
            except Exception:  # ZooKeeper not answering yet: the clock runs
                pass
            self._stop.wait(0.2)
        return None

    @property
    def admin_ops(self) -> AdminClient:
        """The admin library over the run's own ZooKeeper client (settings, maintenance mode)."""
        return AdminClient(self.admin, self.layout)

    # ---- cluster pieces ---------------------------------------------------------------------------
    def _proxy(self, name: str, table: dict[str, NetProxy]) -> NetProxy:
        proxy = table.get(name)
        if proxy is None:
            proxy = table[name] = NetProxy.for_hosts(self.hosts, name=f"proxy-{name}")
        proxy.heal()
        return proxy

    def new_controller(self) -> str:
        cid = f"ctl-{self._ctl_seq}"
        self._ctl_seq += 1
        proxy = self._proxy(cid, self.ctl_proxies)
        o = self.copts
        if o.process_brokers:
            cmd = zkctl_command() + [
                "--zk",
                proxy.address,
                "--zk-root",
                self.root,
                "controller",
                "run",
                "--id",
                cid,
                "--rebalance-timeout",
                str(o.rebalance_timeout_s),
                "--scheduled-delay",
                str(o.scheduled_delay_s),
                "--session-timeout",
                str(o.session_timeout_s),
            ]
            self.ctl_procs[cid] = ChaosProcess(cid, cmd, Path(self.tmp.name) / f"{cid}.log")
        else:
            cfg = ControllerConfig(
                cid,
                ZkSettings(
                    hosts=proxy.address,
                    root=self.root,
                    session_timeout_s=o.session_timeout_s,
                    auth=self.settings().auth,
                ),
                GroupConfig(
                    rebalance_timeout_s=o.rebalance_timeout_s,
                    scheduled_rebalance_delay_s=o.scheduled_delay_s,
                    default_assignor="cooperative-sticky",
                ),
            )
            self.write_stalls[cid] = WriteStall()
            self.controllers.append(Controller(cfg, before_write=self.write_stalls[cid]).start())
        return cid

    def settings(self, hosts: str | None = None) -> ZkSettings:
        base = super().settings(hosts)
        auth = os.environ.get("ZKC_AUTH")
        return dataclasses.replace(base, auth=auth) if auth else base

    def new_broker(self, bid: str) -> None:
        if not self.copts.process_brokers:
            self._born[bid] = time.time()
            self.start_worker(bid)
            return
        proxy = self._proxy(bid, self.proxies)
        self._incarnation[bid] += 1
        journal = Path(self.tmp.name) / f"{bid}.{self._incarnation[bid]}.journal"
        self.journals.setdefault(bid, []).append(journal)
        cmd = [
            sys.executable,
            "-m",
            "broker_sim.chaos",
            "broker",
            "--id",
            bid,
            "--zk",
            proxy.address,
            "--root",
            self.root,
            "--session-timeout",
            str(self.copts.session_timeout_s),
            "--journal",
            str(journal),
            "--protocol",
            self.copts.protocol,
        ]
        if self.copts.pipelines:
            cmd += [
                "--runner",
                "spark",
                "--spark-master",
                self.copts.spark_master,
                "--checkpoint-root",
                str(Path(self.tmp.name) / "checkpoints"),
            ]
        log_path = Path(self.tmp.name) / f"{bid}.{self._incarnation[bid]}.log"
        self.broker_procs[bid] = ChaosProcess(bid, cmd, log_path, broker=True)

    def broker_gone(self, bid: str, died_at: float | None) -> None:
        """A process broker exited (or was killed): its journal is complete; collect its intervals."""
        with self._procs_lock:
            if self.broker_procs.pop(bid, None) is None:
                return  # the supervisor got there first
            journal = self.journals[bid][-1]
        self.process_intervals += read_journal(journal, bid, died_at)

    def running_now(self) -> Counter[str]:
        """Task -> how many live brokers run it now: a process broker's from its journal (a start not yet
        followed by a stop, read incrementally), an in-process worker's from its runner."""
        if not self.copts.process_brokers:
            return Counter(t for w in self.workers.values() for t in w.running_tasks())
        with self._procs_lock:
            journals = [self.journals[bid][-1] for bid in self.broker_procs]
        with self._tails_lock:  # the checks and the placement sampler both ask
            return Counter(t for j in journals for t in self._tails.setdefault(j, JournalTail(j)).running())

    def _post_mortem(self, lines: int = 25) -> str:
        """What a failure to converge says of the cluster: the group's state, the registered brokers, what
        each runs by its own account, and of the processes: each broker's log tail and what its threads were
        doing (a thread dump on SIGQUIT), each controller's log tail (bounded)."""
        lay, out = self.layout, []
        try:
            out.append(f"group state: {self.admin.get(lay.group_state(GROUP))[0][:1500]!r}")
            out.append(f"registered: {sorted(self.admin.get_children(lay.broker_ids))}")
            out.append(f"members: {sorted(self.admin.get_children(lay.group_members(GROUP)))}")
        except Exception as exc:  # ZooKeeper unreadable: say so, the logs may still tell
            out.append(f"ZooKeeper unreadable: {exc}")
        for bid in sorted(set(self.broker_procs) | set(self.workers)):
            out.append(f"{bid} runs {len(self.running_by(bid))} tasks")
        out += dump_and_tail(dict(self.broker_procs), dict(self.ctl_procs), lines)
        return "\n".join(out)

    def running_by(self, bid: str) -> set[str]:
        """What broker ``bid`` runs now, by its own account (journal or runner)."""
        if not self.copts.process_brokers:
            w = self.workers.get(bid)
            return set(w.running_tasks()) if w is not None else set()
        with self._procs_lock:
            if bid not in self.broker_procs:
                return set()
            journal = self.journals[bid][-1]
        with self._tails_lock:
            return set(self._tails.setdefault(journal, JournalTail(journal)).running())

    def runs_tasks(self, bid: str) -> bool:
        """Whether broker ``bid`` runs a task now, by its own account (journal or runner)."""
        return bool(self.running_by(bid))

    def broker_life(self, bid: str) -> float | None:
        """When the current life of broker ``bid`` began, if it is up now as the harness knows it (its process
        alive and not frozen, its in-process worker not frozen, its network not cut); None when it is killed,
        frozen, cut off or away. A broker cut off fences itself a margin before its session can expire, and
        only that expiry tells the controller: until then nothing can act on what it was given."""
        proxy = self.proxies.get(bid)
        if proxy is not None and proxy.partitioned:
            return None
        if self.copts.process_brokers:
            proc = self.broker_procs.get(bid)
            if proc is None or proc.frozen or proc.stopping or not proc.alive():
                return None
            return proc.started
        w = self.workers.get(bid)
        if w is None or self.pauses[bid].is_set() or w.halted.is_set():
            return None
        return self._born.get(bid)

    def controller_up(self, cid: str) -> bool:
        """Whether controller ``cid`` can act, as the harness knows it: its process alive and not frozen, or
        in process, running and not stalled by a freeze."""
        if self.copts.process_brokers:
            proc = self.ctl_procs.get(cid)
            return proc is not None and proc.alive() and not proc.frozen
        ctl = next((c for c in self.controllers if c.id == cid), None)
        return ctl is not None and not self.write_stalls[cid].held

    def known_broker(self, bid: str) -> bool:
        """Whether ``bid`` is one of the run's brokers (a ghost member is not)."""
        return bid in self.journals or bid in self._born or bid in self.workers

    def all_run_intervals(self) -> list[RunInterval]:
        """Every run interval of the run: the workers' own, or the process brokers' journals (those still
        running closed now)."""
        if not self.copts.process_brokers:
            return self.all_intervals()
        now = time.time()
        out = list(self.process_intervals)
        for bid, proc in self.broker_procs.items():  # one that exited unnoticed: its windows end with its group
            out += read_journal(self.journals[bid][-1], bid, None if proc.alive() else proc.reap_group())
        return close_open(out, now)

    def _supervise_loop(self) -> None:
        """What systemd or docker's restart policy does for a deployed broker: a broker that halted at its fence
        deadline (exit 75; an in-process one killed itself) is started again, and so is a broker process that
        exited with nothing asking it to (reported with the faults that went wrong). Its run intervals end when
        it exited, as its waiter thread stamped it, not when this loop looked (0.1 s later at best, most of a
        second under load: the successor that took its tasks meanwhile would seem to overlap it); when a
        process it started outlived it, when that was gone (``ChaosProcess.reap_group``)."""
        from broker_sim.worker.deadline import EXIT_HALTED

        while not self._sampling.wait(0.1):
            if self.copts.process_brokers:
                for bid, proc in list(self.broker_procs.items()):
                    code = proc.popen.poll()
                    if code is None or proc.stopping:  # a fault that ends it restarts it itself
                        continue
                    with self._procs_lock:
                        if self.broker_procs.get(bid) is not proc:
                            continue
                        del self.broker_procs[bid]
                        journal = self.journals[bid][-1]
                    died_at = proc.reap_group()  # when it exited, or what it started after it (not this look)
                    self.process_intervals += read_journal(journal, bid, died_at)
                    self.last_restart = time.monotonic()
                    if code == EXIT_HALTED:
                        self.halts[bid] += 1
                        self.last_halt = died_at
                        self.echo(f"  {bid} halted at its fence deadline (exit {code}); restarting it")
                    else:  # nothing asked it to end: a crash, reported with the faults that went wrong
                        self.crashes.append(f"{bid} exited unasked (exit code {code}) at {died_at:.2f}")
                        self.echo(f"  {bid} exited unasked (exit code {code}); restarting it")
                    self.new_broker(bid)
            else:
                for bid, w in list(self.workers.items()):
                    if w.halted.is_set():
                        self.halts[bid] += 1
                        self.last_halt = time.time()
                        self.last_restart = time.monotonic()
                        self.echo(f"  {bid} halted at its fence deadline ({w.watchdog.reason}); restarting it")
                        self.retire(w, graceful=False)
                        self._born[bid] = time.time()
                        self.start_worker(bid)

    def active_controller_id(self) -> str | None:
        try:
            data, _ = self.admin.get(self.layout.controller)
            return codecs.decode(registration_records.ControllerInfo, data, self.layout.controller).controller_id
        except Exception:
            return None

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; True if the run is stopping meanwhile."""
        return self._stop.wait(seconds)

    def wait_stable(self, timeout: float) -> bool:
        """Until the sampler saw the group Stable within the last second (at most ``timeout``)."""
        deadline = time.monotonic() + timeout
        time.sleep(0.3)  # let the change be noticed before looking for Stable
        while time.monotonic() < deadline and not self._stop.is_set():
            s = self.checks.samples[-1] if self.checks.samples else None
            if s is not None and s.state == "Stable" and time.time() - s.t < 1.0:
                return True
            self._stop.wait(0.1)
        return False

    # ---- the run: start, faults, convergence, verdicts ----------------------------------------------
    def play(self) -> ChaosSummary:
        o = self.copts
        wall0 = time.monotonic()
        for kind, why in left_out(o).items():
            self.echo(f"  left out: {kind} ({why})")
        for f in self.schedule:
            self.echo("  " + f.describe())
        pipes = self._start_cluster()
        samples = self.checks.samples
        gen0 = next((s.generation for s in reversed(samples) if s.generation is not None), 0)
        gens = self._start_datagens(pipes)
        phase_wall0 = time.time()
        played = play(self.schedule, lambda f: faults.begin(self, f), self.sleep, self.echo)
        converge_s, last_problems = self._await_convergence()
        if converge_s is None:  # what each broker was doing then: the verdict alone does not say
            self.echo(f"did not converge after the faults: {last_problems[:5]}\n{self._post_mortem()}")
        pipeline_figures, v5 = self.checks.sinks(pipes, gens) if pipes else ({}, None)
        time.sleep(2 * o.sample_interval_s)
        self._sampling.set()
        for t in self._threads:
            t.join(5)
        intervals = self.all_run_intervals()
        if o.intervals_out:
            Path(o.intervals_out).write_text(json.dumps([codecs.to_jsonable(i) for i in intervals]))
        # a broker that halted as the faults ended left a session that only its expiry ends: nothing can tell
        # the controller sooner that the member behind it is gone, so invariant 4's clock starts then
        quiet_from = max(played.faults_end, (self.last_halt or 0.0) + o.session_timeout_s)
        v4, longest = verdicts.stable_within_bound(samples, quiet_from, o.stable_bound_s)
        looks = [p for p in self.checks.placements if p.t >= phase_wall0]
        if o.placement_interval_s > 0:  # invariant 9 judged again from a kept work directory: ``record``
            write_placements(Path(self.tmp.name) / PLACEMENTS_FILE, looks, phase_wall0, o.ownerless_bound_s)
        v9, ownerless, ownerless_stable = verdicts.placed_tasks_run_while_stable(
            looks, o.ownerless_bound_s, phase_wall0
        )
        found = [
            verdicts.no_two_running_owners(intervals),
            verdicts.converged(converge_s, last_problems, o.hold_s, o.convergence_bound_s),
            verdicts.epoch_and_generations_only_grow(samples),
            v4,
            *self._optional_verdicts(intervals, v5, phase_wall0),
            *([v9] if o.placement_interval_s > 0 else []),
            *(
                [verdicts.no_work_for_strangers(self.checks.placements, self.ghosts, phase_wall0)]
                if self.ghosts
                else []
            ),
            *([self.checks.reports_rewritten_back(self.rewritten)] if self.rewritten else []),
        ]
        generations = [s.generation for s in samples if s.generation is not None]
        epochs = sorted({s.epoch for s in samples if s.epoch is not None})
        return ChaosSummary(
            seed=o.seed,
            process_brokers=o.process_brokers,
            brokers=o.brokers,
            tasks_initial=o.tasks,
            tasks_final=len(list_tasks(self.admin, self.layout)),
            duration_s=o.duration_s,
            schedule=[f.describe().strip() for f in self.schedule],
            faults_injected=dict(sorted(played.injected.items())),
            faults_failed=played.failed + self.crashes,
            rebalances=(max(generations) - gen0) if generations else 0,
            controller_epochs=[epochs[0], epochs[-1]] if epochs else [],
            converge_s=None if converge_s is None else round(converge_s, 3),
            convergence_bound_s=o.convergence_bound_s,
            longest_unstable_s=round(longest, 3),
            stable_bound_s=o.stable_bound_s,
            intervals=len(intervals),
            samples=len(samples),
            verdicts=found,
            wall_s=round(time.monotonic() - wall0, 3),
            pipelines=pipeline_figures,
            halts=dict(sorted(self.halts.items())),
            wedged_busy=self.wedged_busy,
            overlaps=len(double_ownership(intervals)),
            longest_ownerless_s=round(ownerless, 3),
            longest_ownerless_stable_s=round(ownerless_stable, 3),
            ownerless_bound_s=o.ownerless_bound_s,
            ensemble=o.ensemble,
            quorum_returns=[None if q is None else round(q, 3) for q in self.quorum_returns],
            faults_drawn=played.injection.drawn,
            not_injected=[(n.fault, n.reason) for n in played.injection.not_injected],
        )

    def _start_cluster(self) -> dict[str, tuple[Path, Path]]:
        """Tasks, pipelines, controllers and brokers, the sampler and the supervisor; returns once every task
        runs on one live broker (the pipelines: name -> (input, sink) directories)."""
        o = self.copts
        self.create_tasks(o.tasks)
        if o.max_moves is not None or o.max_moves_per_broker is not None:
            self.admin_ops.update_settings({"max_moves": o.max_moves, "max_moves_per_broker": o.max_moves_per_broker})
        pipes = self._create_pipelines()
        for _ in range(max(1, o.controllers)):
            self.new_controller()
        for i in range(o.brokers):
            self.new_broker(broker_id(i))
        self._threads = [
            threading.Thread(target=self.checks.sample_loop, args=(self._sampling,), name="chaos-sampler", daemon=True),
            threading.Thread(target=self._supervise_loop, name="chaos-supervisor", daemon=True),
        ]
        if self.copts.placement_interval_s > 0:
            self._threads.append(
                threading.Thread(
                    target=self.checks.placement_loop, args=(self._sampling,), name="chaos-placement", daemon=True
                )
            )
        for t in self._threads:
            t.start()
        t0 = time.monotonic()
        while self.checks.zk_view() and time.monotonic() - t0 < o.convergence_bound_s + 30:
            time.sleep(0.2)
        problems = self.checks.zk_view()
        if problems:
            raise NotConverged(f"the cluster did not converge at start: {problems[:5]}\n{self._post_mortem()}")
        self.echo(f"{o.brokers} brokers, {o.tasks} tasks running after {time.monotonic() - t0:.1f}s; faults begin")
        return pipes

    def _await_convergence(self) -> tuple[float | None, list[str]]:
        """Once the faults are over, invariant 2 must hold continuously for ``hold_s``, starting within the
        convergence bound: how long after the last fault it began to (None: it did not), and what was wrong
        when last looked at."""
        o = self.copts
        t_end = time.monotonic()
        problems: list[str] = []
        ok_since: float | None = None
        while True:
            now = time.monotonic()
            try:
                problems = self.checks.zk_view()
            except Exception as exc:
                problems = [f"reading ZooKeeper: {type(exc).__name__}"]
            if problems:
                ok_since = None
            elif ok_since is None:
                ok_since = now
            if ok_since is not None and now - ok_since >= o.hold_s:
                return ok_since - t_end, problems
            if (ok_since or now) - t_end > o.convergence_bound_s:
                return None, problems
            time.sleep(0.2)

    def _optional_verdicts(self, intervals: list[RunInterval], v5: Verdict | None, since: float) -> list[Verdict]:
        """The verdicts that apply to this run only: halted brokers back (6), sinks (5), throttle (7),
        maintenance windows (8)."""
        o = self.copts
        out: list[Verdict] = []
        if self.halts:
            out.append(self.checks.halted_back())
        if v5 is not None:
            out.append(v5)
        if o.max_moves is not None or o.max_moves_per_broker is not None:
            out.append(verdicts.moves_within_throttle(intervals, since, o.max_moves, o.max_moves_per_broker))
        if self.maintenance_windows:
            out.append(verdicts.nothing_moves_in_maintenance(intervals, self.maintenance_windows))
        if self.quorum_returns:
            out.append(verdicts.tasks_back_after_quorum(self.quorum_returns, o.convergence_bound_s))
        return out

    # ---- streaming pipelines ----------------------------------------------------------------------
    def _create_pipelines(self) -> dict[str, tuple[Path, Path]]:
        o = self.copts
        if not o.pipelines:
            return {}
        base = Path(self.tmp.name) / "pipelines"
        pipes = {f"pipe-{i}": (base / f"in-{i}", base / f"out-{i}") for i in range(o.pipelines)}
        for src, _ in pipes.values():
            src.mkdir(parents=True, exist_ok=True)
        AdminClient(self.admin, self.layout).create_tasks(
            [pipeline_spec(t, src, out) for t, (src, out) in pipes.items()]
        )
        return pipes

    def _start_datagens(self, pipes: dict[str, tuple[Path, Path]]) -> dict[str, Any]:
        from broker_sim.sim.datagen import Datagen, DatagenConfig

        o = self.copts
        rate = max(1.0, o.records / max(1.0, 0.8 * o.duration_s))
        return {
            t: Datagen(DatagenConfig(out_dir=str(src), records=o.records, rate=rate, batch=50)).start()
            for t, (src, _) in pipes.items()
        }

    def close(self) -> None:
        self._sampling.set()
        if os.environ.get("ZKC_CHAOS_KEEP"):  # keep logs, journals and sinks for a post-mortem
            self.echo(f"work directory kept: {self.tmp.name}")
            self.tmp.cleanup = lambda: None  # type: ignore[method-assign]
            self.tmp._finalizer.detach()  # type: ignore[attr-defined]  # else it is removed at interpreter exit
        for proc in list(self.broker_procs.values()):
            proc.kill9()
        for proc in list(self.ctl_procs.values()):
            proc.terminate(10)
        for p in self.ctl_proxies.values():
            p.close()
        try:
            super().close()
        finally:
            self._close_ensemble()


def run_chaos(opts: ChaosOptions, echo: Callable[[str], None] = lambda s: None) -> ChaosSummary:
    bad = [k for k in opts.kinds if k not in FAULT_KINDS]
    if bad:
        raise ValueError(f"unknown fault kind(s) {bad}: choose from {', '.join(FAULT_KINDS)}")
    if opts.pipelines and not opts.process_brokers:
        raise ValueError("streaming pipelines run on the spark runner in broker processes: use process brokers")
    with ChaosRun(opts, echo) as run:
        echo(
            f"chaos seed {opts.seed}: {len(run.schedule)} faults over {opts.duration_s:.0f}s "
            f"({'process' if opts.process_brokers else 'in-process'} brokers, {opts.brokers} brokers, "
            f"{'an ensemble of ' + str(opts.ensemble) if opts.ensemble > 1 else 'one'} ZooKeeper server(s), "
            f"{opts.tasks} tasks, session {opts.session_timeout_s:g}s, rebalance timeout {opts.rebalance_timeout_s:g}s)"
        )
        return run.play()
