"""B11 density: how many streaming pipelines one broker carries before their batches fall behind.

One Spark runner as a broker has it (its shared SparkSession on ``local[N]``, N the machine's cores, or one
driver process per pipeline with ``isolation: process``) takes N pipelines, each a files source (JSON) -> SQL
-> parquet on a 5 s trigger, fed by a feeder thread that drops one small file into each source every trigger
interval. After a warm-up, each pipeline's status is read as often as a broker's status thread reads it, and
its last batch duration (``batch_ms``) kept; a pipeline keeps up when 9 of its batches in 10 took less than one
trigger interval (a lone slow batch, a collection on a busy machine, does not put it behind; a pipeline whose
batches keep taking longer than its trigger does fall behind). A point ends early once a pipeline can no longer
make that. The knee is the largest N at which every pipeline kept up. Isolated drivers come first, from 3
down to the first N that keeps up; then the shared session at five times that knee (the goal) and one point
beside it (``goal_sweep``): five points of 5 minutes fit in about half an hour. Sizes given in the
environment are swept upwards until one falls behind (or memory would run out). Per point also: the CPU the
drivers spent a batch (with the commands they forked), Spark's split of a shared pipeline's batch, and the
resident memory per pipeline (the shared driver JVM's RSS over N; an isolated pipeline's driver, its Python
and its JVM).

``python -m benchmarks --only B11`` (5 minutes a point) or ``--quick`` (40 s a point, small sizes);
``B11_POINT_S``, ``B11_SHARED``/``B11_ISOLATED`` (comma-separated sizes) and ``B11_MASTER`` (default: the
broker's, ``local[N]``) change them.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Bench, table, target

NAME = "b11_density"
TITLE = "B11 density: pipelines per broker"
TRIGGER_S = 5.0
ROWS_PER_FILE = 50
FULL_ISOLATED = (3, 2, 1)  # from the top down: the first that keeps up is the knee
QUICK_SHARED = (1, 2, 4)
QUICK_ISOLATED = (1, 2)
GOAL = 5  # the shared session should carry this many times the isolated drivers' pipelines
MIN_FREE_MB = 1500  # a point is not started when less than this would be left after its drivers
FIRST_BATCH_S = 180.0  # the warm-up begins once every pipeline ran its first batch, or after this
POLL_S = 0.5  # a broker's status thread reads each pipeline's status this often (WorkerConfig.status_interval_s)


def _master() -> str:
    """What a broker runs on by default: ``local[N]`` with N the machine's cores (``B11_MASTER`` changes it)."""
    from broker_sim.runners.spark_session import local_master

    return os.environ.get("B11_MASTER") or local_master()


def _sizes(env: str, default: tuple[int, ...]) -> tuple[int, ...]:
    raw = os.environ.get(env)
    return tuple(int(x) for x in raw.split(",") if x.strip()) if raw else default


def _rss_mb(pid: int, children: bool) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)] if children else [proc]
        return sum(p.memory_info().rss for p in procs) / 2**20
    except psutil.Error:
        return 0.0


class Feeder(threading.Thread):
    """One small JSON file into each source directory every trigger interval (a steady trickle)."""

    def __init__(self, dirs: list[Path]) -> None:
        super().__init__(name="b11-feeder", daemon=True)
        self.dirs = dirs
        self.stop_event = threading.Event()
        self.n = 0

    def feed_once(self) -> None:
        import json

        for i, d in enumerate(self.dirs):
            rows = [
                {"id": self.n * ROWS_PER_FILE + k, "key": f"k{k % 7}", "value": float(k), "ts": time.time()}
                for k in range(ROWS_PER_FILE)
            ]
            tmp = d / f".part-{self.n:06d}.json.tmp"
            tmp.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            tmp.rename(d / f"part-{self.n:06d}-{i}.json")  # whole files only: Spark skips names starting with "."
        self.n += 1

    def run(self) -> None:
        while not self.stop_event.wait(TRIGGER_S):
            self.feed_once()


def _spec(task_id: str, src: Path, out: Path, isolation: str) -> Any:
    from controller.protocol.tasks.spec import parse_spec

    return parse_spec(
        {
            "id": task_id,
            "pipeline": {
                "source": {
                    "type": "files",
                    "format": "json",
                    "path": str(src),
                    "schema": "id BIGINT, key STRING, value DOUBLE, ts DOUBLE",
                },
                "transform": {"sql": "SELECT id, key, value * 2 AS doubled, ts FROM input WHERE value >= 0"},
                "sink": {"type": "files", "format": "parquet", "path": str(out / task_id)},
                "trigger": {"processing_time": f"{int(TRIGGER_S)} seconds"},
                "isolation": isolation,
                **({"driver_memory": "512m"} if isolation == "process" else {}),
            },
        }
    )


def _cpu_s(pid: int, children: bool) -> float:
    """CPU seconds of a process, with the commands it ran and waited for (a JVM's forked ``chmod``s count), and
    with ``children``: its process tree (an isolated driver's Python and its JVM)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)] if children else [proc]
        total = 0.0
        for p in procs:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        return total
    except psutil.Error:
        return 0.0


def _behind_for_good(values: list[int], point_s: float) -> bool:
    """Whether a pipeline has already lost the point: more of its batches over the trigger than one in ten of
    all it could run in the point (its 90th percentile can no longer come under the trigger)."""
    most = point_s / TRIGGER_S + 1
    return sum(1 for v in values if v >= TRIGGER_S * 1000) > 0.1 * most


def point(n: int, isolation: str, point_s: float, warmup_s: float, bench: Bench) -> dict[str, Any]:
    """N pipelines on one runner for ``point_s`` after ``warmup_s``: each one's batch durations, the CPU the
    drivers spent a batch, where a shared pipeline's batch spent its time (Spark's split), and the RSS. A
    point ends early once some pipeline cannot keep up any more (``_behind_for_good``)."""
    from broker_sim.runners.spark import SparkRunner

    work = Path(tempfile.mkdtemp(prefix=f"zkc-b11-{isolation}-{n}-"))
    conf = {"spark.driver.memory": "1g", "spark.ui.enabled": "false"}
    runner = SparkRunner(spark_master=_master(), spark_conf=conf, checkpoint_root=str(work / "ckpt"))
    dirs = [work / "in" / f"p{i:03d}" for i in range(n)]
    for d in dirs:
        d.mkdir(parents=True)
    feeder = Feeder(dirs)
    feeder.feed_once()
    batches: dict[str, list[int]] = {f"p{i:03d}": [] for i in range(n)}
    phases: dict[str, list[int]] = {}
    seen: dict[str, Any] = {}
    t_start = time.monotonic()
    ended_early = False
    try:
        if isolation == "shared":  # (isolated drivers start their own sessions: the broker's stays idle, unstarted)
            runner.warm_up()
        for i, d in enumerate(dirs):
            runner.start(f"p{i:03d}", _spec(f"p{i:03d}", d, work / "out", isolation), 1)
        started_s = time.monotonic() - t_start
        feeder.start()
        first_batch_s = _first_batches(runner, list(batches), FIRST_BATCH_S)
        time.sleep(warmup_s)  # (the first batches compile and plan: not what a running pipeline costs)
        pids, groups = runner.processes()
        cpu0 = _cpu_of(pids, groups) + _cpu_s(os.getpid(), children=False)
        t0 = time.monotonic()
        while time.monotonic() - t0 < point_s and not ended_early:
            time.sleep(POLL_S)  # as often as a broker's status thread reads its pipelines
            for t in batches:
                st = runner.status(t)
                bid, ms = st.metrics.get("last_batch_id"), st.metrics.get("batch_ms")
                if st.state.value != "RUNNING":
                    batches[t].append(10**9)  # failed or stopped: it did not keep up
                elif bid is not None and isinstance(ms, int) and seen.get(t) != bid:
                    seen[t] = bid
                    batches[t].append(ms)
                    for k, v in runner.batch_phases(t).items():
                        phases.setdefault(k, []).append(v)
            ended_early = any(_behind_for_good(v, point_s) for v in batches.values())
        measured_s = time.monotonic() - t0
        pids, groups = runner.processes()
        cpu_s = _cpu_of(pids, groups) + _cpu_s(os.getpid(), children=False) - cpu0
        shared_rss = sum(_rss_mb(p, children=False) for p in pids)
        isolated = [_rss_mb(g, children=True) for g in groups]
    finally:
        feeder.stop_event.set()
        try:
            runner.close()
        except TimeoutError as exc:  # a query slow to stop on a saturated machine: the point's figures stand
            bench.log(f"{isolation} × {n}: closing the runner: {str(exc).splitlines()[0]}")
    worst = {t: max(v, default=None) for t, v in batches.items()}
    p90 = {t: _p90(v) for t, v in batches.items()}
    kept_up = not ended_early and all(w is not None and w < TRIGGER_S * 1000 for w in p90.values())
    per_pipeline = (shared_rss / n) if isolation == "shared" else (statistics.median(isolated) if isolated else None)
    seen_n = sum(len(v) for v in batches.values())
    doc = {
        "isolation": isolation,
        "pipelines": n,
        "kept_up": kept_up,
        "ended_early": ended_early,
        "measured_s": round(measured_s, 1),
        "worst_batch_ms": max((w for w in worst.values() if w is not None), default=None),
        "p90_batch_ms": max((w for w in p90.values() if w is not None), default=None),
        "median_batch_ms": statistics.median([b for v in batches.values() for b in v] or [0]),
        "batches_seen": seen_n,
        "cpu_s_per_batch": round(cpu_s / seen_n, 3) if seen_n else None,
        "cores_used": round(cpu_s / measured_s, 2) if measured_s > 0 else None,
        "phases_mean_ms": {k: round(statistics.mean(v)) for k, v in sorted(phases.items())},
        "rss_per_pipeline_mb": round(per_pipeline, 1) if per_pipeline else None,
        "shared_jvm_rss_mb": round(shared_rss, 1),
        "isolated_rss_mb": [round(x, 1) for x in sorted(isolated)],
        "start_all_s": round(started_s, 1),
        "first_batches_s": first_batch_s,
        "load_average": round(os.getloadavg()[0], 1),
    }
    bench.log(
        f"{isolation} × {n}: {'kept up' if kept_up else 'FELL BEHIND'}, p90 batch {doc['p90_batch_ms']} ms "
        f"(worst {doc['worst_batch_ms']}), {doc['rss_per_pipeline_mb']} MB a pipeline, "
        f"{doc['cpu_s_per_batch']} CPU-s a batch ({doc['cores_used']} cores), load {doc['load_average']}"
    )
    return doc


def _first_batches(runner: Any, tasks: list[str], timeout_s: float) -> float | None:
    """Seconds until every pipeline has run its first batch (an isolated driver's JVM starts and compiles
    first), at most ``timeout_s``; None if some had not by then (the point then measures them as they are)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if all(runner.status(t).metrics.get("last_batch_id") is not None for t in tasks):
            return round(time.monotonic() - t0, 1)
        time.sleep(POLL_S)
    return None


def _cpu_of(pids: set[int], groups: set[int]) -> float:
    return sum(_cpu_s(p, children=False) for p in pids) + sum(_cpu_s(g, children=True) for g in groups)


def _p90(values: list[int]) -> int | None:
    """The batch duration 9 batches in 10 stay under (a lone slow batch, a collection, is not falling behind)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def sweep(isolation: str, sizes: tuple[int, ...], point_s: float, bench: Bench) -> list[dict[str, Any]]:
    import psutil

    out = []
    for n in sizes:
        if isolation == "process" and psutil.virtual_memory().available / 2**20 < n * 700 + MIN_FREE_MB:
            bench.log(f"{isolation} × {n}: not started, {n} drivers would not leave {MIN_FREE_MB} MB free")
            break
        doc = point(n, isolation, point_s, warmup_s=min(30.0, max(20.0, point_s / 4)), bench=bench)
        out.append(doc)
        descending = len(sizes) > 1 and sizes[0] > sizes[-1]
        if doc["kept_up"] == descending:  # upwards: the first to fall behind ends it; downwards: the first to keep up
            break
    return sorted(out, key=lambda p: int(p["pipelines"]))


def goal_sweep(isolated_knee: int, point_s: float, bench: Bench) -> list[dict[str, Any]]:
    """The shared session where the goal puts it: ``GOAL`` times the isolated knee first; kept up, half as many
    again above it (how far past the goal); fallen behind, three times the knee (where below the goal the
    knee is). Two points of 5 minutes instead of a sweep from 1, which would not fit in half an hour."""
    at_goal = GOAL * max(1, isolated_knee)
    first = sweep("shared", (at_goal,), point_s, bench)
    second_n = at_goal + at_goal // 2 if first and first[0]["kept_up"] else 3 * max(1, isolated_knee)
    return sorted(first + sweep("shared", (second_n,), point_s, bench), key=lambda p: int(p["pipelines"]))


HEADERS = (
    "isolation",
    "pipelines",
    "kept up",
    "p90 batch ms",
    "worst ms",
    "median ms",
    "RSS/pipeline MB",
    "CPU-s/batch",
    "cores used",
    "load avg",
)


def rows_of(points: list[dict[str, Any]]) -> list[list[Any]]:
    """The table's rows, one per point, in ``HEADERS`` order."""
    keys = (
        "p90_batch_ms",
        "worst_batch_ms",
        "median_batch_ms",
        "rss_per_pipeline_mb",
        "cpu_s_per_batch",
        "cores_used",
        "load_average",
    )
    return [[p["isolation"], p["pipelines"], "yes" if p["kept_up"] else "no", *(p[k] for k in keys)] for p in points]


def knee(points: list[dict[str, Any]]) -> int:
    return max((p["pipelines"] for p in points if p["kept_up"]), default=0)


def _plot(bench: Bench, shared: list[dict[str, Any]], isolated: list[dict[str, Any]]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, pts, style in (("shared session", shared, "o-"), ("isolated drivers", isolated, "s--")):
        if pts:
            ax.plot([p["pipelines"] for p in pts], [(p["p90_batch_ms"] or 0) / 1000 for p in pts], style, label=name)
    ax.axhline(TRIGGER_S, color="grey", linestyle=":", label="trigger interval (5 s)")
    ax.set_xlabel("streaming pipelines on one broker")
    ax.set_ylabel("batch duration, 90th percentile (s)")
    ax.set_title("B11: pipelines per broker before batches fall behind")
    ax.legend()
    out = bench.png(NAME)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out.name


def run(bench: Bench) -> dict[str, Any]:
    point_s = float(os.environ.get("B11_POINT_S", 40.0 if bench.quick else 300.0))
    isolated_sizes = _sizes("B11_ISOLATED", QUICK_ISOLATED if bench.quick else FULL_ISOLATED)
    isolated = sweep("process", isolated_sizes, point_s, bench)
    if os.environ.get("B11_SHARED") or bench.quick:
        shared = sweep("shared", _sizes("B11_SHARED", QUICK_SHARED), point_s, bench)
    else:
        shared = goal_sweep(knee(isolated), point_s, bench)
    print(table(HEADERS, rows_of(shared + isolated)))
    k_shared, k_isolated = knee(shared), knee(isolated)
    ended = {
        "shared": "fell behind" if shared and not shared[-1]["kept_up"] else "sizes ended",
        "isolated": "fell behind" if isolated and not isolated[-1]["kept_up"] else "sizes ended (a lower bound)",
    }
    ratio = (k_shared / k_isolated) if k_isolated else None
    doc = {
        "point_s": point_s,
        "trigger_s": TRIGGER_S,
        "master": _master(),
        "shared": shared,
        "isolated": isolated,
        "knee_shared": k_shared,
        "knee_isolated": k_isolated,
        "sweep_ended": ended,
        "plot": _plot(bench, shared, isolated),
        "targets": [
            target(
                "B11 pipelines per broker, shared vs isolated (same lag bound)",
                f"{k_shared} vs {k_isolated}",
                "shared ≥ 5× isolated",
                None if ratio is None else ratio >= 5,
                note=f"sweeps: shared {ended['shared']}, isolated {ended['isolated']}",
                quick_size=bench.quick,
            )
        ],
    }
    bench.write(NAME, doc)
    return doc


if __name__ == "__main__":
    import sys

    from benchmarks.common import machine_info, quiet_logging

    quiet_logging()
    b = Bench(quick="--quick" in sys.argv, machine=machine_info())
    if b.quick:
        b = Bench(quick=True, machine=b.machine, out_dir=b.out_dir / "quick")
    run(b)
