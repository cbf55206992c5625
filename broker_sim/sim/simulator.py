"""The broker simulator: N workers in one process (each with its own ZooKeeper session), a controller,
T no-op tasks, scripted scenarios and failure injection; every run records per-task ownership intervals
and ends with a summary computed by the independent checker.

Faults: kill (tasks end now, session closed at once), expire (the broker's network goes silent longer
than the session timeout, so the session expires naturally and the worker fences first), pause (the
worker's threads and its network freeze), partition (network silent for a while), controlled shutdown,
restart with the same id, kill the controller. With ``farms`` the brokers live in that many broker farm
processes (``broker_sim.sim.farm``), so that a hundred of them neither share the controller's interpreter nor
starve each other's heartbeats; the faults are then carried out inside the farms.
"""

from __future__ import annotations

import json
import logging
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Self

from broker_sim.runners.noop import NoopRunner
from broker_sim.sim.checker import close_open, double_ownership, downtime, moved_tasks
from broker_sim.sim.farm import Farm, FarmError, task_digest
from broker_sim.sim.netproxy import NetProxy
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import ensure_layout, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol import codecs
from controller.protocol.codecs import RunInterval
from controller.protocol.errors import ZkcError
from controller.protocol.group_types import GroupConfig
from controller.protocol.layout import ZkLayout
from controller.protocol.rules import COOPERATIVE, protocols_for
from controller.protocol.taskspec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import ZooKeeperServer, free_port

log = logging.getLogger(__name__)

SCENARIOS = (
    "steady",
    "rolling-bounce",
    "add-broker",
    "kill-broker",
    "expire-session",
    "pause-broker",
    "partition-broker",
    "controlled-shutdown",
    "kill-controller",
    "roll",
)


class NotConverged(ZkcError, RuntimeError):
    """The simulated cluster never reached its steady state: the run measured nothing."""


@dataclass(frozen=True)
class SimOptions:
    brokers: int = 3
    tasks: int = 30
    protocol: str = COOPERATIVE
    assignor: str = "cooperative-sticky"
    scenario: str = "steady"
    restart_gap_s: float = 1.0
    seed: int = 0
    start_latency_s: float = 0.0
    stop_latency_s: float = 0.0
    session_timeout_s: float = 6.0
    rebalance_timeout_s: float = 20.0
    scheduled_delay_s: float = 0.0
    static_membership: bool = False
    controlled_shutdown: bool = False
    zk_hosts: str | None = None
    root: str | None = None
    converge_timeout_s: float = 60.0
    use_proxies: bool = False
    intervals_out: str | None = None
    #: broker farm processes the brokers are spread over (0: every broker in this process)
    farms: int = 0
    #: seconds between a task's metric-only status writes (the no-op runner's uptime changes at every poll)
    metrics_interval_s: float = 5.0
    #: seconds the converged cluster runs before the scenario (its steps are measured from a steady cluster)
    settle_s: float = 0.0
    #: a one-step scenario's step taken this many times on the same cluster, each from where the one before
    #: started (an unmeasured step between puts it back: the broker added shut down, the broker killed or
    #: shut down started again, a new standby controller), each after ``settle_s``
    repeat: int = 1
    #: brokers down at a time in the ``roll`` scenario (the controller's planned roll)
    roll_batch: int = 1
    #: tasks in flight at once in the roll scenario (0: a step's moves all at once)
    roll_wave: int = 0

    def protocols(self) -> tuple[str, ...]:
        return protocols_for(self.protocol)


@dataclass
class StepResult:
    step: str
    broker: str
    started: float
    left_converged_s: float | None = None
    #: from the step to the instant the cluster converged (see ``Simulation.settled_at``)
    converged_s: float | None = None
    #: from the step to the poll that saw it converged
    detected_s: float | None = None
    #: False for a step that only puts the cluster back between repeats (not a figure of the scenario)
    measured: bool = True


@dataclass
class SimSummary:
    scenario: str
    protocol: str
    brokers: int
    tasks: int
    task_downtime_s: float
    double_ownership: int
    moved_tasks: int
    step_convergence_s: list[float]
    steps: list[dict[str, Any]]
    rebalances: int
    wall_s: float
    window_s: float
    overlaps: list[str] = field(default_factory=list)
    farms: int = 0
    halts: int = 0  # brokers that halted at their fence deadline (restarted, as a supervisor would)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Simulation:
    """One simulated cluster. Use as a context manager; ``run()`` plays the scenario."""

    def __init__(self, opts: SimOptions, echo: Callable[[str], None] = lambda s: None) -> None:
        #: every group coordinator seen (id -> it): a killed controller's count of rebalances is kept
        self.coordinators_seen: dict[int, Any] = {}
        self.opts = opts
        self.echo = echo
        self.rng = random.Random(opts.seed)
        self.server: ZooKeeperServer | None = None
        self.tmp = tempfile.TemporaryDirectory(prefix="zkc-sim-")
        self.root = opts.root or f"/sim-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
        self.layout = ZkLayout(self.root)
        self.workers: dict[str, Worker] = {}
        self.proxies: dict[str, NetProxy] = {}
        self.retired: list[Worker] = []
        self.controllers: list[Controller] = []
        self.intervals_done: list[RunInterval] = []
        self.hosts = ""
        self.steps: list[StepResult] = []
        self.farms: _Farms | None = None
        self._last_start: float | None = None  # (of the last poll that found every task running)
        self.roll_moves: int | None = None  # the roll scenario's planned moves, as the controller counted them
        self.halts: Counter[str] = Counter()  # brokers that halted at their fence deadline (and were restarted)

    # ---- setup ------------------------------------------------------------------------------------
    def __enter__(self) -> Self:
        if self.opts.zk_hosts is None:
            # a heap for the tasks' znodes, watches and sessions: at 10,000 tasks a 256 MB heap spends
            # seconds in full collections, during which no broker gets an answer and all of them fence
            self.server = ZooKeeperServer(
                data_dir=Path(self.tmp.name) / "zk",
                port=free_port(),
                tick_ms=200,
                max_session_timeout_ms=120_000,
                heap_mb=min(2048, 256 + self.opts.tasks // 16),
            )
            self.server.start()
            self.hosts = self.server.address
        else:
            self.hosts = self.opts.zk_hosts
        self.admin = make_client(self.settings())
        ensure_layout(self.admin, self.layout)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def settings(self, hosts: str | None = None) -> ZkSettings:
        return ZkSettings(hosts=hosts or self.hosts, root=self.root, session_timeout_s=self.opts.session_timeout_s)

    def create_tasks(self, n: int, prefix: str = "task") -> list[str]:
        ids = [f"{prefix}-{i:05d}" for i in range(n)]
        specs = [TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")).encode() for t in ids]
        for lo in range(0, n, 500):
            tx = self.admin.transaction()
            for t, data in zip(ids[lo : lo + 500], specs[lo : lo + 500]):
                tx.create(self.layout.task(t), data)
            tx.commit()
        self.task_ids = ids
        return ids

    def start_controller(self, cid: str = "ctl-0") -> Controller:
        cfg = ControllerConfig(
            cid,
            self.settings(),
            GroupConfig(
                rebalance_timeout_s=self.opts.rebalance_timeout_s,
                scheduled_rebalance_delay_s=self.opts.scheduled_delay_s,
                default_assignor=self.opts.assignor,
            ),
        )
        ctl = Controller(cfg).start()
        self.controllers.append(ctl)
        return ctl

    def broker_id(self, i: int) -> str:
        return f"broker-{i:03d}"

    def start_workers(self, ids: list[str]) -> None:
        if self.opts.farms:
            self.farms = _Farms(self, ids)
        else:
            for bid in ids:
                self.start_worker(bid)

    def start_worker(self, bid: str) -> Worker | None:
        if self.farms is not None:
            self.farms.start(bid)
            return None
        hosts = self.hosts
        if self.opts.use_proxies:
            host, port = self.hosts.split(",")[0].split(":")
            proxy = self.proxies.get(bid)
            if proxy is None:
                proxy = self.proxies[bid] = NetProxy(host, int(port), name=f"proxy-{bid}")
            proxy.heal()
            hosts = proxy.address
        cfg = WorkerConfig(
            broker_id=bid,
            settings=self.settings(hosts),
            protocols=self.opts.protocols(),
            assignors=(self.opts.assignor,),
            instance_id=bid if self.opts.static_membership else None,
            pool_size=8,
            status_interval_s=1.0,
            metrics_interval_s=self.opts.metrics_interval_s,
            intervals_flush_s=3600.0,
            on_halt="kill",
        )
        runner = NoopRunner(start_latency_s=self.opts.start_latency_s, stop_latency_s=self.opts.stop_latency_s)
        w = Worker(cfg, runner=runner).start()
        self.workers[bid] = w
        return w

    def close(self) -> None:
        # controllers first: a broker stopping must not make the others take its tasks in the teardown
        for c in self.controllers:
            try:
                c.stop()
            except Exception:
                pass
        if self.farms is not None:
            self.farms.close()
        for w in list(self.workers.values()):
            self._retire(w, graceful=True)
        for p in self.proxies.values():
            p.close()
        try:
            self.admin.stop()
            self.admin.close()
        except Exception:
            pass
        if self.server is not None:
            self.server.stop()
        self.tmp.cleanup()

    def _retire(self, w: Worker, graceful: bool) -> None:
        if graceful:
            try:
                w.stop()
            except Exception:
                log.exception("stopping %s", w.id)
        self.intervals_done += list(w.intervals)
        self.workers.pop(w.id, None)
        self.retired.append(w)

    # ---- observation ------------------------------------------------------------------------------
    def all_intervals(self) -> list[RunInterval]:
        now = time.time()
        out = list(self.intervals_done)
        if self.farms is not None:
            out += self.farms.intervals()
        for w in self.workers.values():
            out += list(w.intervals) + w.open_intervals()
        return close_open(out, now)

    def active_controller(self) -> Controller | None:
        return next((c for c in self.controllers if c.active and c.ctx is not None), None)

    def converged(self, expect_brokers: set[str] | None = None, balanced: bool = False) -> bool:
        """Every task runs on exactly one live worker and the group is Stable (``balanced``: and every broker
        runs as many tasks as any other, give or take one)."""
        if self.farms is not None:
            # the group first (in this process): asking every farm for a digest of what it runs costs the farms
            # CPU, which their brokers need while the group is still moving tasks; one answer per farm serves
            # both questions
            if not self._stable():
                return False
            counts, digest, last_start = self.farms.running()
            self._last_start = last_start
            return (
                sum(counts.values()) == len(self.task_ids)
                and digest == self.farms.expected_digest
                and (not balanced or _even(counts.values()))
                and self._stable()
            )
        self._restart_halted()
        running: dict[str, int] = {}
        for bid, w in self.workers.items():
            if expect_brokers is not None and bid not in expect_brokers:
                continue
            for t in w.running_tasks():
                running[t] = running.get(t, 0) + 1
        if len(running) != len(self.task_ids) or any(v != 1 for v in running.values()):
            return False
        self._last_start = max((s for w in self.workers.values() if (s := w.last_start()) is not None), default=None)
        return (not balanced or self.balanced()) and self._stable()

    def _restart_halted(self) -> None:
        """What a supervisor does for a deployed broker: one that halted at its fence deadline (an embedded
        worker kills itself) is started again under the same id."""
        for bid, w in list(self.workers.items()):
            if w.halted.is_set():
                self.halts[bid] += 1
                self.echo(f"  {bid} halted at its fence deadline ({w.watchdog.reason}); restarting it")
                self._retire(w, graceful=False)
                self.start_worker(bid)

    def _group(self) -> Any:
        ctl = self.active_controller()
        return ctl.ctx.groups.get("default") if ctl is not None and ctl.ctx else None

    def _stable(self) -> bool:
        coord = self._group()
        return coord is not None and coord.state.value == "Stable"

    def balanced(self) -> bool:
        if self.farms is not None:
            return _even(self.farms.running()[0].values())
        return _even([len(w.running_tasks()) for w in self.workers.values()])

    def wait_converged(self, timeout: float | None = None, balanced: bool = False) -> float | None:
        """Seconds until a poll saw the cluster converged (None: not within ``timeout``)."""
        t0 = time.monotonic()
        ok = wait_for(
            lambda: self.converged(balanced=balanced),
            timeout or self.opts.converge_timeout_s,
            0.05 if self.farms is not None else 0.02,
        )
        return time.monotonic() - t0 if ok else None

    def settled_at(self) -> float | None:
        """Wall time the cluster a poll just saw converged got there: the later of the start of the last task
        to start among those running and the group's entering Stable. A step's figure is measured to this
        instant, not to the poll that noticed it (a poll every 50 ms, each asking every farm, would add its own
        interval and cost to every figure)."""
        coord = self._group()
        marks = [m for m in (self._last_start, coord.state_since if coord is not None else None) if m is not None]
        return max(marks) if marks else None

    # ---- faults -----------------------------------------------------------------------------------
    def kill(self, bid: str) -> None:
        if self.farms is not None:
            self.farms.call(bid, "kill")
            return
        w = self.workers[bid]
        w.kill()
        self._retire(w, graceful=False)

    def leave(self, bid: str) -> None:
        """A clean stop: tasks stopped gracefully, session closed."""
        if self.farms is not None:
            self.farms.call(bid, "leave")
            return
        self._retire(self.workers[bid], graceful=True)

    def controlled_shutdown(self, bid: str, timeout: float = 60.0) -> bool:
        if self.farms is not None:
            return bool(self.farms.call(bid, "shutdown", timeout=timeout))
        w = self.workers[bid]
        w.request_shutdown()
        ok = w.exited.wait(timeout)
        self._retire(w, graceful=True)
        return ok

    def partition(self, bid: str, seconds: float) -> None:
        if self.farms is not None:
            self.farms.call(bid, "partition", seconds=seconds)
            return
        proxy = self.proxies[bid]
        proxy.partition()
        time.sleep(seconds)
        proxy.reset()
        proxy.heal()

    def pause(self, bid: str, seconds: float) -> None:
        """Freeze the worker's own threads and its network (no heartbeats), then resume."""
        if self.farms is not None:
            self.farms.call(bid, "pause", seconds=seconds)
            return
        w = self.workers[bid]
        w.frozen.set()
        proxy = self.proxies.get(bid)
        if proxy:
            proxy.partition()
        time.sleep(seconds)
        if proxy:
            proxy.reset()
            proxy.heal()
        w.frozen.clear()

    def expire(self, bid: str) -> None:
        """Silence the broker's network past the session timeout: the session expires naturally."""
        self.partition(bid, self.opts.session_timeout_s * 1.6)

    def kill_controller(self) -> Controller | None:
        ctl = self.active_controller()
        if ctl is not None:
            ctl.stop()
            self.controllers.remove(ctl)
        return ctl

    # ---- scenarios --------------------------------------------------------------------------------
    def run(self) -> SimSummary:
        o = self.opts
        wall0 = time.monotonic()
        self.create_tasks(o.tasks)
        self.start_controller("ctl-0")
        if o.scenario == "kill-controller":
            self.start_controller("ctl-1")
        self.start_workers([self.broker_id(i) for i in range(o.brokers)])
        took = self.wait_converged(balanced=True)
        if took is None:
            where = f"{o.farms} broker farm process(es)" if o.farms else "one process"
            raise NotConverged(
                f"the cluster of {o.brokers} brokers and {o.tasks} tasks did not converge within "
                f"{o.converge_timeout_s:g}s of starting ({where}; a machine too small for this many "
                "brokers fences them: try more --farms, fewer brokers or a longer --session-timeout)"
            )
        self.echo(
            f"{o.brokers} brokers, {o.tasks} tasks running ({o.protocol}"
            f"{f', {o.farms} farms' if o.farms else ''}) after {took:.2f}s"
        )
        if o.settle_s:
            time.sleep(o.settle_s)
            self.echo(f"  ran {o.settle_s:g}s to settle; the scenario starts")
        rebalances0 = self._rebalances()
        t_start = time.time()
        getattr(self, "_scenario_" + o.scenario.replace("-", "_"))()
        t_end = time.time()
        intervals = self.all_intervals()
        overlaps = double_ownership(intervals)
        down = downtime(intervals, self.task_ids, (t_start, t_end))
        summary = SimSummary(
            scenario=o.scenario,
            protocol=o.protocol,
            brokers=o.brokers,
            tasks=o.tasks,
            task_downtime_s=round(sum(down.values()), 3),
            double_ownership=len(overlaps),
            moved_tasks=moved_tasks(intervals, (t_start, t_end)),
            step_convergence_s=[
                round(s.converged_s, 3) for s in self.steps if s.converged_s is not None and s.measured
            ],
            steps=[asdict(s) for s in self.steps],
            rebalances=self._rebalances() - rebalances0,
            wall_s=round(time.monotonic() - wall0, 3),
            window_s=round(t_end - t_start, 3),
            overlaps=[str(x) for x in overlaps[:10]],
            farms=o.farms,
            halts=sum(self.halts.values()),
        )
        if o.intervals_out:
            Path(o.intervals_out).write_text(json.dumps([codecs.to_jsonable(i) for i in intervals]))
        return summary

    def _rebalances(self) -> int:
        """Rebalances counted by every group coordinator seen so far: a controller killed or resigned keeps
        the count it had (its context is gone; the new controller's coordinator counts from zero)."""
        seen = self.coordinators_seen
        for c in self.controllers:
            if c.ctx is not None and "default" in c.ctx.groups:
                coord = c.ctx.groups["default"]
                seen[id(coord)] = coord  # (kept alive here, so its id is never reused)
        return sum(coord.rebalances for coord in seen.values())

    def _step(
        self,
        name: str,
        bid: str,
        action: Callable[[], object],
        gap: float = 0.0,
        back: Callable[[], object] | None = None,
        measured: bool = True,
    ) -> StepResult:
        step = StepResult(name, bid, time.time(), measured=measured)
        t0 = time.monotonic()
        action()
        if gap:
            time.sleep(gap)
        if back is not None:
            back()
        took = self.wait_converged(balanced=True)
        if took is not None:
            step.detected_s = round(time.monotonic() - t0, 3)
            settled = self.settled_at()
            step.converged_s = (
                step.detected_s if settled is None else round(min(max(0.0, settled - step.started), step.detected_s), 3)
            )
        self.steps.append(step)
        self.echo(
            f"  {name} {bid}: converged in {step.converged_s}s"
            + (f" (seen by a poll at {step.detected_s}s)" if step.detected_s is not None else "")
        )
        return step

    def _scenario_steady(self) -> None:
        time.sleep(1.0)

    def _scenario_rolling_bounce(self) -> None:
        o = self.opts
        for i in range(o.brokers):
            bid = self.broker_id(i)
            leave = partial(self.controlled_shutdown, bid) if o.controlled_shutdown else partial(self.leave, bid)
            self._step("bounce", bid, leave, gap=o.restart_gap_s, back=partial(self.start_worker, bid))

    def _repeated(self, step: Callable[[int], object], restore: Callable[[int], object] | None = None) -> None:
        """A one-step scenario, ``repeat`` times: between two, ``restore`` puts the cluster back (unmeasured)
        and it settles again."""
        for i in range(self.opts.repeat):
            if i:
                if restore is not None:
                    restore(i - 1)
                if self.opts.settle_s:
                    time.sleep(self.opts.settle_s)
            step(i)

    def _scenario_roll(self) -> None:
        """The controller's planned roll (``zkctl broker roll``); the harness is the brokers' supervisor: a
        broker that exits (its controlled shutdown done) is started again under the same id after the gap."""
        from controller.admin import AdminClient

        o = self.opts
        if self.farms is not None:
            raise ValueError("the roll scenario runs its brokers in this process (no --farms)")
        admin = AdminClient(self.admin, self.layout)
        whole = StepResult("roll", "all", time.time(), measured=False)  # (starts the window: the first moves)
        self.steps.append(whole)
        admin.roll("default", batch=o.roll_batch, timeout_s=max(30.0, o.converge_timeout_s), wave=o.roll_wave)
        deadline = time.monotonic() + o.converge_timeout_s * (o.brokers + 2)
        st = admin.roll_status()
        while time.monotonic() < deadline and st is not None and st.phase not in ("done", "paused"):
            for bid, w in list(self.workers.items()):
                if w.exited.is_set():
                    step = StepResult("roll", bid, time.time(), measured=False)
                    self._retire(w, graceful=True)
                    if o.restart_gap_s:
                        time.sleep(o.restart_gap_s)
                    self.start_worker(bid)
                    self.steps.append(step)
                    self.echo(f"  roll: {bid} exited after its tasks moved; started again")
            time.sleep(0.05)
            st = admin.roll_status()
        if st is None or st.phase != "done":
            raise NotConverged(f"the roll did not finish: {st.phase + ': ' + st.reason if st else 'no roll'}")
        self.roll_moves = st.moves
        took = self.wait_converged(balanced=True)
        for step in self.steps:
            step.converged_s = step.detected_s = None if took is None else round(time.time() - step.started, 3)
        self.echo(f"  roll done: {st.moves} task moves planned")

    def _scenario_add_broker(self) -> None:
        def new(i: int) -> str:
            return self.broker_id(self.opts.brokers + i)

        self._repeated(
            lambda i: self._step("add", new(i), lambda: self.start_worker(new(i))),
            lambda i: self._step("restore", new(i), lambda: self.controlled_shutdown(new(i)), measured=False),
        )

    def _victims(self) -> list[str]:
        """The brokers the repeats of a one-step scenario hit, drawn from the seed."""
        return [self.broker_id(self.rng.randrange(self.opts.brokers)) for _ in range(self.opts.repeat)]

    def _scenario_kill_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step("kill", victims[i], lambda: self.kill(victims[i])),
            lambda i: self._step("restore", victims[i], lambda: self.start_worker(victims[i]), measured=False),
        )

    def _scenario_controlled_shutdown(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step("controlled-shutdown", victims[i], lambda: self.controlled_shutdown(victims[i])),
            lambda i: self._step("restore", victims[i], lambda: self.start_worker(victims[i]), measured=False),
        )

    def _scenario_kill_controller(self) -> None:
        def standby(i: int) -> None:
            self.start_controller(f"ctl-{i + 2}")  # the next standby (ctl-0 ran first, ctl-1 stood by)

        self._repeated(
            lambda i: self._step("kill-controller", self._active_id(), lambda: self.kill_controller()), standby
        )

    def _active_id(self) -> str:
        ctl = self.active_controller()
        return ctl.config.controller_id if ctl is not None else "-"

    def _scenario_expire_session(self) -> None:
        victims = self._victims()
        self._repeated(lambda i: self._step("expire", victims[i], lambda: self.expire(victims[i])))

    def _scenario_pause_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step("pause", victims[i], lambda: self.pause(victims[i], self.opts.session_timeout_s * 1.6))
        )

    def _scenario_partition_broker(self) -> None:
        victims = self._victims()
        self._repeated(
            lambda i: self._step(
                "partition", victims[i], lambda: self.partition(victims[i], self.opts.session_timeout_s * 0.5)
            )
        )


def _even(counts: Any) -> bool:
    counts = list(counts)
    return bool(counts) and max(counts) - min(counts) <= 1


class _Farms:
    """The simulation's brokers spread over broker farm processes: broker ``i`` lives in farm ``i % n``."""

    def __init__(self, sim: Simulation, ids: list[str]) -> None:
        o = sim.opts
        self.sim = sim
        self.expected_digest = task_digest(sim.task_ids)
        self.home: dict[str, Farm] = {}
        self.farms: list[Farm] = []
        self.pool = ThreadPoolExecutor(max_workers=max(1, o.farms), thread_name_prefix="sim-farm-poll")
        proxies = o.use_proxies or o.scenario in ("expire-session", "pause-broker", "partition-broker")
        logs = Path(sim.tmp.name)
        try:
            for k in range(o.farms):
                mine = ids[k :: o.farms]
                self.farms.append(
                    Farm(
                        sim.hosts,
                        sim.root,
                        ids=mine,
                        session_timeout=o.session_timeout_s,
                        protocol=o.protocol,
                        assignor=o.assignor,
                        start_latency=o.start_latency_s,
                        stop_latency=o.stop_latency_s,
                        static=o.static_membership,
                        proxies=proxies,
                        metrics_interval=o.metrics_interval_s,
                        log_path=logs / f"farm-{k}.log",
                        wait_ready=False,
                    )
                )
                for bid in mine:
                    self.home[bid] = self.farms[-1]
            for f in self.farms:
                f.wait_ready()
        except FarmError as exc:
            self.close()
            raise NotConverged(f"a broker farm did not start: {exc}") from None

    def _farm(self, bid: str) -> Farm:
        if bid not in self.home:  # a new broker: the next farm in turn
            index = int(bid.rsplit("-", 1)[1]) if bid.rsplit("-", 1)[-1].isdigit() else len(self.home)
            self.home[bid] = self.farms[index % len(self.farms)]
        return self.home[bid]

    def start(self, bid: str) -> None:
        self._farm(bid).call("start", id=bid)

    def call(self, bid: str, cmd: str, timeout: float | None = None, seconds: float | None = None) -> Any:
        kw: dict[str, Any] = {"id": bid}
        if timeout is not None:
            kw["within"] = timeout
        if seconds is not None:
            kw["seconds"] = seconds
        wait = (timeout or 0.0) + (seconds or 0.0) + 120.0
        return self._farm(bid).call(cmd, timeout=wait, **kw).get("ok")

    def running(self) -> tuple[dict[str, int], int, float | None]:
        """Tasks running per broker, a digest of which, and when the last of them started: every farm is
        asked at once (one after the other, a poll took four farms' answers end to end)."""
        counts: dict[str, int] = {}
        digest = 0
        starts: list[float] = []
        for r in self.pool.map(lambda f: f.call("running"), self.farms):
            counts.update(r["counts"])
            if r.get("last_start") is not None:
                starts.append(r["last_start"])
            digest = (digest + r["digest"]) % (1 << 64)
            for bid, n in r["halts"].items():
                if n > self.sim.halts[bid]:
                    self.sim.echo(f"  {bid} halted at its fence deadline; its farm restarted it")
                    self.sim.halts[bid] = n
        return counts, digest, max(starts, default=None)

    def intervals(self) -> list[RunInterval]:
        out: list[RunInterval] = []
        for f in self.farms:
            out += [RunInterval(**i) for i in f.call("intervals", timeout=300.0)["intervals"]]
        return out

    def close(self) -> None:
        for f in self.farms:
            f.close()
        self.pool.shutdown(wait=False)


def run_simulation(opts: SimOptions, echo: Callable[[str], None] = lambda s: None) -> SimSummary:
    if opts.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {opts.scenario!r}: choose one of {', '.join(SCENARIOS)}")
    if opts.scenario in ("expire-session", "pause-broker", "partition-broker") and not opts.use_proxies:
        opts = SimOptions(**{**asdict(opts), "use_proxies": True})
    with Simulation(opts, echo) as sim:
        return sim.run()


def format_summary(s: SimSummary) -> str:
    lines = [
        f"scenario {s.scenario} · {s.protocol} · {s.brokers} brokers · {s.tasks} tasks",
        f"  task downtime      {s.task_downtime_s:.2f} task-seconds (over a {s.window_s:.1f}s window)",
        f"  double ownership   {s.double_ownership}",
        f"  moved tasks        {s.moved_tasks}",
        f"  rebalances         {s.rebalances}",
        f"  step convergence   {', '.join(f'{x:.2f}s' for x in s.step_convergence_s) or '-'}"
        + (f" (median {statistics.median(s.step_convergence_s):.2f}s)" if len(s.step_convergence_s) > 1 else ""),
    ]
    if s.farms:
        lines[0] += f" · {s.farms} broker farm processes"
    if s.halts:
        lines.append(f"  halted brokers     {s.halts} (restarted; the machine could not keep their sessions)")
    lines += [f"  OVERLAP {o}" for o in s.overlaps]
    return "\n".join(lines)
