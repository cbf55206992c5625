"""``zkctl demo``: the README's main job — the whole product on one machine.

An embedded ZooKeeper, two controller candidates and three brokers as separate processes, a data
generator, and four streaming pipelines (JSON files -> SQL -> parquet) on local Spark. It shows live
progress, kills one broker (kill -9) and the active controller (kill -9), shows the tasks move and the
standby controller take over, then checks that every sink holds every generated record exactly once.
Everything it started is stopped by pid at the end, also on Ctrl-C. ``--runner noop`` is a fast version
with simulated tasks, checked for double ownership instead of records.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from broker_sim.runners.spark import DEFAULT_STOP_BUDGET_S
from broker_sim.sim.checker import close_open, double_ownership
from cli.common import table
from controller.admin import AdminClient, ensure_layout, wait_for
from controller.admin.interval_ends import settled_intervals
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.errors import ZkcError
from controller.protocol.records import codecs, payload_validation, registration_records, task_records
from controller.protocol.tasks.pipeline_metrics import figures, load_text
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec, parse_spec
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import get_many
from controller.zk.server import ZooKeeperServer, free_port

if TYPE_CHECKING:  # the data generator is imported by the spark demo only
    from broker_sim.sim.datagen import Datagen

SESSION_S = 2 * DEFAULT_STOP_BUDGET_S  # the spark runner asks for twice its stop budget (worker.fence_margin)
PIPELINES = 4


class DemoFailed(ZkcError):
    """The demo could not go on (a broker's session failed, a wait ran out): said in one line, not a traceback."""


@dataclass
class Demo:
    state_dir: Path
    runner: str = "spark"
    records: int = 3000
    rate: float = 150.0
    echo: Callable[[str], None] = click.echo
    root: str = "/demo"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    server: ZooKeeperServer | None = None
    t0: float = field(default_factory=time.monotonic)
    killed: dict[str, float] = field(default_factory=dict)
    api_port: int = 8083
    start_timeout: float = 420.0  # Spark sessions and the first starts, on a busy machine
    _shape: tuple[tuple[str, str | None, str], ...] = ()  # (task, owner, state) of the table last shown
    _shown_at: float = 0.0

    # ---- processes --------------------------------------------------------------------------------
    def _zkctl(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        assert self.server is not None, "the embedded ZooKeeper starts first"
        log = open(self.state_dir / "logs" / f"{name}.log", "ab")
        env = dict(
            os.environ,
            ZKC_ZK=self.server.address,
            ZKC_ROOT=self.root,
            ZKC_STATE_DIR=str(self.state_dir),
            PYTHONUNBUFFERED="1",
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def _kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.killed[name] = time.time()

    def stop_all(self) -> None:
        """Brokers first (SIGTERM = controlled shutdown, which needs a live controller), then the
        controllers, then ZooKeeper; anything that does not exit in time is killed, always by pid."""
        for kind in ("broker", "ctl", "api"):
            group = {n: p for n, p in self.procs.items() if n.startswith(kind) and p.poll() is None}
            for proc in group.values():
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for proc in group.values():
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        if self.server is not None:
            self.server.stop()

    def say(self, msg: str) -> None:
        try:
            self.echo(f"[{time.monotonic() - self.t0:6.1f}s] {msg}")
        except OSError:  # the reader went away (``| head``): carry on silently, and still stop everything
            self.echo = lambda _text: None

    # ---- the cluster's view -----------------------------------------------------------------------
    def view(self, client: Any, layout: ZkLayout, tasks: list[str]) -> dict[str, Any]:
        try:
            data, _ = client.get(layout.controller)
            ctl = codecs.decode(registration_records.ControllerInfo, data)
            controller = f"{ctl.controller_id}@epoch{ctl.epoch}"
        except Exception:
            controller = "none"
        owners = get_many(client, [layout.task_owner(t) for t in tasks])
        statuses = get_many(client, [layout.status(t) for t in tasks])
        by_task: dict[str, dict[str, Any]] = {}
        for t, o, s in zip(tasks, owners, statuses):
            owner = codecs.decode(task_records.OwnerInfo, o[0]).broker if o else None
            st = codecs.decode(task_records.TaskStatus, s[0]) if s else None
            state = st.state if st else "UNASSIGNED" if owner is None else "ASSIGNED"  # (no status written yet)
            if owner is not None and owner in self.killed:
                state = "LOST"  # we killed it: its owner znode lasts until its session expires
            batches = st.metrics.get("batches") if st and st.broker == owner else None
            load = load_text(figures(st.metrics)) if st and st.broker == owner else ""
            by_task[t] = {
                "owner": owner,
                "state": state,
                "batches": batches if isinstance(batches, int) else None,
                "load": load or "-",
            }
        return {"controller": controller, "tasks": by_task, "sessions": self.sessions(client, layout)}

    def sessions(self, client: Any, layout: ZkLayout) -> dict[str, registration_records.SessionInfo | None]:
        """Each registered broker's compute session (None: none, or a registration that does not decode)."""
        ids = sorted(client.get_children(layout.broker_ids))
        out: dict[str, registration_records.SessionInfo | None] = {}
        for b, res in zip(ids, get_many(client, [layout.broker(b) for b in ids])):
            if res is not None:
                try:
                    out[b] = codecs.decode(registration_records.BrokerInfo, res[0]).session
                except payload_validation.PayloadError:
                    out[b] = None
        return out

    def running(self, d: dict[str, Any]) -> bool:
        """A pipeline runs once its owner reports RUNNING and (spark) its first batch is committed."""
        return bool(d["owner"]) and d["state"] == "RUNNING" and (self.runner != "spark" or bool(d["batches"]))

    def waits(self, v: dict[str, Any]) -> str:
        """What the pipelines and brokers wait for, one clause each: ``session starting broker-2 (6s)``,
        ``first batch pipeline-3``, ``a broker pipeline-4``."""
        starting = [
            f"{b} ({time.time() - s.since:.0f}s)"
            for b, s in sorted(v["sessions"].items())
            if s is not None and s.state is registration_records.SessionState.STARTING and b not in self.killed
        ]
        by_wait: dict[str, list[str]] = {}
        for t, d in v["tasks"].items():
            if self.running(d):
                continue
            if d["owner"] is None or d["state"] in ("UNASSIGNED", "LOST"):
                wait = "a broker"
            elif d["state"] in ("ASSIGNED", "STARTING"):
                wait = "its start"
            elif d["state"] == "RUNNING":
                wait = "first batch"
            else:
                wait = d["state"].lower()
            by_wait.setdefault(wait, []).append(t)
        parts = [f"session starting {', '.join(starting)}"] if starting else []
        parts += [f"{w} {', '.join(ts)}" for w, ts in by_wait.items()]
        return "; ".join(parts)

    def sink_rows(self, task: str) -> int | None:
        """Rows the task's sink holds (committed files only): counted across moves, whoever wrote them
        (a run's own counter starts again at 0 on every broker the pipeline moves to)."""
        if self.runner != "spark":
            return None
        import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type information

        from broker_sim.chaos.sinks import committed_files

        total = 0
        for f in committed_files(self.state_dir / "output" / task):
            try:
                total += pq.ParquetFile(str(f)).metadata.num_rows
            except (OSError, ValueError):
                continue  # being written or removed as we look
        return total

    def progress(self, client: Any, layout: ZkLayout, tasks: list[str], note: str = "") -> dict[str, Any]:
        """One status line; the tasks' table below it when an owner or a state changed (or every 10 s)."""
        v = self.view(client, layout, tasks)
        running = sum(1 for d in v["tasks"].values() if self.running(d))
        waits = self.waits(v)
        self.say(
            f"controller {v['controller']}: {running}/{len(tasks)} tasks running"
            + (f" -- {note}" if note else "")
            + (f" (waiting for: {waits})" if waits else "")
        )
        shape = tuple((t, d["owner"], d["state"]) for t, d in v["tasks"].items())
        if shape != self._shape or time.monotonic() - self._shown_at >= 10.0:
            self._shape, self._shown_at = shape, time.monotonic()
            spark = self.runner == "spark"
            rows = [
                [t, d["owner"] or "-", d["state"], d["load"]] + ([self.sink_rows(t)] if spark else [])
                for t, d in v["tasks"].items()
            ]
            heads = ["TASK", "BROKER", "STATE", "LOAD"] + (["ROWS IN SINK"] if spark else [])
            for line in table(heads, rows).splitlines():
                self.echo(" " * 10 + line)
        return v

    # ---- the run ----------------------------------------------------------------------------------
    def run(self) -> int:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        self.server = ZooKeeperServer(data_dir=self.state_dir / "zookeeper", port=free_port())
        self.server.start()
        self.say(f"embedded ZooKeeper on {self.server.address} (pid {self.server.read_pid()})")
        layout = ZkLayout(self.root)
        client: Any = None
        datagen = None
        try:  # from here on, whatever fails, everything started is stopped (ZooKeeper included)
            settings = ZkSettings(hosts=self.server.address, root=self.root, session_timeout_s=SESSION_S)
            client = make_client(settings)
            ensure_layout(client, layout)  # as `zkctl init`: the API and the brokers refuse a root never set up
            port = _port_or_free(self.api_port)
            self._zkctl("api", "api", "run", "--port", str(port))
            self.say(
                f"web console: http://127.0.0.1:{port}/  (API http://127.0.0.1:{port}/api/v1, live; open it to "
                "watch the kills and the moves)"
            )
            for c in ("ctl-A", "ctl-B"):
                self._zkctl(
                    c, "controller", "run", "--id", c, "--session-timeout", str(SESSION_S), "--rebalance-timeout", "20"
                )
                time.sleep(0.3)  # ctl-A wins; ctl-B stands by
            assert wait_for(lambda: client.exists(layout.controller) is not None, 30), "no controller became active"
            broker_args = ["--runner", self.runner, "--session-timeout", str(SESSION_S)]
            if self.runner == "spark":
                broker_args += [
                    "--checkpoint-root",
                    str(self.state_dir / "checkpoints"),
                    "--spark-master",
                    "local[1]",
                    "--spark-conf",
                    "spark.driver.memory=512m",
                    "--spark-conf",
                    "spark.sql.shuffle.partitions=1",
                ]
            for b in ("broker-1", "broker-2", "broker-3"):
                self._zkctl(b, "broker", "run", "--id", b, *broker_args)
            assert wait_for(lambda: len(client.get_children(layout.broker_ids)) == 3, 60), "brokers did not register"
            self.say(
                "2 controller candidates and 3 brokers running as processes "
                + " ".join(f"{n}:{p.pid}" for n, p in self.procs.items())
            )
            self._wait_sessions(client, layout)
            tasks, expected, datagen = self._create_pipelines(client, layout)
            created = time.monotonic()
            self.say(f"created {len(tasks)} {'streaming pipelines' if self.runner == 'spark' else 'no-op tasks'}")

            def all_running() -> bool:
                v = self.view(client, layout, tasks)
                return all(self.running(d) for d in v["tasks"].values())

            self._wait_showing(client, layout, tasks, all_running, self.start_timeout, "starting")
            self.say(
                f"all {len(tasks)} pipelines running {time.monotonic() - created:.1f}s after their creation"
                + (" (first batch committed)" if self.runner == "spark" else "")
            )
            self._wait_showing(client, layout, tasks, lambda: False, 8 if self.runner == "spark" else 2, "")
            # kill -9 the broker running the most tasks
            v = self.view(client, layout, tasks)
            counts: dict[str, int] = {}
            for d in v["tasks"].values():
                counts[d["owner"]] = counts.get(d["owner"], 0) + 1
            victim = max(sorted(counts), key=lambda b: counts[b])
            moved = sorted(t for t, d in v["tasks"].items() if d["owner"] == victim)
            self._kill(victim)
            self.say(
                f"KILL -9 {victim} (pid {self.procs[victim].pid}), which ran {moved}; its session expires in ≤{SESSION_S:.0f}s"
            )
            self._wait_showing(
                client,
                layout,
                tasks,
                lambda: all(
                    self.view(client, layout, tasks)["tasks"][t]["owner"] not in (None, victim)
                    and self.view(client, layout, tasks)["tasks"][t]["state"] == "RUNNING"
                    for t in moved
                ),
                120,
                "moving",
            )
            self.say(f"tasks {moved} moved off {victim}")
            # kill -9 the active controller
            data, _ = client.get(layout.controller)
            old = codecs.decode(registration_records.ControllerInfo, data)
            self._kill(old.controller_id)
            self.say(f"KILL -9 controller {old.controller_id} (epoch {old.epoch})")

            def new_controller() -> bool:
                try:
                    info = codecs.decode(registration_records.ControllerInfo, client.get(layout.controller)[0])
                except Exception:
                    return False
                return info.epoch > old.epoch

            self._wait_showing(client, layout, tasks, new_controller, 60, "electing")
            info = codecs.decode(registration_records.ControllerInfo, client.get(layout.controller)[0])
            self.say(f"controller {info.controller_id} took over at epoch {info.epoch}")
            ok = self._finish(client, layout, tasks, expected, datagen)
            return 0 if ok else 1
        finally:
            if datagen is not None:
                for g in datagen:
                    g.stop()
            if client is not None:
                try:
                    client.stop()
                    client.close()
                except Exception:
                    pass
            self.say("stopping everything this demo started")
            self.stop_all()
            self.say(f"done; logs and data in {self.state_dir}")

    def _wait_sessions(self, client: Any, layout: ZkLayout) -> None:
        """Wait for every broker's session (Spark brokers start theirs before they join): the pipelines are
        created on brokers that can run them at once. A session that failed ends the demo with its reason."""
        timeout = self.start_timeout
        deadline = time.monotonic() + timeout
        last = 0.0
        while time.monotonic() < deadline:
            sessions = self.sessions(client, layout)
            failed = {
                b: s.error
                for b, s in sessions.items()
                if s is not None and s.state is registration_records.SessionState.FAILED
            }
            if failed:
                raise DemoFailed(f"a broker's session failed: {failed}")
            starting = {
                b: s
                for b, s in sessions.items()
                if s is not None and s.state is registration_records.SessionState.STARTING
            }
            if not starting:
                took = [f"{b} {s.startup_s:.1f}s" for b, s in sorted(sessions.items()) if s and s.startup_s is not None]
                if took:
                    self.say("brokers' Spark sessions ready: " + ", ".join(took))
                return
            if time.monotonic() - last >= 2.0:
                self.say(
                    "waiting for: session starting "
                    + ", ".join(f"{b} ({time.time() - s.since:.0f}s)" for b, s in sorted(starting.items()))
                )
                last = time.monotonic()
            time.sleep(0.2)
        raise DemoFailed(f"the brokers' sessions did not start in {timeout:.0f}s")

    def _wait_showing(
        self, client: Any, layout: ZkLayout, tasks: list[str], cond: Callable[[], bool], timeout: float, note: str
    ) -> bool:
        deadline = time.monotonic() + timeout
        last = 0.0
        while time.monotonic() < deadline:
            if cond():
                return True
            if time.monotonic() - last >= 2.0:
                self.progress(client, layout, tasks, note)
                last = time.monotonic()
            time.sleep(0.2)
        if note:
            raise DemoFailed(f"timed out after {timeout:.0f}s while {note}")
        return False

    def _create_pipelines(
        self, client: Any, layout: ZkLayout
    ) -> tuple[list[str], dict[str, set[int]], list[Datagen] | None]:
        admin = AdminClient(client, layout)
        tasks = [f"pipeline-{i}" for i in range(1, PIPELINES + 1)]
        if self.runner != "spark":
            admin.create_tasks([TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")) for t in tasks])
            return tasks, {}, None
        from broker_sim.sim.datagen import SCHEMA_DDL, Datagen, DatagenConfig

        specs: list[TaskSpec] = []
        expected: dict[str, set[int]] = {}
        gens: list[Datagen] = []
        for i, t in enumerate(tasks):
            src = self.state_dir / "input" / t
            src.mkdir(parents=True, exist_ok=True)
            specs.append(
                parse_spec(
                    {
                        "id": t,
                        "pipeline": {
                            "kind": "spark",
                            "mode": "streaming",
                            "source": {
                                "type": "files",
                                "format": "json",
                                "path": str(src),
                                "schema": SCHEMA_DDL,
                                "max_files_per_trigger": 4,
                            },
                            "transform": {"sql": f"SELECT id, key, value * {i + 1} AS scaled FROM input WHERE id >= 0"},
                            "sink": {"type": "files", "format": "parquet", "path": str(self.state_dir / "output" / t)},
                            "trigger": {"processing_time": "1 second"},
                        },
                    }
                )
            )
            cfg = DatagenConfig(
                out_dir=str(src), records=self.records, rate=self.rate, batch=50, start_id=i * 1_000_000
            )
            expected[t] = set(cfg.expected_ids())
            gens.append(Datagen(cfg))
        admin.create_tasks(specs)
        for g in gens:
            g.start()
        self.say(
            f"data generator: {self.records} records per pipeline at {self.rate:.0f}/s into {self.state_dir / 'input'}"
        )
        return tasks, expected, gens

    def _finish(
        self,
        client: Any,
        layout: ZkLayout,
        tasks: list[str],
        expected: dict[str, set[int]],
        datagen: list[Datagen] | None,
    ) -> bool:
        if self.runner != "spark":
            admin = AdminClient(client, layout)
            # a killed broker's last flushed intervals are still open: its tasks died with it; a live broker
            # writes the end of a run it let go within its flush interval: read again until those are there
            deadline = time.monotonic() + 10
            while True:
                recorded = [
                    task_records.RunInterval(
                        task_id=i.task_id,
                        broker=i.broker,
                        start=i.start,
                        end=self.killed[i.broker],
                        acquired=i.acquired,
                        released=self.killed[i.broker],
                    )
                    if i.end is None and i.broker in self.killed
                    else i
                    for i in admin.intervals()
                ]
                recorded, pending = settled_intervals(client, layout, recorded)
                if not pending or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            intervals = close_open(recorded, time.time())
            overlaps = double_ownership(intervals)
            self.say(
                f"SUMMARY: {len(tasks)} tasks running after a broker and a controller were killed; "
                f"{len(intervals)} run intervals, double ownership: {len(overlaps)}"
            )
            return not overlaps
        for g in datagen or ():
            g.join(300)
        self.say("data generator finished; waiting for the pipelines to catch up")
        import warnings

        from pyspark.sql import SparkSession

        warnings.filterwarnings("ignore", category=FutureWarning, module="pyspark")
        spark = (
            SparkSession.builder.master("local[1]")
            .appName("zkcontroller-demo-check")
            .config("spark.ui.enabled", "false")
            .config("spark.log.level", "ERROR")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:

            def sink_ids(t: str) -> list[int]:
                path = self.state_dir / "output" / t
                if not (path / "_spark_metadata").exists():
                    return []
                return [r.id for r in spark.read.parquet(str(path)).select("id").collect()]

            deadline = time.monotonic() + 240
            results: dict[str, tuple[int, int, int]] = {}
            while time.monotonic() < deadline:
                results = {}
                for t in tasks:
                    ids = sink_ids(t)
                    got = set(ids)
                    results[t] = (len(expected[t] - got), len(ids) - len(got), len(got - expected[t]))
                if all(missing == 0 for missing, _, _ in results.values()):
                    break
                self.progress(
                    client,
                    layout,
                    tasks,
                    "catching up: missing " + ", ".join(f"{t}={m}" for t, (m, _, _) in results.items()),
                )
                time.sleep(3)
        finally:
            spark.stop()
        ok = all(r == (0, 0, 0) for r in results.values())
        self.say("SUMMARY (exactly once: every generated id in the sink, none twice, none foreign):")
        for t, (missing, dups, foreign) in results.items():
            self.echo(
                f"    {t}: expected {len(expected[t])}, missing {missing}, duplicated {dups}, foreign {foreign}"
                f"  {'OK' if (missing, dups, foreign) == (0, 0, 0) else 'FAIL'}"
            )
        self.say("exactly once: " + ("OK" if ok else "FAILED"))
        return ok


def _port_or_free(port: int) -> int:
    """``port`` if nothing listens on it on loopback, else any free port."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            return free_port()


@click.command("demo")
@click.option(
    "--runner",
    type=click.Choice(["spark", "noop"]),
    default="spark",
    show_default=True,
    help="noop: simulated tasks, a fast version",
)
@click.option(
    "--records",
    type=click.IntRange(1, 10_000_000),
    default=3000,
    show_default=True,
    help="records per pipeline (spark)",
)
@click.option("--rate", type=click.FloatRange(1, 1e6), default=150.0, show_default=True, help="records/s per pipeline")
@click.option(
    "--api-port",
    type=click.IntRange(1, 65535),
    default=8083,
    show_default=True,
    help="port of the web console and API (another free port if it is taken)",
)
@click.option(
    "--start-timeout",
    type=click.FloatRange(10, 3600),
    default=420.0,
    show_default=True,
    help="seconds to wait for the brokers' Spark sessions and the pipelines' first start",
)
@click.pass_obj
def demo(ctx: Any, runner: str, records: int, rate: float, api_port: int, start_timeout: float) -> None:
    """The whole product on one machine: ZooKeeper, 2 controllers, 3 brokers, 4 pipelines, faults, a check,
    and the web console to watch it live."""
    state = Path(ctx.state_dir).absolute() / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"  # sinks: absolute paths
    d = Demo(state_dir=state, runner=runner, records=records, rate=rate, api_port=api_port, start_timeout=start_timeout)
    previous = signal.getsignal(signal.SIGINT)
    try:
        code = d.run()
    except KeyboardInterrupt:
        click.echo("interrupted; everything started was stopped", err=True)
        code = 130
    except DemoFailed as e:
        click.echo(f"demo failed: {e}; everything started was stopped, logs in {state}", err=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, previous)
    raise SystemExit(code)
