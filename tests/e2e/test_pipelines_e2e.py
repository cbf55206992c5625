"""The pipeline issue's "done when", end to end: a real ZooKeeper, a controller, worker *processes* on the
spark runner (``python -m cli.main broker run --runner spark``), real Spark reading and writing real files.

One module-scoped cluster serves every scenario: the controller runs in this process; workers A (and B,
started and killed by the first test) form the ``default`` group and run streaming pipelines in their own
Spark JVMs; workers C and D form the ``sdp`` group and run a Spark Declarative Pipelines project (each of its
runs is a Spark Connect server the owner starts, so C and D never start a Spark JVM of their own). The
tables and sinks are verified with the shared SparkSession of ``tests/spark_support.py``.

1. Streaming, moved twice, exactly once: two pipelines run on A; B joins and one moves to B (cooperative:
   the other is never interrupted); B is killed with SIGKILL and, once its session expired, the task moves
   back to A and resumes from its checkpoint. Every generated id is in each sink exactly once.
2. A runtime SQL failure: restarted with growing backoff, then FAILED with Spark's error and trace, while
   the healthy task on the same worker keeps running.
3. A Declarative Pipelines task: its worker is killed mid-run; the next owner's run completes, the tables
   hold every record once, and the two owners' runs never overlap.

Every process is stopped by its id (its process group), also on failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker_sim.sim.checker import close_open, double_ownership
from broker_sim.sim.datagen import Datagen, DatagenConfig, generate
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, task_records
from controller.protocol.records.task_records import MAX_FAILURE_TRACE_CHARS, RunInterval, TaskStatus
from controller.protocol.tasks.spec import DeclarativePipeline, TaskSpec, parse_spec
from controller.zk.client import ZkSettings
from controller.zk.layout_io import list_tasks
from tests.cli_support import ok
from tests.spark_brokers import SESSION_S, WORKER_SPARK, controlled_root, start_spark_broker, stop_brokers
from tests.spark_support import REPO, copy_project, files_task, require_spark, sink_ids
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped by whoever inherited it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# ---- the cluster ----------------------------------------------------------------------------------------------
@dataclass
class Cluster:
    root: str
    settings: ZkSettings
    env: dict[str, str]
    workdir: Path
    zk: KazooClient
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    killed: dict[str, float] = field(default_factory=dict)
    sdp_pids: set[int] = field(default_factory=set)  # Spark Connect servers seen in statuses (cleanup net)

    @property
    def layout(self) -> ZkLayout:
        return ZkLayout(self.root)

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.zk, self.layout)

    # ---- processes --------------------------------------------------------------------------------------
    def start_worker(self, bid: str, group: str = "default", lazy: bool = False) -> subprocess.Popen:
        args = ["--group", group, *WORKER_SPARK, *(["--lazy-session"] if lazy else [])]
        proc = start_spark_broker(bid, self.env, self.workdir, self.workdir / "logs" / f"{bid}.log", *args)
        self.procs[bid] = proc
        return proc

    def kill9(self, bid: str) -> float:
        """SIGKILL the worker's process group (the worker and its Spark JVM), as a crash would."""
        proc = self.procs[bid]
        os.killpg(proc.pid, signal.SIGKILL)
        at = time.time()
        proc.wait(10)
        self.killed[bid] = at
        return at

    def stop_all(self) -> None:
        """SIGTERM (controlled shutdown) to every live worker at once, then each is waited for by its id and
        SIGKILLed (its whole group) if it is still there after the grace."""
        stop_brokers(self.procs.values())
        for pid in self.sdp_pids:  # a Spark Connect server must not outlive its worker; make sure of it
            if _alive(pid) and b"SparkConnectServer" in _cmdline(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # ---- the cluster's view -----------------------------------------------------------------------------
    def owner(self, t: str) -> str | None:
        try:
            data, _ = self.zk.get(self.layout.task_owner(t))
        except NoNodeError:
            return None
        return codecs.decode(task_records.OwnerInfo, data).broker

    def status(self, t: str) -> TaskStatus | None:
        try:
            data, _ = self.zk.get(self.layout.status(t))
        except NoNodeError:
            return None
        st = codecs.decode(TaskStatus, data)
        if isinstance(st.metrics.get("server_pid"), int):
            self.sdp_pids.add(st.metrics["server_pid"])
        return st

    def running_on(self, t: str, broker: str) -> TaskStatus | None:
        """The task's status if ``broker`` owns it and reports it RUNNING, else None."""
        st = self.status(t)
        if self.owner(t) == broker and st is not None and st.broker == broker and st.state == "RUNNING":
            return st
        return None

    def live_brokers(self) -> set[str]:
        return set(self.zk.get_children(self.layout.broker_ids))

    def intervals(self, task: str) -> list[RunInterval]:
        """The task's recorded run intervals (every broker flushes its own every 2 s), oldest first; a killed
        broker's runs that were still open end when it was killed."""
        out = []
        for i in self.admin.intervals():
            if i.task_id != task:
                continue
            if i.end is None and i.broker in self.killed:
                at = self.killed[i.broker]
                i = RunInterval(
                    task_id=i.task_id,
                    broker=i.broker,
                    start=i.start,
                    end=at,
                    generation=i.generation,
                    acquired=i.acquired,
                    released=at,
                )
            out.append(i)
        return out

    def diagnostics(self) -> str:
        lines = []
        try:
            lines.append(f"live brokers: {sorted(self.live_brokers())}")
            for t in list_tasks(self.zk, self.layout):
                st = self.status(t)
                lines.append(
                    f"{t}: owner={self.owner(t)} status="
                    + (
                        f"{st.broker}/{st.state} failures={st.failures} error={(st.error or '')[:200]!r} "
                        f"metrics={ {k: v for k, v in st.metrics.items() if k not in ('flows',)} }"
                        if st
                        else "-"
                    )
                )
        except Exception as exc:  # diagnostics must not hide the real failure
            lines.append(f"(cluster view failed: {exc!r})")
        for name in self.procs:
            log = self.workdir / "logs" / f"{name}.log"
            tail = log.read_text(errors="replace").splitlines()[-12:] if log.exists() else []
            lines.append(f"--- {name} (exit {self.procs[name].poll()}) log tail:\n" + "\n".join(tail))
        return "\n".join(lines)

    def until(self, cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
        """Poll ``cond`` until it returns something truthy; fail with the cluster's view after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() >= deadline:
                pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{self.diagnostics()}", pytrace=False)
            time.sleep(interval)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def cluster(zk_hosts: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """ZooKeeper root, controller (in this process), worker A (group default), workers C and D (group sdp)."""
    require_spark()
    workdir = tmp_path_factory.mktemp("e2e")
    (workdir / "logs").mkdir()
    with controlled_root(zk_hosts, workdir, "e2e") as r:
        c = Cluster(root=r.root, settings=r.settings, env=r.env, workdir=workdir, zk=r.zk)
        try:
            for bid, group in (("A", "default"), ("C", "sdp"), ("D", "sdp")):
                c.start_worker(bid, group, lazy=group == "sdp")  # C and D run Spark Connect servers, no session
            c.until(lambda: c.live_brokers() >= {"A", "C", "D"}, 90, "workers A, C and D to register")
            yield c
        finally:
            c.stop_all()


# ---- 1. streaming, moved twice, exactly once ---------------------------------------------------------------
def test_streaming_task_moved_twice_keeps_every_record_exactly_once(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    c = cluster
    assert c.live_brokers() & {"A", "B"} == {"A"}, "the test starts with worker A alone in its group"
    tasks = ("stream-1", "stream-2")
    specs, gens = [], {}
    for i, t in enumerate(tasks):
        src = tmp_path / "in" / t
        src.mkdir(parents=True)
        specs.append(
            parse_spec(
                files_task(
                    t,
                    src,
                    tmp_path / "out" / t,
                    f"SELECT id, key, value * {i + 2} AS scaled FROM input WHERE value >= 0",
                    max_files=3,
                    trigger={"processing_time": "1 second"},
                )
            )
        )
        # 20 records/s in files of 20: the query (up to 3 files a second) outpaces the generator, so it
        # catches up after every move; distinct id ranges per pipeline
        gens[t] = Datagen(
            DatagenConfig(out_dir=str(src), records=100_000, rate=20, batch=20, start_id=(i + 1) * 1_000_000)
        )
    t0 = time.time()
    c.admin.create_tasks(specs)
    for g in gens.values():
        g.start()
    run_ids: dict[str, set[str]] = {t: set() for t in tasks}

    def flowing(t: str, broker: str) -> TaskStatus | None:
        st = c.running_on(t, broker)
        if st is None or st.metrics.get("rows", 0) <= 0 or st.metrics.get("run_id") in run_ids[t]:
            return None
        return st

    try:
        firsts = c.until(
            lambda: all(sts := [flowing(t, "A") for t in tasks]) and sts,
            240,
            "both pipelines to run on A with rows flowing",
        )
        for t, st in zip(tasks, firsts):
            run_ids[t].add(st.metrics["run_id"])
        on_a_at = time.time()

        # B joins: a cooperative rebalance moves exactly one task to it
        b_started = time.time()
        c.start_worker("B")
        moved = c.until(lambda: [t for t in tasks if flowing(t, "B")], 240, "one pipeline to move to B")
        assert len(moved) == 1, moved
        moved_task = moved[0]
        stayed = next(t for t in tasks if t != moved_task)
        run_ids[moved_task].add(c.status(moved_task).metrics["run_id"])
        on_b_at = time.time()
        assert c.running_on(stayed, "A"), "the other pipeline stays on A"
        c.until(lambda: any(i.broker == "B" for i in c.intervals(moved_task)), 30, "B to record its run")

        # kill -9 B: once its session has expired, the task goes back to A and resumes from its checkpoint
        killed_at = c.kill9("B")
        back = c.until(lambda: flowing(moved_task, "A"), 120, "the moved pipeline to run on A again")
        back_at = time.time()
        assert back.metrics["query_id"] == firsts[tasks.index(moved_task)].metrics["query_id"], (
            "the query resumed from its checkpoint (same query id)"
        )
        written = {t: g.stop() for t, g in gens.items()}
    finally:
        for g in gens.values():
            if not g.done:
                g.stop()

    # catch up, then every generated id exactly once (read through each sink's _spark_metadata log)
    expected = {t: set(written[t].ids()) for t in tasks}
    assert all(len(e) >= 200 for e in expected.values()), {t: len(e) for t, e in expected.items()}
    outs = {t: tmp_path / "out" / t for t in tasks}
    c.until(
        lambda: all(set(sink_ids(spark, outs[t])) >= expected[t] for t in tasks),
        180,
        "the pipelines to catch up with the generator",
        interval=2.0,
    )
    for t in tasks:
        ids = sink_ids(spark, outs[t])
        held = set(ids)
        assert len(ids) == len(held), f"{t}: {len(ids) - len(held)} duplicated ids"
        assert held == expected[t], f"{t}: missing {len(expected[t] - held)}, foreign {len(held - expected[t])}"

    # the moved task ran on A, then B, then A again, never on two at once; the other one never stopped
    c.until(lambda: len(c.intervals(moved_task)) >= 3, 30, "the intervals to be flushed")
    runs = c.intervals(moved_task)
    assert [i.broker for i in runs] == ["A", "B", "A"], runs
    assert double_ownership(close_open(runs, time.time())) == []
    assert runs[1].start >= b_started and runs[2].start >= killed_at + SESSION_S / 2, (
        "the task left B only after B's session could have expired"
    )
    stayed_runs = c.intervals(stayed)
    assert len(stayed_runs) == 1 and stayed_runs[0].broker == "A" and stayed_runs[0].end is None, stayed_runs
    print(
        f"\n[e2e streaming] on A {on_a_at - t0:.1f}s after create; B started -> task running on B "
        f"{on_b_at - b_started:.1f}s (B's JVM start included); kill -9 B -> running on A again "
        f"{back_at - killed_at:.1f}s; downtime of {moved_task}: {runs[1].start - runs[0].end:.1f}s and "
        f"{runs[2].start - killed_at:.1f}s; records: " + ", ".join(f"{t}={len(expected[t])}" for t in tasks)
    )
    for t in tasks:
        c.admin.delete_task(t, wait=60)


# ---- 2. a runtime SQL failure -------------------------------------------------------------------------------
def test_runtime_sql_failure_backs_off_then_fails_while_its_neighbour_runs(cluster: Cluster, tmp_path: Path) -> None:
    c = cluster
    generate(DatagenConfig(out_dir=str(tmp_path / "bad-in"), records=40, batch=20))
    max_failures = 3
    healthy = parse_spec(
        {
            "id": "healthy",
            "pipeline": {
                "kind": "spark",
                "source": {"type": "rate", "rows_per_second": 10},
                "transform": {"sql": "SELECT value AS id, timestamp FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(tmp_path / "healthy-out")},
                "trigger": {"processing_time": "1 second"},
            },
        }
    )
    poison = parse_spec(
        {
            **files_task(
                "poison",
                tmp_path / "bad-in",
                tmp_path / "bad-out",
                "SELECT CASE WHEN id >= 0 THEN raise_error(concat('bad record ', id)) ELSE id END AS id FROM input",
            ),
            "restart": {"max_attempts": max_failures, "backoff_initial_s": 0.5},
        }
    )
    live = c.live_brokers() & {"A", "B"}
    assert live == {"A"}, live
    c.admin.create_tasks([healthy, poison])
    try:
        c.until(
            lambda: (st := c.running_on("healthy", "A")) and st.metrics.get("rows", 0) > 0,
            180,
            "the healthy task to run on A",
        )
        failed = c.until(
            lambda: (st := c.status("poison")) and st.state == "FAILED" and st,
            180,
            "the poisoned task to fail for good",
        )
        assert c.owner("poison") == "A" and failed.broker == "A", "both tasks on one worker"
        assert failed.failures == max_failures + 1, failed
        assert "USER_RAISED_EXCEPTION" in failed.error and "bad record" in failed.error, failed.error
        assert failed.trace and "org.apache.spark" in failed.trace, failed.trace
        # why it failed: the cause's class, a bounded trace that names it, when, and the restarts before it
        why = failed.last_failure
        assert why is not None and why.restarts == max_failures and why.at <= failed.updated, why
        assert "USER_RAISED_EXCEPTION" in why.error and why.kind.startswith("org.apache.spark."), why
        assert why.trace and "bad record" in why.trace and len(why.trace) <= MAX_FAILURE_TRACE_CHARS, why.trace
        assert c.admin.describe_task("poison").last_failure == codecs.to_jsonable(why)
        described = ok(c.env, "task", "describe", "poison")
        assert f"{why.kind}: " in described and "USER_RAISED_EXCEPTION" in described and "Trace:" in described

        # the neighbour is untouched: still its first run, rows still growing
        before = c.status("healthy")
        c.until(
            lambda: (st := c.running_on("healthy", "A")) and st.metrics["rows"] >= before.metrics["rows"] + 20,
            60,
            "the healthy task's rows to keep growing",
        )
        assert c.status("healthy").metrics["run_id"] == before.metrics["run_id"]
        runs = c.until(
            lambda: len(r := c.intervals("poison")) == max_failures + 1 and r,
            30,
            "every failed run of the poisoned task to be recorded",
        )
        assert {i.broker for i in runs} == {"A"}
        gaps = [round(b.start - a.end, 2) for a, b in zip(runs, runs[1:])]
        backoff = [poison.restart.delay_before(k + 1) for k in range(max_failures)]  # 0.5 s, doubling
        assert all(g >= d - 0.05 for g, d in zip(gaps, backoff)), (gaps, backoff)
        assert gaps[-1] > gaps[0], f"the gaps between retries grow: {gaps}"
        healthy_runs = c.intervals("healthy")
        assert len(healthy_runs) == 1 and healthy_runs[0].end is None, healthy_runs
        print(
            f"\n[e2e failure] {failed.failures} failures, gaps between runs {gaps}s (backoff {backoff}s); "
            f"error: {failed.error[:120]!r}; healthy rows {before.metrics['rows']} -> "
            f"{c.status('healthy').metrics['rows']}"
        )
    finally:
        for t in ("healthy", "poison"):
            c.admin.delete_task(t, wait=60)


# ---- 3. Spark Declarative Pipelines ---------------------------------------------------------------------------
def test_declarative_task_survives_kill_dash_nine_of_its_worker_mid_run(
    cluster: Cluster, spark: Any, tmp_path: Path
) -> None:
    c = cluster
    project = copy_project("sdp_project", tmp_path / "project")
    generate(DatagenConfig(out_dir=str(project / "input"), records=2000, batch=250))
    tid = "sdp-counts"
    spec = TaskSpec(
        id=tid, group="sdp", pipeline=DeclarativePipeline(kind="declarative", project=str(project), interval_s=3.0)
    )
    # written as `AdminClient.create_tasks` writes it, without its Spark dry-run of the project (a JVM start
    # that tests/e2e/test_spark_declarative.py covers)
    c.zk.create(c.layout.task(tid), spec.encode())
    try:

        def mid_run() -> TaskStatus | None:
            st = c.status(tid)
            m = st.metrics if st else {}
            writing = any(state in ("RUNNING", "COMPLETED") for state in m.get("flows", {}).values())
            if (
                st
                and st.state == "RUNNING"
                and m.get("last_run_state") == "RUNNING"
                and writing
                and c.owner(tid) == st.broker
            ):
                return st
            return None

        first = c.until(mid_run, 240, "a run of the declarative task to have its flows writing")
        victim = first.broker
        heir = ({"C", "D"} - {victim}).pop()
        c.until(lambda: any(i.broker == victim for i in c.intervals(tid)), 30, f"{victim} to record its run")
        killed_at = c.kill9(victim)
        at_kill = c.status(tid)
        assert at_kill.broker == victim and at_kill.metrics["last_run_state"] == "RUNNING", (
            "the victim's last word: its run was in progress"
        )
        server_pid = first.metrics["server_pid"]

        c.until(lambda: c.owner(tid) == heir, 60, f"the next owner ({heir}) to take the task")
        assert not _alive(server_pid), (
            f"the killed worker's Spark Connect server (pid {server_pid}) outlived it and holds the project"
        )
        # a status whose latest run is the completed one (the next run starts 3 s later)
        done = c.until(
            lambda: (st := c.running_on(tid, heir)) and st.metrics.get("last_run_ok") and st,
            300,
            f"a run of the next owner ({heir}) to complete",
        )
        assert done.metrics["runs_ok"] >= 1 and done.metrics["flows_failed"] == 0, done.metrics
        assert set(done.metrics["flows"]) == {"spark_catalog.default.raw_events", "spark_catalog.default.key_counts"}
        c.admin.delete_task(tid, wait=60)  # the owner stops its server: the tables are at rest
    finally:
        if c.zk.exists(c.layout.task(tid)):
            c.admin.delete_task(tid, wait=60)

    runs = c.until(lambda: len(r := c.intervals(tid)) >= 2 and r, 30, "both owners' runs to be recorded")
    assert [i.broker for i in runs] == [victim, heir], runs
    assert double_ownership(runs) == [], "two owners ran the project at once"
    assert runs[1].start >= killed_at, runs
    ids = sorted(
        r.id for r in spark.read.parquet(str(project / "spark-warehouse" / "raw_events")).select("id").collect()
    )
    assert ids == list(range(2000)), "raw_events must hold every record exactly once"
    counts = {r.key: r.n for r in spark.read.parquet(str(project / "spark-warehouse" / "key_counts")).collect()}
    assert counts == {f"k{i}": 200 for i in range(10)}
    print(
        f"\n[e2e sdp] killed {victim} during run {at_kill.metrics.get('last_run')} "
        f"(state {at_kill.metrics.get('last_run_state')}, flows {at_kill.metrics.get('flows')}); {heir} started "
        f"{runs[1].start - killed_at:.1f}s after the kill; its first run took {done.metrics['last_run_s']:.1f}s "
        f"(server start {done.metrics.get('server_start_s')}s)"
    )


# ---- the fix scenario 3 needed, on its own (fast) --------------------------------------------------------------
def test_spawned_children_die_with_their_killed_parent() -> None:
    """``spawn(..., die_with_parent=True)``: a child in its own session (out of reach of a kill of its parent's
    process group) is SIGKILLed when the parent dies, even when the thread that asked for it ended long ago."""
    script = (
        "import sys, threading\n"
        "from broker_sim.runners.procs import spawn\n"
        "out = {}\n"
        "t = threading.Thread(target=lambda: out.update(p=spawn(['sleep', '120'], die_with_parent=True)))\n"
        "t.start(); t.join()\n"
        "print(out['p'].pid, flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _alive(child), "the child outlives the thread that spawned it"
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: not _alive(child), 10, "the child to end with its parent's kill -9")
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait(10)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
