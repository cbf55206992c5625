"""B7 — memory: the controller process (``zkctl controller run``) and the simulated brokers at 10,000 tasks
and 100 brokers (quick: 1,000 × 10), once the cluster has converged and again after a rebalance of every
group. The brokers all live in one farm process: per-broker memory is the farm's growth over its
interpreter with everything imported, divided by the number of brokers. RSS and peak RSS (VmHWM) from
``/proc``; ZooKeeper's RSS for context."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.cluster import Cluster, stop_process
from benchmarks.common import Bench, table, target, zookeeper
from controller.admin import wait_for
from controller.protocol.records import admin_records, codecs

NAME = "b7_memory"
TITLE = "B7 memory"


def _hwm(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _mb(b: int | float | None) -> float | None:
    return None if b is None else round(b / 2**20, 1)


def run(bench: Bench) -> dict[str, Any]:
    tasks, brokers = (1000, 10) if bench.quick else (10_000, 100)
    groups = 1  # one group of all tasks (the hardest case for the join result and the load)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"zkc-b7-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    snaps: list[dict[str, Any]] = []
    with zookeeper(heap_mb=1536, name="b7") as zk:
        cluster = Cluster(zk.address, tasks, brokers, groups=groups, name="b7", session_timeout_s=20.0, log_dir=log_dir)
        try:
            cluster.create_tasks()
            proc = cluster.spawn_controller("ctl-b7")
            if not wait_for(lambda: cluster.active_controller_id() == "ctl-b7", 60, 0.1):
                raise RuntimeError("the controller process did not become active")
            farm = cluster.start_farm()
            if cluster.wait_converged(900 if tasks >= 5000 else 180) is None:
                raise RuntimeError("the cluster did not converge")
            ctl_p = psutil.Process(proc.pid)
            zk_p = psutil.Process(zk.read_pid())

            def snap(label: str) -> dict[str, Any]:
                f = farm.call("rss")
                s = {
                    "when": label,
                    "controller_rss_mb": _mb(ctl_p.memory_info().rss),
                    "controller_peak_mb": _mb(_hwm(proc.pid)),
                    "controller_threads": ctl_p.num_threads(),
                    "farm_rss_mb": _mb(f["rss"]),
                    "farm_peak_mb": _mb(_hwm(farm.pid)),
                    "farm_baseline_mb": _mb(farm.ready["rss_before"]),
                    "farm_threads": f["threads"],
                    "per_broker_mb": _mb((f["rss"] - farm.ready["rss_before"]) / brokers),
                    "zookeeper_rss_mb": _mb(zk_p.memory_info().rss),
                }
                bench.log(
                    f"{label}: controller {s['controller_rss_mb']} MB (peak {s['controller_peak_mb']}), brokers "
                    f"{s['farm_rss_mb']} MB for {brokers} = {s['per_broker_mb']} MB each over a {s['farm_baseline_mb']} MB interpreter"
                )
                return s

            time.sleep(2.0)
            snaps.append(snap("converged"))
            before = {g: (s.generation if s else 0) for g, s in zip(cluster.group_names, cluster.group_states())}
            cluster.admin.create(
                cluster.layout.admin_rebalance_request_prefix,
                codecs.encode(admin_records.RebalanceRequest(group=None, reason="b7")),
                sequence=True,
                makepath=True,
            )
            wait_for(
                lambda: all(
                    s is not None and s.state == "Stable" and s.generation > before[g]
                    for g, s in zip(cluster.group_names, cluster.group_states())
                ),
                300,
                0.2,
            )
            cluster.wait_converged(300)
            snaps.append(snap("after a rebalance of every group"))
            stop_process(proc)
        finally:
            cluster.close()
    rows = [
        [
            s["when"],
            s["controller_rss_mb"],
            s["controller_peak_mb"],
            s["farm_rss_mb"],
            s["per_broker_mb"],
            s["farm_baseline_mb"] + s["per_broker_mb"],
            s["zookeeper_rss_mb"],
        ]
        for s in snaps
    ]
    headers = [
        "when",
        "controller RSS MB",
        "controller peak MB",
        f"{brokers} brokers RSS MB",
        "per broker MB",
        "one broker process ≈ MB",
        "ZooKeeper RSS MB",
    ]
    print(table(headers, rows))
    peak = max(s["controller_peak_mb"] or 0 for s in snaps)
    targets = [
        target(
            f"B7 controller memory at {tasks} tasks / {brokers} brokers",
            f"{peak:.0f} MB peak",
            "< 300 MB",
            peak < 300,
            f"RSS after converging {snaps[0]['controller_rss_mb']} MB",
            quick_size=bench.quick,
        )
    ]
    doc = {
        "setup": {"tasks": tasks, "brokers": brokers, "groups": groups},
        "snapshots": snaps,
        "table": {"headers": headers, "rows": rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
