"""A seeded chaos run over a cluster of containers (``docker kill``, kill -9 of a container's process,
``docker pause``/``unpause``, ``docker restart`` of brokers, controllers and ZooKeeper nodes), checked by the
same independent checker as every other run: every container life's journal, every sink exactly once.

A fault the engine refuses at injection (``docker pause`` that cannot freeze the cgroup: "OCI runtime pause
failed: unable to freeze", a container that is not running) is recorded as not injected with the engine's
message; the run is judged on the faults that happened, and fails when fewer than half could be
(``broker_sim.sim.injection``). The cluster itself (started, listed, removed) is ``containers``; this module
plays faults over it."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker_sim.chaos.processes import read_journal
from broker_sim.deploy.containers import LABEL, ClusterSpec, engine, registered_brokers, up, wait_until
from broker_sim.sim.checker import close_open, double_ownership
from broker_sim.sim.injection import FaultRefused, Injection, NotInjected, judge
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records.task_records import RunInterval
from controller.zk.client import ZkSettings, make_client

CONTAINER_FAULTS = (
    "kill-broker",
    "crash-broker",
    "pause-broker",
    "restart-broker",
    "kill-controller",
    "crash-controller",
    "pause-controller",
    "restart-zk",
)


@dataclass(frozen=True)
class ContainerFault:
    at: float
    kind: str
    target: str
    duration: float


def container_schedule(
    seed: int, duration_s: float, spec: ClusterSpec, every_s: float = 6.0, leave_out: frozenset[str] = frozenset()
) -> list[ContainerFault]:
    """A seeded schedule of container faults (same seed and size, same schedule): one every ``every_s`` on
    average, each on a container drawn by the seed. ``leave_out`` names kinds this engine cannot inject
    (``docker pause`` where the cgroup freezer is missing); the others are drawn from."""
    unknown = set(leave_out) - set(CONTAINER_FAULTS)
    kinds = tuple(k for k in CONTAINER_FAULTS if k not in leave_out)
    if unknown or not kinds:
        raise ValueError(f"cannot leave out {sorted(leave_out)}: the kinds are {', '.join(CONTAINER_FAULTS)}")
    rnd = random.Random(seed)
    out: list[ContainerFault] = []
    t = rnd.uniform(1.0, every_s)
    while t < duration_s:
        kind = rnd.choice(kinds)
        if kind.endswith("broker"):
            target = spec.broker_id(rnd.randrange(spec.brokers))
        elif kind.endswith("controller"):
            target = f"{spec.name}-ctl-{rnd.randrange(spec.controllers) + 1}"
        else:
            target = f"{spec.name}-zk{rnd.randrange(spec.zk_nodes) + 1}"
        out.append(ContainerFault(round(t, 2), kind, target, round(rnd.uniform(1.0, 4.0), 2)))
        t += rnd.uniform(0.5 * every_s, 1.5 * every_s)
    return out


@dataclass
class ContainerChaosSummary:
    seed: int
    schedule: list[dict[str, Any]]
    injected: dict[str, int]
    #: faults that went wrong otherwise: an error at injection that is no refusal, or at their end
    failed: list[str]
    intervals: int
    overlaps: list[str]
    restarted_and_back: bool
    converged_s: float | None
    wall_s: float
    sinks: dict[str, dict[str, int]] = field(default_factory=dict)  # pipeline -> expected, held, duplicates, missing
    #: every task's last reported status at the end (state, broker, error): what explains a sink that is short
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: fault kinds the schedule left out (the engine cannot inject them here)
    left_out: list[str] = field(default_factory=list)
    #: faults the engine refused at injection: (fault, the engine's message)
    not_injected: list[tuple[str, str]] = field(default_factory=list)

    @property
    def injection(self) -> Injection:
        return Injection(len(self.schedule), tuple(NotInjected(f, r) for f, r in self.not_injected))

    @property
    def verdicts_ok(self) -> bool:
        exactly_once = all(v["missing"] == 0 and v["duplicates"] == 0 for v in self.sinks.values())
        return (
            not self.overlaps
            and not self.failed
            and self.restarted_and_back
            and self.converged_s is not None
            and exactly_once
        )

    @property
    def ok(self) -> bool:
        """Every check holds and at least half the drawn faults happened (refusals alone never fail it)."""
        return judge(self.verdicts_ok, self.injection)[0]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def chaos(
    spec: ClusterSpec,
    seed: int,
    duration_s: float,
    tasks: int = 12,
    echo: Callable[[str], None] = print,
    settle_s: float = 120.0,
    pipelines: int = 0,
    records: int = 1200,
    leave_out: frozenset[str] = frozenset(),
) -> ContainerChaosSummary:
    """Start ``spec`` with journaling brokers, create ``tasks`` no-op tasks (or, with ``pipelines``, that many
    streaming Spark pipelines fed from the host), play the seeded container faults, then check: no task
    ever had two running owners (journals of every container life), every container back and every broker
    registered, every task running again, and with pipelines every sink holding every record exactly once."""
    from controller.admin import AdminClient
    from controller.protocol.tasks.spec import NoopPipeline, TaskSpec

    if spec.journal_dir is None:
        raise ValueError("a chaos run needs spec.journal_dir")
    if pipelines and (spec.runner != "spark" or spec.data_dir is None):
        raise ValueError("pipelines need the spark runner and a shared data directory")
    for d in filter(None, (spec.journal_dir, spec.data_dir)):
        Path(d).mkdir(parents=True, exist_ok=True)
        Path(d).chmod(0o777)  # written by the image's non-root user
    schedule = container_schedule(seed, duration_s, spec, leave_out=leave_out)
    for f in schedule:
        echo(f"  {f.at:7.2f}s {f.kind:<17} {f.target} ({f.duration:g}s)")
    wall0 = time.monotonic()
    info = up(spec, echo=echo)
    client = engine()
    zk = make_client(ZkSettings(hosts=info.zk, root=spec.root, session_timeout_s=30.0))
    kills: dict[str, list[float]] = {}
    injected: dict[str, int] = {}
    failed: list[str] = []
    refused: list[tuple[str, str]] = []
    feeders: list[Any] = []
    try:
        admin = AdminClient(zk, ZkLayout(spec.root))
        if pipelines:
            ids = [f"pipeline-{i + 1}" for i in range(pipelines)]
            assert spec.data_dir is not None  # checked above
            feeders = _start_pipelines(admin, Path(spec.data_dir), ids, records, duration_s)
        else:
            ids = [f"chaos-{i:03d}" for i in range(tasks)]
            admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in ids])
        wait_until(lambda: _all_running(zk, spec.root, ids), 300, "every task running before the faults")
        t0 = time.monotonic()
        for f in schedule:
            time.sleep(max(0.0, t0 + f.at - time.monotonic()))
            label = f"{f.kind} on {f.target}"
            try:
                undo = begin_fault(client, f, kills)
            except FaultRefused as exc:
                refused.append((label, str(exc)))
                echo(f"  not injected: {label}: {exc}")
                continue
            except Exception as exc:
                failed.append(f"{label}: {type(exc).__name__}: {exc}")
                continue
            injected[f.kind] = injected.get(f.kind, 0) + 1
            echo(f"  injected {label}")
            if undo is not None:
                time.sleep(f.duration)
                try:
                    undo()
                except Exception as exc:  # a container left killed or paused: the run cannot judge the rest
                    failed.append(f"end of {label}: {type(exc).__name__}: {exc}")
        end = time.monotonic()
        converged = None
        deadline = end + settle_s
        while time.monotonic() < deadline:
            if set(registered_brokers(info.zk, spec.root)) >= set(info.brokers) and _all_running(zk, spec.root, ids):
                converged = round(time.monotonic() - end, 2)
                break
            time.sleep(0.5)
        back = all(
            c.status == "running" for c in client.containers.list(all=True, filters={"label": f"{LABEL}={spec.name}"})
        )
        sinks: dict[str, dict[str, int]] = {}
        if pipelines:
            for g in feeders:
                g.join()
            assert spec.data_dir is not None
            sinks = _wait_sinks(Path(spec.data_dir), ids, records, settle_s)
        time.sleep(3)  # the last stops reach the journals
        intervals = _journal_intervals(Path(spec.journal_dir), kills)
        overlaps = [str(o) for o in double_ownership(close_open(intervals, time.time()))]
        return ContainerChaosSummary(
            seed,
            [asdict(f) for f in schedule],
            injected,
            failed,
            len(intervals),
            overlaps,
            back,
            converged,
            round(time.monotonic() - wall0, 1),
            sinks,
            _statuses(zk, spec.root, ids),
            sorted(leave_out),
            refused,
        )
    finally:
        zk.stop()
        zk.close()


def begin_fault(client: Any, f: ContainerFault, kills: dict[str, list[float]]) -> Callable[[], None] | None:
    """Begin one fault and return what ends it (called ``f.duration`` later; None: nothing to undo). ``docker
    kill`` is a manual stop (Docker leaves the container down), so the harness starts it again after the
    fault's duration, as a supervisor would; a crash is left to the restart policy. The engine's refusal (an
    API error: "OCI runtime pause failed: unable to freeze", a container that is not running; a process that
    is gone) raises ``FaultRefused`` with its message, and the kill stamp it took is dropped."""
    from docker.errors import APIError

    stamps = kills.setdefault(f.target, [])
    stamp = None if f.kind.startswith("pause") else time.time()
    if stamp is not None:
        stamps.append(stamp)
    try:
        c = client.containers.get(f.target)
        if f.kind.startswith("kill"):
            c.kill()
            return lambda: c.start()
        if f.kind.startswith("crash"):
            crash(c)
            return None
        if f.kind.startswith("pause"):
            c.pause()
            return lambda: c.unpause()
        c.restart(timeout=10)
        return None
    except (APIError, ProcessLookupError) as exc:
        if stamp is not None:
            stamps.remove(stamp)
        raise FaultRefused(_engine_message(exc)) from exc


def _engine_message(exc: BaseException) -> str:
    """The engine's own words (Docker's ``explanation``, else the error), bounded."""
    text = str(getattr(exc, "explanation", None) or exc)
    return f"{type(exc).__name__}: {text[:300]}"


def _start_pipelines(admin: Any, data: Path, ids: list[str], records: int, duration_s: float) -> list[Any]:
    """Streaming file pipelines whose input the host writes (a data generator per pipeline, spread over the
    fault phase) into the directory every broker container mounts at /data/checkpoints."""
    import threading

    from broker_sim.chaos.sinks import pipeline_spec
    from broker_sim.sim.datagen import DatagenConfig, generate

    for t in ids:
        (data / "in" / t).mkdir(parents=True, exist_ok=True)
    admin.create_tasks(
        [pipeline_spec(t, Path("/data/checkpoints/in") / t, Path("/data/checkpoints/out") / t) for t in ids]
    )
    rate = max(1.0, records / max(1.0, duration_s * 0.8))
    feeders = []
    for t in ids:
        g = threading.Thread(
            target=generate,
            args=(DatagenConfig(out_dir=str(data / "in" / t), records=records, rate=rate, batch=50),),
            name=f"chaos-datagen-{t}",
            daemon=True,
        )
        g.start()
        feeders.append(g)
    return feeders


def container_sink_ids(data: Path, task: str) -> list[int]:
    """The ids a sink's committed files hold (its commit log names them by their path in the containers)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type information

    from broker_sim.chaos.sinks import committed_files

    ids: list[int] = []
    for f in committed_files(data / "out" / task):
        local = Path(str(f).replace("/data/checkpoints", str(data), 1))
        ids += pq.read_table(str(local), columns=["id"]).column("id").to_pylist()
    return ids


def _wait_sinks(data: Path, ids: list[str], records: int, timeout: float) -> dict[str, dict[str, int]]:
    """Each sink's figures once every record is there or at ``timeout``. A read that fails (a log file or
    a part file read while Spark writes it) keeps the last good read and is counted in ``read_errors``:
    it used to count as an empty sink, so one failed read at the deadline said "0 of N" of a full sink."""
    deadline = time.monotonic() + timeout
    last: dict[str, list[int]] = {t: [] for t in ids}
    errors: dict[str, int] = {t: 0 for t in ids}
    while True:
        out = {}
        for t in ids:
            try:
                last[t] = container_sink_ids(data, t)
                errors[t] = 0
            except (OSError, ValueError):
                errors[t] += 1
            got = last[t]
            out[t] = {
                "expected": records,
                "held": len(set(got)),
                "duplicates": len(got) - len(set(got)),
                "missing": len(set(range(records)) - set(got)),
                "read_errors": errors[t],
            }
        if all(v["missing"] == 0 for v in out.values()) or time.monotonic() > deadline:
            return out
        time.sleep(1.0)


def crash(container: Any) -> None:
    """Kill -9 the container's process from the host, as a crash or the OOM killer would. (``docker kill``
    counts as a manual stop: Docker's restart manager then leaves the container down, whatever its policy,
    until someone starts it. A crash is what restart policies are for.)"""
    container.reload()
    pid = container.attrs["State"]["Pid"]
    if not pid:
        raise FaultRefused(f"container {container.name} has no running process to kill")
    os.kill(pid, signal.SIGKILL)


def _all_running(zk: Any, root: str, ids: list[str]) -> bool:
    """Every task has an owner and its owner reports it RUNNING (a FAILED pipeline holds its owner too)."""
    from controller.zk.io import exists_many

    lay = ZkLayout(root)
    try:
        if not all(s is not None for s in exists_many(zk, [lay.task_owner(t) for t in ids])):
            return False
        return all(v["state"] == "RUNNING" for v in _statuses(zk, root, ids).values())
    except Exception:
        return False


def _statuses(zk: Any, root: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    from controller.protocol.records.codecs import decode
    from controller.protocol.records.payload_validation import PayloadError
    from controller.protocol.records.task_records import TaskStatus
    from controller.zk.io import get_many

    lay = ZkLayout(root)
    out: dict[str, dict[str, Any]] = {}
    for t, res in zip(ids, get_many(zk, [lay.status(t) for t in ids])):
        try:
            st = decode(TaskStatus, res[0], lay.status(t)) if res is not None else None
        except PayloadError as exc:
            out[t] = {"state": "UNREADABLE", "broker": None, "error": str(exc)}
            continue
        out[t] = {
            "state": st.state if st else "NONE",
            "broker": st.broker if st else None,
            "error": st.error if st else None,
            "failures": st.failures if st else 0,
        }
    return out


def _journal_intervals(journal_dir: Path, kills: dict[str, list[float]]) -> list[RunInterval]:
    """Every container life's intervals. A life's runs still open in its journal ended no later than the
    first kill or restart of its container after the life began, nor than the birth of its next life: a
    broker that halted at its fence deadline (exit 75, restarted by the restart policy) killed its runners
    before it exited, so they ended before the process that follows it began (or are still running)."""
    lives: dict[str, list[tuple[float, Path]]] = {}
    for path in sorted(journal_dir.glob("*.log")):
        broker, _, stamp = path.stem.rpartition(".")
        try:
            lives.setdefault(broker, []).append((int(stamp) / 1e9, path))
        except ValueError:
            continue
    out: list[RunInterval] = []
    for broker, runs in lives.items():
        runs.sort()
        for (born, path), nxt in zip(runs, [*runs[1:], None]):
            ends = [k for k in kills.get(broker, []) if k >= born] + ([nxt[0]] if nxt is not None else [])
            out += read_journal(path, broker, min(ends) if ends else None)
    return out


def summary_lines(s: ContainerChaosSummary) -> list[str]:
    lines = [
        f"container chaos, seed {s.seed}: {sum(s.injected.values())} faults injected "
        f"({', '.join(f'{k} {v}' for k, v in sorted(s.injected.items())) or 'none'}), {s.intervals} run intervals",
        f"  double ownership   {len(s.overlaps)}" + (f": {'; '.join(s.overlaps[:5])}" if s.overlaps else ""),
        f"  every container back by its restart policy and every broker registered: {'yes' if s.restarted_and_back else 'NO'}",
        f"  every task running again {'-' if s.converged_s is None else f'{s.converged_s:.1f}s'} after the last fault",
        f"  not injected (refused by the engine): {len(s.not_injected)} of {len(s.schedule)} drawn"
        + "".join(f"\n    {f}: {r}" for f, r in s.not_injected[:10]),
        f"  faults that went wrong: {len(s.failed)}" + (f" ({'; '.join(s.failed[:3])})" if s.failed else ""),
        *([f"  fault kinds left out: {', '.join(s.left_out)}"] if s.left_out else []),
        *[
            f"  pipeline {t}: {v['held']} records held of {v['expected']}, {v['duplicates']} duplicates, "
            f"{v['missing']} missing"
            for t, v in sorted(s.sinks.items())
        ],
        *[
            f"  task {t}: {v['state']} on {v['broker']}"
            + (f" ({v['failures']} failures, last: {v['error']})" if v.get("error") else "")
            for t, v in sorted(s.statuses.items())
            if v["state"] != "RUNNING"
        ],
        "  verdict            " + judge(s.verdicts_ok, s.injection)[1],
    ]
    return lines
