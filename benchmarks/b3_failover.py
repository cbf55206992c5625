"""B3 — controller failover. The active controller's session ends, either because its process is killed
with SIGKILL (``zkctl controller run`` as a child process; ZooKeeper expires the session after the
session timeout) or because it resigns cleanly (``Controller.stop``: the session is closed at once). The
successor is a standby ``Controller`` in this process (the brokers run in a farm child process).

Measured from the moment a separate observer session sees ``/controller`` deleted (the old session is
over): until the successor has won the election (``became_active_at``), until its state is loaded
(``last_load_s``), and until its first rebalance completed (a rebalance request written as the old
controller went away is served; done = every group Stable at a newer generation and every task running
exactly once). The three state loads (``ControllerConfig(load=...)``) alternate: ``multiread`` (the default:
task specs in multiRead requests without watches, the tasks' watches armed in the background afterwards,
timed as ``watches_armed_s`` from the end of the load), ``pipelined`` (one ``get`` with its watch per
znode, pipelined) and ``sequential`` (one round trip each).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from kazoo.protocol.states import EventType

from benchmarks.cluster import Cluster, stop_process
from benchmarks.common import Bench, median, ratio, table, target, zookeeper
from controller.admin import wait_for
from controller.daemon import LOAD_METHODS, Controller
from controller.protocol.records import admin_records, codecs

NAME = "b3_failover"
TITLE = "B3 controller failover"


class Observer:
    """Watches ``/controller`` from its own session; records when it was deleted (monotonic)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.deleted_at: float | None = None

    def arm(self) -> None:
        self.deleted_at = None

        def fire(event: Any) -> None:
            if event.type == EventType.DELETED and self.deleted_at is None:
                self.deleted_at = time.monotonic()

        if self.cluster.admin.exists(self.cluster.layout.controller, watch=fire) is None:
            raise RuntimeError("no active controller to fail over from")


def _standby_ready(c: Controller) -> bool:
    return c.thread.snapshot().get("Startup") is not None and not c.active


def _request_rebalance(cluster: Cluster) -> None:
    cluster.admin.create(
        cluster.layout.admin_rebalance_request_prefix,
        codecs.encode(admin_records.RebalanceRequest(group=None, reason="b3 failover")),
        sequence=True,
        makepath=True,
    )


def _measure(
    bench: Bench, cluster: Cluster, obs: Observer, successor: Controller, end_session: Any, kind: str, mode: str
) -> dict[str, Any]:
    gens = {g: (s.generation if s else 0) for g, s in zip(cluster.group_names, cluster.group_states())}
    obs.arm()
    t_cause = time.monotonic()
    end_session()
    _request_rebalance(cluster)
    if not wait_for(lambda: obs.deleted_at is not None, 120, 0.01):
        raise RuntimeError("the old controller's session did not end")
    if not wait_for(lambda: successor.became_active_at is not None, 60, 0.01):
        raise RuntimeError("the successor did not become active")
    # coarse polling from here on: this thread shares the interpreter with the successor it measures
    wait_for(lambda: successor.loader.last_load_s is not None, 300, 0.02)

    def rebalanced() -> bool:
        ctx = successor.ctx
        if ctx is None:
            return False
        return all(
            g in ctx.groups and ctx.groups[g].state.value == "Stable" and ctx.groups[g].generation > gens[g]
            for g in cluster.group_names
        )

    wait_for(rebalanced, 300, 0.02)
    t_rebalanced = time.monotonic()
    all_running = wait_for(cluster.farm_converged, 120, 0.1)
    armer = successor.loader.watch_armer
    if armer is not None:
        wait_for(lambda: armer.took_s is not None, 120, 0.05)
    t0 = obs.deleted_at
    assert t0 is not None and successor.became_active_at is not None
    res = {
        "kind": kind,
        "load": mode,
        "cause_to_session_end_s": round(t0 - t_cause, 3),
        "elected_s": round(successor.became_active_at - t0, 4),
        "state_load_s": round(successor.loader.last_load_s or 0.0, 4),
        "loaded_s": round(successor.became_active_at - t0 + (successor.loader.last_load_s or 0.0), 4),
        "first_rebalance_done_s": round(t_rebalanced - t0, 4),
        "watches_armed_s": round(armer.took_s, 4) if armer is not None and armer.took_s is not None else None,
        "all_tasks_running_after": all_running,
    }
    armed = (
        f"  watches armed {res['watches_armed_s']:.3f}s after the load" if res["watches_armed_s"] is not None else ""
    )
    bench.log(
        f"{kind:<10} {mode:<10} session end→elected {res['elected_s']:.3f}s  loaded {res['loaded_s']:.3f}s "
        f"(load {res['state_load_s']:.3f}s)  rebalanced {res['first_rebalance_done_s']:.3f}s{armed}  "
        f"[kill/stop→session end {res['cause_to_session_end_s']:.2f}s]"
    )
    return res


def run(bench: Bench) -> dict[str, Any]:
    tasks, brokers = (1000, 10) if bench.quick else (10_000, 100)
    groups = 1  # one group of all tasks (the hardest case for the join result and the load)
    reps = 1 if bench.quick else 3
    session_timeout = 2.0 if bench.quick else 6.0
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"zkc-b3-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    measurements: list[dict[str, Any]] = []
    setup: dict[str, Any] = {
        "tasks": tasks,
        "brokers": brokers,
        "groups": groups,
        "session_timeout_s": session_timeout,
        "reps": reps,
    }
    with zookeeper(heap_mb=1536, name="b3") as zk:
        cluster = Cluster(
            zk.address, tasks, brokers, groups=groups, name="b3", session_timeout_s=session_timeout, log_dir=log_dir
        )
        try:
            setup["create_tasks_s"] = round(cluster.create_tasks(), 2)
            proc = cluster.spawn_controller("ctl-p0")
            if not wait_for(lambda: cluster.active_controller_id() == "ctl-p0", 60, 0.1):
                raise RuntimeError("the controller process did not become active")
            t0 = time.monotonic()
            cluster.start_farm()
            took = cluster.wait_converged(600 if tasks >= 5000 else 120)
            if took is None:
                raise RuntimeError("the cluster did not converge")
            setup["initial_converge_s"] = round(time.monotonic() - t0, 1)
            bench.log(
                f"{tasks} tasks on {brokers} brokers ({groups} group{'s' if groups > 1 else ''}) running after {setup['initial_converge_s']}s"
            )
            obs = Observer(cluster)
            n = 0
            for r in range(reps):
                for mode in LOAD_METHODS:
                    n += 1
                    # kill -9 of the active controller process; the successor is a standby here
                    s1 = cluster.start_controller(f"ctl-s{n}a", load=mode)
                    wait_for(lambda: _standby_ready(s1), 30, 0.02)
                    victim = proc

                    def kill() -> None:
                        os.kill(victim.pid, signal.SIGKILL)  # our child, by its pid
                        victim.wait(10)

                    measurements.append(_measure(bench, cluster, obs, s1, kill, "kill -9", mode))
                    # clean resign of that one; a second standby takes over
                    s2 = cluster.start_controller(f"ctl-s{n}b", load=mode)
                    wait_for(lambda: _standby_ready(s2), 30, 0.02)
                    measurements.append(_measure(bench, cluster, obs, s2, s1.stop, "resign", mode))
                    cluster.controllers.remove(s1)
                    if r == reps - 1 and mode == LOAD_METHODS[-1]:
                        break
                    # back to a controller process for the next kill
                    proc = cluster.spawn_controller(f"ctl-p{n}")
                    # it prints "started" once it has run for election (lost: it watches /controller)
                    log = log_dir / f"ctl-p{n}.log"
                    wait_for(lambda: log.exists() and "started" in log.read_text(errors="replace"), 60, 0.05)
                    time.sleep(0.3)
                    s2.stop()
                    cluster.controllers.remove(s2)
                    if not wait_for(lambda: cluster.active_controller_id() == f"ctl-p{n}", 120, 0.05):
                        raise RuntimeError("the controller process did not take over")
                    cluster.wait_converged(300)
            if proc.poll() is None:
                stop_process(proc)
        finally:
            cluster.close()
    # ---- table -------------------------------------------------------------------------------------------
    rows = []
    summary: dict[str, Any] = {}
    for kind in ("kill -9", "resign"):
        for mode in LOAD_METHODS:
            ms = [m for m in measurements if m["kind"] == kind and m["load"] == mode]
            s = {
                k: median([m[k] for m in ms])
                for k in ("cause_to_session_end_s", "elected_s", "state_load_s", "loaded_s", "first_rebalance_done_s")
            }
            armed = [m["watches_armed_s"] for m in ms if m.get("watches_armed_s") is not None]
            s["watches_armed_s"] = median(armed) if armed else None
            summary[f"{kind}|{mode}"] = s
            rows.append(
                [
                    kind,
                    mode,
                    len(ms),
                    s["elected_s"],
                    s["state_load_s"],
                    s["loaded_s"],
                    s["first_rebalance_done_s"],
                    s["watches_armed_s"] if s["watches_armed_s"] is not None else "inline",
                    s["cause_to_session_end_s"],
                ]
            )
    headers = [
        "session end by",
        "state load",
        "runs",
        "→ elected s",
        "load s",
        "→ loaded s",
        "→ rebalanced s",
        "watches armed after the load s",
        "kill/stop → session end s",
    ]
    print(table(headers, rows))

    def load_s(mode: str) -> float:
        return median([m["state_load_s"] for m in measurements if m["load"] == mode])

    load_ratio = ratio(load_s("sequential"), load_s("pipelined"))
    multiread_ratio = ratio(load_s("pipelined"), load_s("multiread"))
    elected = max(summary["kill -9|multiread"]["elected_s"], summary["resign|multiread"]["elected_s"])
    loaded = max(summary["kill -9|multiread"]["loaded_s"], summary["resign|multiread"]["loaded_s"])
    print(f"multiRead load is {multiread_ratio:.1f}× faster than pipelined" if multiread_ratio else "")
    print(f"pipelined load is {load_ratio:.1f}× faster than sequential" if load_ratio else "")
    targets = [
        target(
            "B3 successor active after session end (elected)",
            f"{elected * 1000:.0f} ms",
            "< 1 s",
            elected < 1.0,
            "worst of kill -9 / resign medians, multiRead load",
        ),
        target(
            "B3 successor active with state loaded",
            f"{loaded:.2f} s",
            "< 1 s",
            loaded < 1.0,
            f"{tasks} tasks, {brokers} brokers, multiRead load",
            quick_size=bench.quick,
        ),
        target(
            "B3 multiRead vs pipelined state load",
            f"{multiread_ratio:.1f}×" if multiread_ratio else "-",
            "(ratio)",
            None,
        ),
        target("B3 pipelined vs sequential state load", f"{load_ratio:.1f}×" if load_ratio else "-", "(ratio)", None),
    ]
    doc = {
        "setup": setup,
        "measurements": measurements,
        "summary": summary,
        "load_speedup": load_ratio,
        "multiread_speedup": multiread_ratio,
        "table": {"headers": headers, "rows": rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
