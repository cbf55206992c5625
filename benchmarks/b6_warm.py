"""B6, second part — warm and lazy Spark brokers, same run: broker *processes* on the spark runner
(``zkctl broker run --runner spark``), a controller in this process, an embedded ZooKeeper.

1. create -> RUNNING on a warm broker: a streaming files pipeline created on a broker whose session is up;
   the time until its owner's status reports the first batch committed (polled every 50 ms).
2. A pipeline moved by a scale-out, warm vs lazy: broker P runs two pipelines (data arriving all along); a
   new broker joins and cooperative-sticky moves one of them to it. Downtime = from the end of the moved
   pipeline's run on P (its recorded run interval) to its first batch committed on the new broker. The warm
   new broker joins only once its session is up; the lazy one joins at once and its first task starts the JVM.
   Between the two, the warm broker leaves (controlled shutdown) and its pipeline returns to P.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.cluster import stop_process
from benchmarks.common import REPO, Bench, zookeeper
from broker_sim.sim.datagen import SCHEMA_DDL, Datagen, DatagenConfig

SESSION_S = 8.0
BROKER_SPARK = [
    "--spark-master",
    "local[1]",
    "--spark-conf",
    "spark.driver.memory=512m",
    "--spark-conf",
    "spark.sql.shuffle.partitions=1",
]


class _Run:
    def __init__(self, bench: Bench, hosts: str, work: Path) -> None:
        from controller.admin import AdminClient, ensure_layout
        from controller.daemon import Controller, ControllerConfig
        from controller.protocol.cluster.layout import ZkLayout
        from controller.protocol.group.vocabulary import GroupConfig
        from controller.zk.client import ZkSettings, make_client

        self.bench = bench
        self.work = work
        root = f"/b6-{uuid.uuid4().hex[:8]}"
        self.settings = ZkSettings(hosts=hosts, root=root, session_timeout_s=SESSION_S)
        self.layout = ZkLayout(root)
        self.zk = make_client(self.settings)
        ensure_layout(self.zk, self.layout)
        self.admin = AdminClient(self.zk, self.layout)
        self.ctl = Controller(ControllerConfig("b6", self.settings, GroupConfig(rebalance_timeout_s=30))).start()
        self.env = {
            **os.environ,
            "ZKC_ZK": hosts,
            "ZKC_ROOT": root,
            "ZKC_STATE_DIR": str(work / "state"),
            "PYTHONPATH": str(REPO),
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.gens: list[Datagen] = []

    def broker(self, bid: str, *args: str) -> None:
        cmd = [sys.executable, "-m", "cli.main", "broker", "run", "--id", bid, "--runner", "spark"]
        cmd += ["--session-timeout", str(SESSION_S), "--checkpoint-root", str(self.work / "chk"), *BROKER_SPARK, *args]
        with open(self.work / f"{bid}.log", "ab") as log:
            self.procs[bid] = subprocess.Popen(
                cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def session_state(self, bid: str) -> str | None:
        from controller.protocol.records import codecs, registration_records

        try:
            info = codecs.decode(registration_records.BrokerInfo, self.zk.get(self.layout.broker(bid))[0])
        except Exception:
            return None
        return info.session.state.value if info.session else None

    def status(self, task: str) -> Any:
        from controller.protocol.records import codecs, task_records

        try:
            return codecs.decode(task_records.TaskStatus, self.zk.get(self.layout.status(task))[0])
        except Exception:
            return None

    def owner(self, task: str) -> str | None:
        from controller.protocol.records import codecs, task_records

        try:
            return codecs.decode(task_records.OwnerInfo, self.zk.get(self.layout.task_owner(task))[0]).broker
        except Exception:
            return None

    def first_batch_on(self, task: str, broker: str) -> bool:
        st = self.status(task)
        return bool(st and st.broker == broker and st.state == "RUNNING" and st.metrics.get("batches"))

    def until(self, cond: Any, timeout: float, what: str, interval: float = 0.05) -> float:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"B6: timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)
        return time.time()

    def pipeline(self, task: str) -> None:
        from controller.protocol.tasks.spec import parse_spec

        src = self.work / "in" / task
        cfg = DatagenConfig(out_dir=str(src), records=1_000_000, rate=50.0, batch=10, start_id=len(self.gens) * 10**7)
        gen = Datagen(cfg)
        gen.start()
        self.gens.append(gen)
        doc = {
            "id": task,
            "pipeline": {
                "kind": "spark",
                "source": {"type": "files", "format": "json", "path": str(src), "schema": SCHEMA_DDL},
                "transform": {"sql": "SELECT id, key, value FROM input"},
                "sink": {"type": "files", "format": "parquet", "path": str(self.work / "out" / task)},
                "trigger": {"processing_time": "1 second"},
            },
        }
        self.admin.create_tasks([parse_spec(doc)])

    def run_end(self, task: str, broker: str) -> float | None:
        ends = [i.end for i in self.admin.intervals() if i.task_id == task and i.broker == broker and i.end]
        return max(ends) if ends else None

    def scale_out(self, new: str, *args: str, tasks: tuple[str, ...]) -> dict[str, Any]:
        """Start ``new``; the pipeline that moves to it: downtime from its run's end on P to its first batch."""
        t0 = time.time()
        self.broker(new, *args)
        self.until(lambda: any(self.owner(t) == new for t in tasks), 240, f"a pipeline moved to {new}")
        moved = next(t for t in tasks if self.owner(t) == new)
        first = self.until(lambda: self.first_batch_on(moved, new), 240, f"{moved}'s first batch on {new}")
        end = None
        deadline = time.monotonic() + 10  # P flushes its run intervals every 2 s
        while end is None and time.monotonic() < deadline:
            end = self.run_end(moved, "P")
            time.sleep(0.2)
        downtime = None if end is None else round(first - end, 2)
        self.bench.log(f"scale-out to {new} ({' '.join(args) or 'warm'}): {moved} down {downtime}s")
        return {"broker": new, "moved": moved, "downtime_s": downtime, "since_start_s": round(first - t0, 2)}

    def close(self) -> None:
        for g in self.gens:
            g.stop()
        for p in self.procs.values():
            stop_process(p, timeout=40)
        self.ctl.stop()
        self.zk.stop()
        self.zk.close()


def run(bench: Bench) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="zkc-b6w-"))
    out: dict[str, Any] = {}
    with zookeeper(name="b6") as server:
        r = _Run(bench, server.address, work)
        try:
            r.broker("P")
            started = time.time()
            r.until(lambda: r.session_state("P") == "ready", 240, "P's session", interval=0.2)
            out["warm_session_start_s"] = round(time.time() - started, 2)
            created = time.time()
            r.pipeline("w1")
            first = r.until(lambda: r.first_batch_on("w1", "P"), 240, "w1's first batch")
            out["create_to_running_s"] = round(first - created, 2)
            bench.log(f"create -> RUNNING (first batch) on warm P: {out['create_to_running_s']}s")
            r.pipeline("w2")
            r.until(lambda: r.first_batch_on("w2", "P"), 240, "w2's first batch")
            out["warm"] = r.scale_out("W", tasks=("w1", "w2"))
            stop_process(r.procs["W"], timeout=60)  # controlled shutdown: its pipeline goes back to P
            r.until(lambda: all(r.owner(t) == "P" for t in ("w1", "w2")), 120, "both pipelines back on P")
            r.until(lambda: all(r.first_batch_on(t, "P") for t in ("w1", "w2")), 120, "both running on P")
            out["lazy"] = r.scale_out("L", "--lazy-session", tasks=("w1", "w2"))
        finally:
            r.close()
            shutil.rmtree(work, ignore_errors=True)
    return out


if __name__ == "__main__":  # python -m benchmarks.b6_warm: this part alone, printed (not written)
    print(run(Bench(quick=True)))
