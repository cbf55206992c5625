"""The broker simulator: N workers in one process (each with its own ZooKeeper session), a controller,
T no-op tasks, scripted scenarios and failure injection; every run records per-task ownership intervals
and ends with a summary computed by the independent checker.

Faults: kill (tasks end now, session closed at once), expire (the broker's network goes silent longer
than the session timeout, so the session expires naturally and the worker fences first), pause (the
worker's threads and its network freeze), partition (network silent for a while), controlled shutdown,
restart with the same id, kill the controller. With ``farms`` the brokers live in that many broker farm
processes (``farm_brokers``); the faults are then carried out inside the farms. The scenarios that script
these are ``scenarios``; the options and results, ``simulation_types``.
"""

from __future__ import annotations

import logging
import os
import random
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

from broker_sim.runners.noop import NoopRunner
from broker_sim.sim.checker import close_open
from broker_sim.sim.farm_brokers import FarmBrokers
from broker_sim.sim.netproxy import NetProxy
from broker_sim.sim.scenarios import Scenarios
from broker_sim.sim.simulation_types import SCENARIOS, SimOptions, SimSummary, StepResult
from broker_sim.worker import Worker, WorkerConfig
from controller.admin import ensure_layout, wait_for
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.group.vocabulary import GroupConfig
from controller.protocol.records.task_records import RunInterval
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import ZooKeeperServer, free_port

log = logging.getLogger(__name__)


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
        #: each in-process worker's pause (given to it when built): set, its threads make no progress
        self.pauses: dict[str, threading.Event] = {}
        self.proxies: dict[str, NetProxy] = {}
        self.retired: list[Worker] = []
        self.controllers: list[Controller] = []
        self.intervals_done: list[RunInterval] = []
        self.hosts = ""
        self.steps: list[StepResult] = []
        self.farms: FarmBrokers | None = None
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
                load_window_s=self.opts.load_window_s,
                load_check_s=max(0.5, min(10.0, self.opts.load_window_s / 6)),
            ),
        )
        ctl = Controller(cfg).start()
        self.controllers.append(ctl)
        return ctl

    def broker_id(self, i: int) -> str:
        return f"broker-{i:03d}"

    def start_workers(self, ids: list[str]) -> None:
        if self.opts.farms:
            self.farms = FarmBrokers(
                self.opts, self.hosts, self.root, self.task_ids, ids, Path(self.tmp.name), self.halts, self.echo
            )
        else:
            for bid in ids:
                self.start_worker(bid)

    def start_worker(self, bid: str) -> Worker | None:
        if self.farms is not None:
            self.farms.start(bid)
            return None
        hosts = self.hosts
        if self.opts.use_proxies:
            proxy = self.proxies.get(bid)
            if proxy is None:
                proxy = self.proxies[bid] = NetProxy.for_hosts(self.hosts, name=f"proxy-{bid}")
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
            load_interval_s=self.opts.load_interval_s,
            intervals_flush_s=3600.0,
            on_halt="kill",
        )
        runner = NoopRunner(
            start_latency_s=self.opts.start_latency_s,
            stop_latency_s=self.opts.stop_latency_s,
            prepare_share=self.opts.prepare_share,
        )
        self.pauses[bid] = threading.Event()
        w = Worker(cfg, runner=runner, pause=self.pauses[bid]).start()
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
            self.retire(w, graceful=True)
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

    def retire(self, w: Worker, graceful: bool) -> None:
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
                self.retire(w, graceful=False)
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
        marks = [m for m in (self._last_start, coord.machine.since if coord is not None else None) if m is not None]
        return max(marks) if marks else None

    # ---- faults -----------------------------------------------------------------------------------
    def kill(self, bid: str) -> None:
        if self.farms is not None:
            self.farms.call(bid, "kill")
            return
        w = self.workers[bid]
        w.kill()
        self.retire(w, graceful=False)

    def leave(self, bid: str) -> None:
        """A clean stop: tasks stopped gracefully, session closed."""
        if self.farms is not None:
            self.farms.call(bid, "leave")
            return
        self.retire(self.workers[bid], graceful=True)

    def controlled_shutdown(self, bid: str, timeout: float = 60.0) -> bool:
        if self.farms is not None:
            return bool(self.farms.call(bid, "shutdown", timeout=timeout))
        w = self.workers[bid]
        w.request_shutdown()
        ok = w.exited.wait(timeout)
        self.retire(w, graceful=True)
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
        pause = self.pauses[bid]
        pause.set()
        proxy = self.proxies.get(bid)
        if proxy:
            proxy.partition()
        time.sleep(seconds)
        if proxy:
            proxy.reset()
            proxy.heal()
        pause.clear()

    def expire(self, bid: str) -> None:
        """Silence the broker's network past the session timeout: the session expires naturally."""
        self.partition(bid, self.opts.session_timeout_s * 1.6)

    def kill_controller(self) -> Controller | None:
        ctl = self.active_controller()
        if ctl is not None:
            ctl.stop()
            self.controllers.remove(ctl)
        return ctl

    def run(self) -> SimSummary:
        """Play the options' scenario on this cluster (``scenarios``) and summarise it."""
        return Scenarios(self).run()


def _even(counts: Any) -> bool:
    counts = list(counts)
    return bool(counts) and max(counts) - min(counts) <= 1


def run_simulation(opts: SimOptions, echo: Callable[[str], None] = lambda s: None) -> SimSummary:
    if opts.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {opts.scenario!r}: choose one of {', '.join(SCENARIOS)}")
    if opts.scenario in ("expire-session", "pause-broker", "partition-broker") and not opts.use_proxies:
        opts = SimOptions(**{**asdict(opts), "use_proxies": True})
    with Simulation(opts, echo) as sim:
        return sim.run()
