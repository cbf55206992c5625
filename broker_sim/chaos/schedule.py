"""The seeded fault schedule, pure: the same seed and options give the same schedule (printed before a
run starts), whatever runs it."""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_FAULT_KINDS = (
    "kill-broker",
    "expire-broker",
    "freeze-broker",
    "partition-broker",
    "kill-controller",
    "freeze-controller",
    "zk-restart",
    "rolling-bounce",
    "task-storm",
)
#: every kind; "wedged-stop" (a broker's runner stops hanging, as a wedged driver's, while ZooKeeper is cut off:
#: the broker must halt at its fence deadline and be restarted), "maintenance" (maintenance mode on for a
#: while: nothing may move meanwhile), "ghost-member" (a member znode with no broker behind it, on a session of
#: its own: it claims a live broker's tasks at a huge generation, or nothing) and "rewritten-report" (a live
#: member's report rewritten with absurd fields) are drawn only when asked for
#: faults inside a three-server ensemble (``ChaosOptions.ensemble``): SIGKILL of the leader or of a follower
#: (started again after the fault), two of three down for longer than the session timeout (the quorum lost,
#: then back), one server cut off from its peers while its clients still reach it; drawn only when asked for
ENSEMBLE_KINDS = ("zk-kill-leader", "zk-kill-follower", "zk-lose-quorum", "zk-isolate")
FAULT_KINDS = DEFAULT_FAULT_KINDS + ("wedged-stop", "maintenance", "ghost-member", "rewritten-report") + ENSEMBLE_KINDS

#: what a "rewritten-report" fault writes into a live member's report (``Fault.variant``)
REWRITES = ("generation", "huge-lists", "bad-names")


_WEIGHTS = {
    "kill-broker": 3,
    "expire-broker": 2,
    "freeze-broker": 2,
    "partition-broker": 2,
    "kill-controller": 2,
    "freeze-controller": 2,
    "zk-restart": 1,
    "rolling-bounce": 1,
    "task-storm": 2,
    "wedged-stop": 3,
    "maintenance": 1,
    "ghost-member": 2,
    "rewritten-report": 2,
    "zk-kill-leader": 2,
    "zk-kill-follower": 2,
    "zk-lose-quorum": 2,
    "zk-isolate": 2,
}


EXCLUSIVE = ("zk-restart", "rolling-bounce", *ENSEMBLE_KINDS)  # nothing else starts or ends while these run


GROUP = "default"


@dataclass(frozen=True)
class ChaosOptions:
    seed: int = 0
    duration_s: float = 60.0  # faults start within this many seconds
    brokers: int = 4
    tasks: int = 40
    controllers: int = 2
    process_brokers: bool = False  # brokers and controllers as processes (kill -9, SIGSTOP are real)
    session_timeout_s: float = 4.0
    rebalance_timeout_s: float = 8.0
    scheduled_delay_s: float = 0.0
    mean_gap_s: float = 2.5  # mean time between fault starts (exponential)
    kinds: tuple[str, ...] = DEFAULT_FAULT_KINDS
    zk_hosts: str | None = None  # an external ZooKeeper (then no zk-restart faults)
    root: str | None = None
    hold_s: float = 3.0  # invariant 2 must hold for this long once reached
    sample_interval_s: float = 0.2
    placement_interval_s: float = 0.5  # the placement sampler's (invariants 9 and 10)
    intervals_out: str | None = None
    pipelines: int = 0  # streaming file pipelines on the spark runner (process brokers only)
    records: int = 3000  # records the data generator writes per pipeline while faults run
    spark_master: str = "local[1]"
    sink_timeout_s: float = 300.0  # after the faults, how long the sinks may take to catch up
    max_moves: int | None = None  # a move throttle for the run (settings max_moves, max_moves_per_broker)
    max_moves_per_broker: int | None = None
    protocol: str = "cooperative"  # the brokers' protocol: cooperative (also eager), eager or reconcile
    #: kinds the harness cannot inject here (as a container the engine cannot freeze): never drawn
    leave_out: frozenset[str] = frozenset()
    #: ZooKeeper servers of the run's own: 1 (one server, "zk-restart") or 3 (an ensemble, its kinds)
    ensemble: int = 1

    @property
    def convergence_bound_s(self) -> float:
        """Invariant 2's bound, from the end of the last fault: a silently dead broker's session expires
        (session timeout), a join phase waits out a missing member and a cooperative follow-up rebalance
        runs (2 x rebalance timeout), the scheduled delay, and 10 s for restarts, reconnects and the
        status interval; 30 s more with Spark pipelines (a restarted broker starts a JVM)."""
        spark = 30.0 if self.pipelines else 0.0  # a restarted Spark broker starts its JVM and queries
        return self.session_timeout_s + 2 * self.rebalance_timeout_s + self.scheduled_delay_s + 10.0 + spark

    @property
    def ownerless_bound_s(self) -> float:
        """Invariant 9's bound: a placed task without a running owner while its group says Stable, at most the
        rebalance timeout (in which a member must take what it was given) plus the delay and 2 s of slack."""
        return self.rebalance_timeout_s + self.scheduled_delay_s + 2.0

    @property
    def stable_bound_s(self) -> float:
        """Invariant 4's bound: one phase of a rebalance at one generation, plus the delay, plus slack for
        sampling and one round trip (2 s)."""
        return self.rebalance_timeout_s + self.scheduled_delay_s + 2.0


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the fault phase began
    kind: str
    target: str  # a broker id, "active" (the active controller), "zookeeper", "tasks", "all"
    duration: float  # how long the fault lasts (the thing is back / healed after it)
    create: int = 0  # task-storm: tasks created
    delete: tuple[str, ...] = ()  # task-storm: tasks whose deletion is requested
    controlled: bool = False  # rolling-bounce: controlled shutdowns instead of plain stops
    prefix: str = ""  # task-storm: ids of the created tasks are <prefix>-00000...
    #: ghost-member: "claims" (the target broker's tasks) or "nothing"; rewritten-report: one of REWRITES
    variant: str = ""

    def describe(self) -> str:
        extra = ""
        if self.variant:
            extra = f" ({self.variant})"
        if self.kind == "task-storm":
            extra = f" create {self.create}, delete {len(self.delete)}"
        elif self.kind == "rolling-bounce":
            extra = " (controlled shutdown)" if self.controlled else " (plain stop)"
        return f"t+{self.at:7.2f}s  {self.kind:<17} {self.target:<11} for {self.duration:5.2f}s{extra}"


def left_out(opts: ChaosOptions) -> dict[str, str]:
    """The kinds asked for that the schedule leaves out, each with why (printed before the schedule)."""
    out = {k: "the harness cannot inject it here" for k in opts.kinds if k in opts.leave_out}
    if opts.zk_hosts and "zk-restart" in opts.kinds:
        out["zk-restart"] = "the ZooKeeper is an external one: not the run's to restart"
    elif opts.ensemble > 1 and "zk-restart" in opts.kinds:
        out["zk-restart"] = "with an ensemble its servers are faulted one by one (the zk-* ensemble kinds)"
    for k in ENSEMBLE_KINDS:
        if k in opts.kinds and (opts.ensemble < 3 or opts.zk_hosts):
            out[k] = "needs an ensemble of the run's own (--ensemble 3)"
    return out


def make_schedule(opts: ChaosOptions) -> list[Fault]:
    """The fault schedule of ``opts.seed``: a pure function of the options (no clock, no I/O)."""
    rng = random.Random(opts.seed)
    s = opts.session_timeout_s
    skipped = left_out(opts)
    kinds = [k for k in opts.kinds if k in FAULT_KINDS and k not in skipped]
    if not kinds:
        return []
    weights = [_WEIGHTS[k] for k in kinds]
    brokers = [broker_id(i) for i in range(opts.brokers)]
    tasks = [task_id("task", i) for i in range(opts.tasks)]
    busy: dict[str, float] = {}  # target -> free again at
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
        if kind in ("kill-broker", "expire-broker", "freeze-broker", "partition-broker", "wedged-stop"):
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
                    "wedged-stop": 1.5 * s,  # cut off past its session: it must halt before the session expires
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
        elif kind in ENSEMBLE_KINDS:
            if all(v <= t for v in busy.values()):
                fault = _ensemble_fault(rng, kind, round(t, 3), s)
                exclusive_until = t + fault.duration + s
        elif kind in ("ghost-member", "rewritten-report"):
            # not a broker fault: the target broker runs on; the ghost's session lives for the fault's duration
            # (a rewritten report is one write: the member must rejoin by itself)
            key = f"{kind}:target"
            if busy.get(key, 0.0) <= t:
                target = rng.choice(brokers)
                if kind == "ghost-member":
                    variant = "claims" if rng.random() < 0.6 else "nothing"
                    duration = rng.uniform(1.5, 4.0) * s
                else:
                    variant = rng.choice(REWRITES)
                    duration = 0.0
                fault = Fault(round(t, 3), kind, target, round(duration, 3), variant=variant)
                busy[key] = t + duration + s
        elif kind == "maintenance":
            if busy.get("maintenance", 0.0) <= t:
                duration = rng.uniform(1.5, 4.0) * s
                fault = Fault(round(t, 3), kind, "cluster", round(duration, 3))
                busy["maintenance"] = t + duration + s
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


def _ensemble_fault(rng: random.Random, kind: str, at: float, s: float) -> Fault:
    """An ensemble fault at ``at`` (``s``: the session timeout). A lost quorum lasts longer than a session: the
    brokers' sessions cannot be renewed meanwhile, they fence, and every session expires once it is back. A cut
    is short (the server's clients move to the others within their session) or long."""
    if kind == "zk-lose-quorum":
        return Fault(at, kind, "two of three", round(rng.uniform(1.3, 2.0) * s, 3))
    if kind == "zk-isolate":
        variant = "short" if rng.random() < 0.5 else "long"
        duration = rng.uniform(0.3, 0.8) * s if variant == "short" else rng.uniform(1.2, 2.0) * s
        return Fault(at, kind, rng.choice(("leader", "follower")), round(duration, 3), variant=variant)
    return Fault(at, kind, kind.removeprefix("zk-kill-"), round(rng.uniform(0.5, 2.0) * s, 3))


def broker_id(i: int) -> str:
    return f"broker-{i:03d}"


def task_id(prefix: str, i: int) -> str:
    return f"{prefix}-{i:05d}"
