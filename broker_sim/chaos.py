"""Chaos runs: a seeded schedule of faults against a live cluster, then an independent verdict.

``make_schedule(opts)`` turns a seed into a fault schedule (same seed and options, same schedule; it is
printed before the run starts). :class:`ChaosRun` plays it against N brokers, two or more controller
candidates and an embedded ZooKeeper of its own, samples ``/controller_epoch`` and
``/groups/<g>/state`` all along, and once the last fault is over checks four invariants:

1. no task ever had two running owners (the checker's interval overlap, see ``broker_sim.checker``);
2. within ``convergence_bound_s`` of the last fault, every RUNNING task runs on exactly one live broker,
   as ZooKeeper shows it (owner znode held by a live broker's session, status RUNNING by that broker,
   no deletion pending) and, for in-process brokers, as the workers themselves show it — and it stays
   so for a hold period;
3. the controller epoch and every group generation never go down (over all samples);
4. once the faults stop, no group stays out of Stable at one generation longer than the rebalance
   timeout plus the scheduled rebalance delay (plus the sampling slack), and the group ends Stable.

Faults (``FAULT_KINDS``): broker kill (kill -9 of a process broker; an in-process kill closes the
session at once), session expiry (the broker's network silent past the session timeout, via its
``NetProxy``), broker freeze (SIGSTOP/SIGCONT; in process: threads and network frozen), short network
partition, controller kill (kill -9 / stop) and freeze (SIGSTOP; in process: a ``before_write`` stall
with the controller's network silenced), ZooKeeper stop/start (the run's own server: SIGKILL, then a
restart on the same data), rolling bounce (every broker in turn: controlled shutdown or a plain stop,
then back), task create/delete storms (through the admin client, as an operator would).

Process brokers run ``python -m broker_sim.chaos broker``: the same :class:`~broker_sim.worker.Worker`
as ``zkctl broker run --runner noop``, whose runner also appends every start and stop to a journal file
(one line each, written before a start and after a stop), so that the run windows of a process that was
killed -9 are known exactly. Process controllers are real ``zkctl controller run`` processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from broker_sim.checker import close_open, double_ownership
from broker_sim.netproxy import NetProxy
from broker_sim.runners.base import RunStatus, TaskRunner
from broker_sim.runners.noop import NoopRunner
from broker_sim.sim import SimOptions, Simulation
from controller import codecs
from controller.admin import AdminClient, AdminError
from controller.codecs import GroupStateInfo, OwnerInfo, PayloadError, RunInterval, TaskStatus
from controller.daemon import Controller, ControllerConfig
from controller.group import GroupConfig
from controller.taskspec import TaskSpec, decode_task
from controller.zkclient import ZkSettings, make_client
from controller.zkio import children_many, exists_many, get_many

log = logging.getLogger(__name__)

FAULT_KINDS = ("kill-broker", "expire-broker", "freeze-broker", "partition-broker", "kill-controller",
               "freeze-controller", "zk-restart", "rolling-bounce", "task-storm")
_WEIGHTS = {"kill-broker": 3, "expire-broker": 2, "freeze-broker": 2, "partition-broker": 2, "kill-controller": 2,
            "freeze-controller": 2, "zk-restart": 1, "rolling-bounce": 1, "task-storm": 2}
EXCLUSIVE = ("zk-restart", "rolling-bounce")  # nothing else starts or ends while these run
GROUP = "default"


@dataclass(frozen=True)
class ChaosOptions:
    seed: int = 0
    duration_s: float = 60.0           # faults start within this many seconds
    brokers: int = 4
    tasks: int = 40
    controllers: int = 2
    process_brokers: bool = False      # brokers and controllers as processes (kill -9, SIGSTOP are real)
    session_timeout_s: float = 4.0
    rebalance_timeout_s: float = 8.0
    scheduled_delay_s: float = 0.0
    mean_gap_s: float = 2.5            # mean time between fault starts (exponential)
    kinds: tuple[str, ...] = FAULT_KINDS
    zk_hosts: str | None = None        # an external ZooKeeper (then no zk-restart faults)
    root: str | None = None
    hold_s: float = 3.0                # invariant 2 must hold for this long once reached
    sample_interval_s: float = 0.2
    intervals_out: str | None = None
    pipelines: int = 0                 # streaming file pipelines on the spark runner (process brokers only)
    records: int = 3000                # records the data generator writes per pipeline while faults run
    spark_master: str = "local[1]"
    sink_timeout_s: float = 300.0      # after the faults, how long the sinks may take to catch up

    @property
    def convergence_bound_s(self) -> float:
        """Invariant 2's bound, from the end of the last fault: a silently dead broker's session expires
        (session timeout), a join phase waits out a missing member and a cooperative follow-up rebalance
        runs (2 x rebalance timeout), the scheduled delay, and 10 s for restarts, reconnects and the
        status interval; 30 s more with Spark pipelines (a restarted broker starts a JVM)."""
        spark = 30.0 if self.pipelines else 0.0  # a restarted Spark broker starts its JVM and queries
        return self.session_timeout_s + 2 * self.rebalance_timeout_s + self.scheduled_delay_s + 10.0 + spark

    @property
    def stable_bound_s(self) -> float:
        """Invariant 4's bound: one phase of a rebalance at one generation, plus the delay, plus slack for
        sampling and one round trip (2 s)."""
        return self.rebalance_timeout_s + self.scheduled_delay_s + 2.0


@dataclass(frozen=True)
class Fault:
    at: float          # seconds after the fault phase began
    kind: str
    target: str        # a broker id, "active" (the active controller), "zookeeper", "tasks", "all"
    duration: float    # how long the fault lasts (the thing is back / healed after it)
    create: int = 0    # task-storm: tasks created
    delete: tuple[str, ...] = ()  # task-storm: tasks whose deletion is requested
    controlled: bool = False       # rolling-bounce: controlled shutdowns instead of plain stops
    prefix: str = ""               # task-storm: ids of the created tasks are <prefix>-00000...

    def describe(self) -> str:
        extra = ""
        if self.kind == "task-storm":
            extra = f" create {self.create}, delete {len(self.delete)}"
        elif self.kind == "rolling-bounce":
            extra = " (controlled shutdown)" if self.controlled else " (plain stop)"
        return f"t+{self.at:7.2f}s  {self.kind:<17} {self.target:<11} for {self.duration:5.2f}s{extra}"


def make_schedule(opts: ChaosOptions) -> list[Fault]:
    """The fault schedule of ``opts.seed``: a pure function of the options (no clock, no I/O)."""
    rng = random.Random(opts.seed)
    s = opts.session_timeout_s
    kinds = [k for k in opts.kinds if k in FAULT_KINDS and not (k == "zk-restart" and opts.zk_hosts)]
    if not kinds:
        return []
    weights = [_WEIGHTS[k] for k in kinds]
    brokers = [broker_id(i) for i in range(opts.brokers)]
    tasks = [task_id("task", i) for i in range(opts.tasks)]
    busy: dict[str, float] = {}       # target -> free again at
    exclusive_until = 0.0
    faults: list[Fault] = []
    storms = 0
    t = rng.uniform(0.5, opts.mean_gap_s)
    for _ in range(10_000):  # bounded
        if t >= opts.duration_s:
            break
        kind = rng.choices(kinds, weights)[0]
        t = max(t, exclusive_until)
        if t >= opts.duration_s:
            break
        fault: Fault | None = None
        if kind in ("kill-broker", "expire-broker", "freeze-broker", "partition-broker"):
            free = [b for b in brokers if busy.get(b, 0.0) <= t]
            # keep at least one broker untouched so the cluster can make progress
            if len(free) > 1 or (free and len(brokers) == 1):
                target = rng.choice(free)
                duration = {
                    "kill-broker": rng.uniform(0.5, 2.0) * s,
                    "expire-broker": 1.6 * s,
                    # a process frozen past its session cannot fence itself (nothing in it runs): see the docs
                    "freeze-broker": rng.uniform(0.2, 0.6) * s if opts.process_brokers else rng.uniform(0.3, 1.8) * s,
                    "partition-broker": rng.uniform(0.2, 0.8) * s,
                }[kind]
                fault = Fault(round(t, 3), kind, target, round(duration, 3))
                busy[target] = t + duration + 1.0
        elif kind in ("kill-controller", "freeze-controller"):
            if busy.get("controller", 0.0) <= t:
                duration = rng.uniform(0.5, 2.0) * s if kind == "kill-controller" else rng.uniform(0.3, 2.0) * s
                fault = Fault(round(t, 3), kind, "active", round(duration, 3))
                busy["controller"] = t + duration + 1.0
        elif kind == "zk-restart":
            if all(v <= t for v in busy.values()):
                duration = rng.uniform(0.3, 1.5) * s
                fault = Fault(round(t, 3), kind, "zookeeper", round(duration, 3))
                exclusive_until = t + duration + s
        elif kind == "rolling-bounce":
            per = 1.0 + 2 * s  # away 1 s, then time to rejoin before the next one goes
            duration = per * len(brokers)
            if all(v <= t for v in busy.values()) and t + duration <= opts.duration_s + per:
                fault = Fault(round(t, 3), kind, "all", round(duration, 3), controlled=rng.random() < 0.5)
                exclusive_until = t + duration + 1.0
        elif kind == "task-storm":
            n = max(1, rng.randint(max(1, opts.tasks // 4), max(1, opts.tasks // 2)))
            created = [task_id(f"storm{storms}", i) for i in range(n)]
            doomed = tuple(sorted(rng.sample(sorted(tasks), min(len(tasks) // 3, max(1, n // 2))))) if tasks else ()
            tasks = sorted((set(tasks) - set(doomed)) | set(created))
            storms += 1
            fault = Fault(round(t, 3), kind, "tasks", 0.0, create=n, delete=doomed, prefix=f"storm{storms - 1}")
        if fault is not None:
            faults.append(fault)
        t += rng.expovariate(1.0 / opts.mean_gap_s)
    return faults


def broker_id(i: int) -> str:
    return f"broker-{i:03d}"


def task_id(prefix: str, i: int) -> str:
    return f"{prefix}-{i:05d}"


# --------------------------------------------------------------------------------------------------
# process brokers: the real Worker with a journaling no-op runner
# --------------------------------------------------------------------------------------------------


class JournalRunner(TaskRunner):
    """A no-op runner that appends ``start`` (before starting) and ``stop`` (after stopping) lines to a
    journal, so the run windows of a process killed -9 are known: a start with no stop ran until the
    process died."""

    def __init__(self, path: str | Path, inner: TaskRunner | None = None) -> None:
        self.inner = inner or NoopRunner()
        self.name = self.inner.name
        self.stop_budget_s = self.inner.stop_budget_s
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def _note(self, event: str, task: str) -> None:
        with self._lock:
            self._f.write(json.dumps({"e": event, "t": task, "ts": time.time(), "pid": os.getpid()}) + "\n")

    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        self._note("start", task_id)
        try:
            self.inner.start(task_id, spec, generation)
        except BaseException:
            self._note("stop", task_id)
            raise

    def stop(self, task_id: str, timeout: float = 60.0) -> None:
        running = task_id in self.inner.running()
        self.inner.stop(task_id, timeout)
        if running:
            self._note("stop", task_id)

    def status(self, task_id: str) -> RunStatus:
        return self.inner.status(task_id)

    def running(self) -> set[str]:
        return self.inner.running()

    def close(self) -> None:
        for t in sorted(self.inner.running()):
            self.stop(t)
        self.inner.close()
        with self._lock:
            self._f.close()


def read_journal(path: Path, broker: str, died_at: float | None) -> list[RunInterval]:
    """Run intervals from a journal; a start with no stop ends at ``died_at`` (or stays open)."""
    out: list[RunInterval] = []
    open_: dict[str, float] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by kill -9
        if rec["e"] == "start":
            open_[rec["t"]] = rec["ts"]
        elif rec["e"] == "stop" and rec["t"] in open_:
            start = open_.pop(rec["t"])
            out.append(RunInterval(task_id=rec["t"], broker=broker, start=start, end=rec["ts"],
                                   acquired=start, released=rec["ts"]))
    for t, start in open_.items():
        out.append(RunInterval(task_id=t, broker=broker, start=start, end=died_at, acquired=start, released=died_at))
    return out


def _broker_main(argv: list[str]) -> int:
    from broker_sim.worker import Worker, WorkerConfig, install_signal_handlers
    from controller.protocol import COOPERATIVE, EAGER
    from controller.zkclient import settings_from_env

    p = argparse.ArgumentParser(prog="python -m broker_sim.chaos broker")
    p.add_argument("--id", required=True)
    p.add_argument("--zk", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--session-timeout", type=float, default=4.0)
    p.add_argument("--journal", required=True)
    p.add_argument("--runner", choices=("noop", "spark"), default="noop")
    p.add_argument("--spark-master", default="local[1]")
    p.add_argument("--checkpoint-root", default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    settings = settings_from_env(hosts=a.zk, root=a.root, session_timeout_s=a.session_timeout)
    config = WorkerConfig(broker_id=a.id, settings=settings, protocols=(COOPERATIVE, EAGER), status_interval_s=0.5,
                          intervals_flush_s=2.0)
    inner: TaskRunner | None = None
    if a.runner == "spark":
        from broker_sim.runners.spark import SparkRunner

        inner = SparkRunner(spark_master=a.spark_master, checkpoint_root=a.checkpoint_root,
                            spark_conf={"spark.driver.memory": "512m", "spark.sql.shuffle.partitions": "1",
                                        "spark.ui.enabled": "false",
                                        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"})
    worker = Worker(config, runner=JournalRunner(a.journal, inner))
    stop_now = threading.Event()
    install_signal_handlers(worker, stop_now.set)
    worker.start()
    try:
        while not (worker.exited.is_set() or stop_now.wait(0.1)):
            pass
    finally:
        worker.stop()
    return 0


# --------------------------------------------------------------------------------------------------
# streaming file pipelines: what a sink holds, read the way Spark reads it
# --------------------------------------------------------------------------------------------------


def committed_files(sink: Path) -> list[Path]:
    """The data files a Spark file sink has committed, from its ``_spark_metadata`` log (the latest
    ``N.compact`` file holds every entry up to batch N; later batches follow in files named by batch id).
    Files a killed writer left behind without a commit are not in the log, so they do not count."""
    log_dir = sink / "_spark_metadata"
    if not log_dir.is_dir():
        return []
    batches: dict[int, Path] = {}
    compacts: dict[int, Path] = {}
    for f in log_dir.iterdir():
        name = f.name
        if name.startswith("."):
            continue
        if name.endswith(".compact") and name[:-8].isdigit():
            compacts[int(name[:-8])] = f
        elif name.isdigit():
            batches[int(name)] = f
    start = max(compacts, default=-1)
    files = ([compacts[start]] if start >= 0 else []) + [batches[b] for b in sorted(batches) if b > start]
    live: dict[str, None] = {}
    for f in files:
        for line in f.read_text().splitlines()[1:]:  # the first line is the log's version ("v1")
            if not line.strip():
                continue
            entry = json.loads(line)
            path = entry["path"]
            if entry.get("action", "add") == "delete":
                live.pop(path, None)
            else:
                live[path] = None
    out = []
    for uri in live:
        local = uri[len("file:"):] if uri.startswith("file:") else uri
        while local.startswith("//"):
            local = local[1:]
        out.append(Path(local))
    return out


def sink_ids(sink: Path) -> list[int]:
    """Every ``id`` in the committed parquet files of a sink (duplicates kept: that is the point)."""
    import pyarrow.parquet as pq

    ids: list[int] = []
    for f in committed_files(sink):
        ids += pq.read_table(str(f), columns=["id"]).column("id").to_pylist()
    return ids


def pipeline_spec(task: str, src: Path, out: Path) -> TaskSpec:
    from broker_sim.datagen import SCHEMA_DDL
    from controller.taskspec import parse_spec

    return parse_spec({"id": task, "pipeline": {
        "kind": "spark", "mode": "streaming", "trigger": {"processing_time": "1 second"},
        "source": {"type": "files", "format": "json", "path": str(src), "schema": SCHEMA_DDL, "max_files_per_trigger": 10},
        "transform": {"sql": "SELECT id, key, value FROM input"},
        "sink": {"type": "files", "format": "parquet", "path": str(out)}}})


# --------------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float
    epoch: int | None
    state: str | None
    generation: int | None


@dataclass
class Verdict:
    invariant: int
    name: str
    ok: bool
    details: list[str] = field(default_factory=list)


@dataclass
class ChaosSummary:
    seed: int
    process_brokers: bool
    brokers: int
    tasks_initial: int
    tasks_final: int
    duration_s: float
    schedule: list[str]
    faults_injected: dict[str, int]
    faults_failed: list[str]
    rebalances: int
    controller_epochs: list[int]
    converge_s: float | None
    convergence_bound_s: float
    longest_unstable_s: float
    stable_bound_s: float
    intervals: int
    samples: int
    verdicts: list[Verdict]
    wall_s: float
    pipelines: dict[str, dict[str, int]] = field(default_factory=dict)  # per pipeline: expected, held, duplicates, missing

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


class _Proc:
    """A child process we started (stopped by its pid only)."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name  # the child leads its own process group: signals reach it and what it started (a JVM)
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, env=env)
        self.frozen = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill9(self) -> float:
        if self.frozen:
            self.signal(signal.SIGCONT)
            self.frozen = False
        self.signal(signal.SIGKILL)
        self.popen.wait(10)
        return time.time()

    def reap_group(self) -> None:
        """After the leader exited: SIGKILL whatever is left of its process group (a JVM it started)."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self, timeout: float) -> bool:
        """SIGTERM (a broker's controlled shutdown, a controller's stop); SIGKILL if not gone in time."""
        if self.frozen:
            self.signal(signal.SIGCONT)
            self.frozen = False
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(10)
            return False
        finally:
            self.reap_group()


def _zkctl() -> list[str]:
    exe = Path(sys.executable).parent / "zkctl"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("zkctl")
    return [found] if found else [sys.executable, "-m", "cli.main"]


class ChaosRun(Simulation):
    """One chaos run: the cluster, the schedule executor, the sampler, the verdict."""

    def __init__(self, opts: ChaosOptions, echo: Callable[[str], None] = lambda s: None) -> None:
        super().__init__(SimOptions(brokers=opts.brokers, tasks=opts.tasks, session_timeout_s=opts.session_timeout_s,
                                    rebalance_timeout_s=opts.rebalance_timeout_s,
                                    scheduled_delay_s=opts.scheduled_delay_s, zk_hosts=opts.zk_hosts, root=opts.root,
                                    seed=opts.seed, use_proxies=True, converge_timeout_s=opts.convergence_bound_s),
                         echo)
        self.copts = opts
        self.schedule = make_schedule(opts)
        self.samples: list[Sample] = []
        self._sampling = threading.Event()
        self.injected: Counter[str] = Counter()
        self.failed: list[str] = []
        self.ctl_proxies: dict[str, NetProxy] = {}
        self.ctl_procs: dict[str, _Proc] = {}
        self.broker_procs: dict[str, _Proc] = {}
        self.journals: dict[str, list[Path]] = {}
        self.process_intervals: list[RunInterval] = []
        self._ctl_seq = 0
        self._incarnation: Counter[str] = Counter()
        self._stop = threading.Event()

    # ---- cluster pieces ---------------------------------------------------------------------------
    def _upstream(self) -> tuple[str, int]:
        host, port = self.hosts.split(",")[0].rsplit(":", 1)
        return host, int(port)

    def _proxy(self, name: str, table: dict[str, NetProxy]) -> NetProxy:
        proxy = table.get(name)
        if proxy is None:
            proxy = table[name] = NetProxy(*self._upstream(), name=f"proxy-{name}")
        proxy.heal()
        return proxy

    def new_controller(self) -> str:
        cid = f"ctl-{self._ctl_seq}"
        self._ctl_seq += 1
        proxy = self._proxy(cid, self.ctl_proxies)
        o = self.copts
        if o.process_brokers:
            cmd = _zkctl() + ["--zk", proxy.address, "--zk-root", self.root, "controller", "run", "--id", cid,
                              "--rebalance-timeout", str(o.rebalance_timeout_s), "--scheduled-delay",
                              str(o.scheduled_delay_s), "--session-timeout", str(o.session_timeout_s)]
            self.ctl_procs[cid] = _Proc(cid, cmd, Path(self.tmp.name) / f"{cid}.log")
        else:
            cfg = ControllerConfig(cid, ZkSettings(hosts=proxy.address, root=self.root,
                                                   session_timeout_s=o.session_timeout_s, auth=self.settings().auth),
                                   GroupConfig(rebalance_timeout_s=o.rebalance_timeout_s,
                                               scheduled_rebalance_delay_s=o.scheduled_delay_s,
                                               default_assignor="cooperative-sticky"))
            self.controllers.append(Controller(cfg).start())
        return cid

    def settings(self, hosts: str | None = None) -> ZkSettings:
        base = super().settings(hosts)
        auth = os.environ.get("ZKC_AUTH")
        return dataclasses.replace(base, auth=auth) if auth else base

    def new_broker(self, bid: str) -> None:
        if not self.copts.process_brokers:
            self.start_worker(bid)
            return
        proxy = self._proxy(bid, self.proxies)
        self._incarnation[bid] += 1
        journal = Path(self.tmp.name) / f"{bid}.{self._incarnation[bid]}.journal"
        self.journals.setdefault(bid, []).append(journal)
        cmd = [sys.executable, "-m", "broker_sim.chaos", "broker", "--id", bid, "--zk", proxy.address, "--root",
               self.root, "--session-timeout", str(self.copts.session_timeout_s), "--journal", str(journal)]
        if self.copts.pipelines:
            cmd += ["--runner", "spark", "--spark-master", self.copts.spark_master, "--checkpoint-root",
                    str(Path(self.tmp.name) / "checkpoints")]
        self.broker_procs[bid] = _Proc(bid, cmd, Path(self.tmp.name) / f"{bid}.{self._incarnation[bid]}.log")

    def _broker_gone(self, bid: str, died_at: float | None) -> None:
        """A process broker exited (or was killed): its journal is complete; collect its intervals."""
        self.broker_procs.pop(bid, None)
        journal = self.journals[bid][-1]
        self.process_intervals += read_journal(journal, bid, died_at)

    def active_controller_id(self) -> str | None:
        try:
            data, _ = self.admin.get(self.layout.controller)
            return codecs.decode(codecs.ControllerInfo, data, self.layout.controller).controller_id
        except Exception:
            return None

    # ---- faults: begin and end --------------------------------------------------------------------
    def _begin(self, f: Fault) -> Callable[[], None] | None:
        """Inject ``f``; return what ends it (called ``f.duration`` later), if anything."""
        o = self.copts
        if f.kind == "kill-broker":
            if o.process_brokers:
                proc = self.broker_procs[f.target]
                self._broker_gone(f.target, proc.kill9())
            else:
                self.kill(f.target)
            return lambda: self.new_broker(f.target)
        if f.kind in ("expire-broker", "partition-broker"):
            proxy = self.proxies[f.target]
            proxy.partition()
            return lambda: (proxy.reset(), proxy.heal())
        if f.kind == "freeze-broker":
            if o.process_brokers:
                proc = self.broker_procs[f.target]
                proc.signal(signal.SIGSTOP)
                proc.frozen = True

                def thaw() -> None:
                    proc.frozen = False
                    proc.signal(signal.SIGCONT)
                return thaw
            w = self.workers[f.target]
            proxy = self.proxies[f.target]
            w.frozen.set()
            proxy.partition()
            return lambda: (proxy.reset(), proxy.heal(), w.frozen.clear())
        if f.kind == "kill-controller":
            cid = self.active_controller_id()
            if o.process_brokers:
                proc = self.ctl_procs.pop(cid, None) if cid else None
                if proc is None:
                    raise RuntimeError("no active controller process to kill")
                proc.kill9()
            else:
                ctl = next((c for c in self.controllers if c.id == cid), None)
                if ctl is None:
                    raise RuntimeError("no active controller to kill")
                self.controllers.remove(ctl)
                ctl.stop()
            return lambda: self.new_controller() and None
        if f.kind == "freeze-controller":
            cid = self.active_controller_id()
            if cid is None:
                raise RuntimeError("no active controller to freeze")
            if o.process_brokers:
                proc = self.ctl_procs[cid]
                proc.signal(signal.SIGSTOP)
                proc.frozen = True

                def thaw_ctl() -> None:
                    proc.frozen = False
                    proc.signal(signal.SIGCONT)
                return thaw_ctl
            ctl = next(c for c in self.controllers if c.id == cid)
            proxy = self.ctl_proxies[cid]
            stall = threading.Event()
            limit = f.duration + 10.0
            ctl.before_write = lambda: stall.wait(limit)  # the event thread stops at its next write
            proxy.partition()

            def resume() -> None:
                proxy.reset()
                proxy.heal()
                ctl.before_write = None
                stall.set()
            return resume
        if f.kind == "zk-restart":
            assert self.server is not None
            self.server.kill()
            return lambda: self.server.start(timeout=60) and None
        if f.kind == "rolling-bounce":
            self._bounce(f)
            return None
        if f.kind == "task-storm":
            admin = AdminClient(self.admin, self.layout)
            if f.create:
                admin.create_tasks([TaskSpec(id=task_id(f.prefix, i)) for i in range(f.create)])
            for t in f.delete:
                try:
                    admin.delete_task(t)
                except AdminError:
                    pass  # already gone
            return None
        raise ValueError(f"unknown fault kind {f.kind!r}")

    def _bounce(self, f: Fault) -> None:
        """Every broker in turn leaves (controlled shutdown or plain stop), stays away 1 s, comes back;
        the next one goes once the group is Stable again (bounded by the rebalance timeout)."""
        o = self.copts
        for i in range(o.brokers):
            bid = broker_id(i)
            if o.process_brokers:
                proc = self.broker_procs.get(bid)
                if proc is not None:
                    if f.controlled:
                        proc.terminate(o.rebalance_timeout_s + o.session_timeout_s + 5)
                        self._broker_gone(bid, time.time())
                    else:
                        self._broker_gone(bid, proc.kill9())
            else:
                if bid in self.workers:
                    if f.controlled:
                        self.controlled_shutdown(bid, timeout=o.rebalance_timeout_s + o.session_timeout_s + 5)
                    else:
                        self.leave(bid)
            if self._stop.wait(1.0):
                return
            self.new_broker(bid)
            self._wait_stable(o.rebalance_timeout_s + o.session_timeout_s)

    def _wait_stable(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        time.sleep(0.3)  # let the change be noticed before looking for Stable
        while time.monotonic() < deadline and not self._stop.is_set():
            s = self.samples[-1] if self.samples else None
            if s is not None and s.state == "Stable" and time.time() - s.t < 1.0:
                return True
            self._stop.wait(0.1)
        return False

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
        tasks = sorted(c.get_children(lay.tasks))
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
        if not self.copts.process_brokers:
            running: Counter[str] = Counter(t for w in self.workers.values() for t in w.running_tasks())
            for t in sorted(expected):
                if running[t] != 1:
                    problems.append(f"{t}: running on {running[t]} in-process workers")
            extra = sorted(set(running) - expected)
            if extra:
                problems.append(f"running but not expected: {extra[:5]}")
        return problems

    # ---- the run ----------------------------------------------------------------------------------
    def all_run_intervals(self) -> list[RunInterval]:
        if not self.copts.process_brokers:
            return self.all_intervals()
        now = time.time()
        out = list(self.process_intervals)
        for bid in self.broker_procs:
            out += read_journal(self.journals[bid][-1], bid, None)
        return close_open(out, now)

    def play(self) -> ChaosSummary:
        o = self.copts
        wall0 = time.monotonic()
        for f in self.schedule:
            self.echo("  " + f.describe())
        self.create_tasks(o.tasks)
        pipes = self._create_pipelines()
        for _ in range(max(1, o.controllers)):
            self.new_controller()
        for i in range(o.brokers):
            self.new_broker(broker_id(i))
        sampler = threading.Thread(target=self._sample_loop, name="chaos-sampler", daemon=True)
        sampler.start()
        t0 = time.monotonic()
        while self.zk_view() and time.monotonic() - t0 < o.convergence_bound_s + 30:
            time.sleep(0.2)
        problems = self.zk_view()
        if problems:
            raise RuntimeError(f"the cluster did not converge at start: {problems[:5]}")
        self.echo(f"{o.brokers} brokers, {o.tasks} tasks running after {time.monotonic() - t0:.1f}s; faults begin")
        gen0 = next((s.generation for s in reversed(self.samples) if s.generation is not None), 0)
        gens = self._start_datagens(pipes)
        phase0 = time.monotonic()
        pending: list[tuple[float, int, Callable[[], None], str]] = []  # (due, seq, end action, label)
        seq = 0
        lag = 0.0
        faults_end = time.time()
        queue = list(self.schedule)
        while queue or pending:
            next_begin = phase0 + lag + queue[0].at if queue else float("inf")
            next_end = pending[0][0] if pending else float("inf")
            due = min(next_begin, next_end)
            self._stop.wait(max(0.0, due - time.monotonic()))
            if next_end <= next_begin:
                _, _, end, label = pending.pop(0)
                try:
                    end()
                except Exception as exc:
                    self.failed.append(f"end of {label}: {type(exc).__name__}: {exc}")
                    log.exception("ending %s", label)
                faults_end = time.time()
                continue
            f = queue.pop(0)
            label = f.describe().strip()
            started = time.monotonic()
            try:
                end = self._begin(f)
                self.injected[f.kind] += 1
            except Exception as exc:
                end = None
                self.failed.append(f"{label}: {type(exc).__name__}: {exc}")
                log.exception("injecting %s", label)
            took = time.monotonic() - started
            if f.kind in EXCLUSIVE:
                if end is not None:  # wait out the exclusive fault here: nothing else runs meanwhile
                    self._stop.wait(f.duration)
                    try:
                        end()
                    except Exception as exc:
                        self.failed.append(f"end of {label}: {type(exc).__name__}: {exc}")
                        log.exception("ending %s", label)
                    took = time.monotonic() - started
                lag += max(0.0, took - f.duration)
            elif end is not None:
                seq += 1
                pending.append((time.monotonic() + f.duration, seq, end, label))
                pending.sort(key=lambda p: (p[0], p[1]))
            faults_end = time.time()
            self.echo(f"  injected {label}")
        # ---- faults are over: invariant 2 must hold continuously for hold_s, starting within the bound ----
        t_end_mono = time.monotonic()
        converge_s: float | None = None
        last_problems: list[str] = []
        ok_since: float | None = None
        while True:
            now = time.monotonic()
            try:
                last_problems = self.zk_view()
            except Exception as exc:
                last_problems = [f"reading ZooKeeper: {type(exc).__name__}"]
            if last_problems:
                ok_since = None
            elif ok_since is None:
                ok_since = now
            if ok_since is not None and now - ok_since >= o.hold_s:
                converge_s = ok_since - t_end_mono
                break
            if (ok_since or now) - t_end_mono > o.convergence_bound_s:
                break
            time.sleep(0.2)
        pipeline_figures, v5 = self._check_sinks(pipes, gens) if pipes else ({}, None)
        time.sleep(2 * o.sample_interval_s)
        self._sampling.set()
        sampler.join(5)
        intervals = self.all_run_intervals()
        if o.intervals_out:
            Path(o.intervals_out).write_text(json.dumps([codecs.to_jsonable(i) for i in intervals]))
        verdicts = [
            self._verdict_1(intervals),
            Verdict(2, "every RUNNING task on exactly one live broker", converge_s is not None,
                    [f"not reached and held {o.hold_s:g}s within {o.convergence_bound_s:.0f}s: "
                     + "; ".join(last_problems[:8])] if converge_s is None
                    else [f"reached {converge_s:.2f}s after the last fault and held {o.hold_s:g}s "
                          f"(bound {o.convergence_bound_s:.0f}s)"]),
            self._verdict_3(),
        ]
        v4, longest = self._verdict_4(faults_end)
        verdicts.append(v4)
        if v5 is not None:
            verdicts.append(v5)
        gens = [s.generation for s in self.samples if s.generation is not None]
        epochs = sorted({s.epoch for s in self.samples if s.epoch is not None})
        final_tasks = len(self.admin.get_children(self.layout.tasks))
        return ChaosSummary(
            seed=o.seed, process_brokers=o.process_brokers, brokers=o.brokers, tasks_initial=o.tasks,
            tasks_final=final_tasks, duration_s=o.duration_s, schedule=[f.describe().strip() for f in self.schedule],
            faults_injected=dict(sorted(self.injected.items())), faults_failed=self.failed,
            rebalances=(max(gens) - gen0) if gens else 0, controller_epochs=[epochs[0], epochs[-1]] if epochs else [],
            converge_s=None if converge_s is None else round(converge_s, 3),
            convergence_bound_s=o.convergence_bound_s, longest_unstable_s=round(longest, 3),
            stable_bound_s=o.stable_bound_s, intervals=len(intervals), samples=len(self.samples), verdicts=verdicts,
            wall_s=round(time.monotonic() - wall0, 3), pipelines=pipeline_figures)

    # ---- streaming pipelines ----------------------------------------------------------------------
    def _create_pipelines(self) -> dict[str, tuple[Path, Path]]:
        o = self.copts
        if not o.pipelines:
            return {}
        base = Path(self.tmp.name) / "pipelines"
        pipes = {f"pipe-{i}": (base / f"in-{i}", base / f"out-{i}") for i in range(o.pipelines)}
        for src, _ in pipes.values():
            src.mkdir(parents=True, exist_ok=True)
        AdminClient(self.admin, self.layout).create_tasks([pipeline_spec(t, src, out) for t, (src, out) in pipes.items()])
        return pipes

    def _start_datagens(self, pipes: dict[str, tuple[Path, Path]]) -> dict[str, Any]:
        from broker_sim.datagen import Datagen, DatagenConfig

        o = self.copts
        rate = max(1.0, o.records / max(1.0, 0.8 * o.duration_s))
        return {t: Datagen(DatagenConfig(out_dir=str(src), records=o.records, rate=rate, batch=50)).start()
                for t, (src, _) in pipes.items()}

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

    def close(self) -> None:
        self._sampling.set()
        if os.environ.get("ZKC_CHAOS_KEEP"):  # keep logs, journals and sinks for a post-mortem
            self.echo(f"work directory kept: {self.tmp.name}")
            self.tmp.cleanup = lambda: None  # type: ignore[method-assign]
            self.tmp._finalizer.detach()  # type: ignore[attr-defined]  # else it is removed at interpreter exit
        for bid, proc in list(self.broker_procs.items()):
            proc.kill9()
        for cid, proc in list(self.ctl_procs.items()):
            proc.terminate(10)
        for p in self.ctl_proxies.values():
            p.close()
        super().close()


def run_chaos(opts: ChaosOptions, echo: Callable[[str], None] = lambda s: None) -> ChaosSummary:
    bad = [k for k in opts.kinds if k not in FAULT_KINDS]
    if bad:
        raise ValueError(f"unknown fault kind(s) {bad}: choose from {', '.join(FAULT_KINDS)}")
    if opts.pipelines and not opts.process_brokers:
        raise ValueError("streaming pipelines run on the spark runner in broker processes: use process brokers")
    with ChaosRun(opts, echo) as run:
        echo(f"chaos seed {opts.seed}: {len(run.schedule)} faults over {opts.duration_s:.0f}s "
             f"({'process' if opts.process_brokers else 'in-process'} brokers, {opts.brokers} brokers, "
             f"{opts.tasks} tasks, session {opts.session_timeout_s:g}s, rebalance timeout {opts.rebalance_timeout_s:g}s)")
        return run.play()


def format_summary(s: ChaosSummary) -> str:
    lines = [
        f"chaos seed {s.seed} · {'process' if s.process_brokers else 'in-process'} brokers · {s.brokers} brokers · "
        f"tasks {s.tasks_initial} -> {s.tasks_final} · {s.wall_s:.0f}s",
        f"  faults injected    {sum(s.faults_injected.values())} "
        f"({', '.join(f'{k} {v}' for k, v in s.faults_injected.items()) or '-'})",
        f"  faults failed      {len(s.faults_failed)}" + "".join(f"\n    {x}" for x in s.faults_failed[:5]),
        f"  rebalances         {s.rebalances}",
        f"  controller epochs  {' -> '.join(map(str, s.controller_epochs)) or '-'}",
        f"  converged          {'-' if s.converge_s is None else f'{s.converge_s:.2f}s'} after the last fault "
        f"(bound {s.convergence_bound_s:.0f}s)",
        f"  longest unstable   {s.longest_unstable_s:.2f}s (bound {s.stable_bound_s:.0f}s)",
    ]
    for v in s.verdicts:
        lines.append(f"  invariant {v.invariant} {'ok  ' if v.ok else 'FAIL'} {v.name}")
        lines += [f"      {d}" for d in v.details[:5]]
    for t, f in s.pipelines.items():
        lines.append(f"  pipeline {t}: {f['held']} records held of {f['expected']}, {f['duplicates']} duplicates, "
                     f"{f['missing']} missing")
    lines.append("  verdict            " + ("OK" if s.ok else "VIOLATION"))
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "broker":
        sys.exit(_broker_main(sys.argv[2:]))
    print("usage: python -m broker_sim.chaos broker --id ID --zk HOSTS --root ROOT --journal PATH", file=sys.stderr)
    sys.exit(2)
