"""Profiles behind the benchmarks' misses (``python -m benchmarks.profiles join|load|reads``): cProfile of the
controller's event thread over broker joins (B2), of the failover state load (B3), and raw kazoo read
rates (pipelined vs sequential). Each writes ``benchmarks/results/profile_<what>.txt``.

    python -m benchmarks.profiles join [--tasks 1000 --brokers 20 --joins 3]
    python -m benchmarks.profiles load [--tasks 10000]
    python -m benchmarks.profiles reads [--n 10000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable
from typing import Any

from benchmarks.cluster import Cluster
from benchmarks.common import RESULTS_DIR, quiet_logging, zookeeper


def _stats(prof: cProfile.Profile, sort: str, n: int) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(sort).print_stats(n)
    return s.getvalue()


def _wrap(ctl: Any, prof: cProfile.Profile) -> Callable[[], None]:
    orig = ctl.thread._process

    def profiled(event: Any) -> None:
        prof.enable()
        try:
            orig(event)
        finally:
            prof.disable()

    ctl.thread._process = profiled
    return lambda: setattr(ctl.thread, "_process", orig)


def profile_join(tasks: int, brokers: int, joins: int) -> str:
    """Joins of one broker into a stable group; per join the generations, the group's state changes with
    their reasons, the event types the controller processed; then cProfile of its event thread."""
    import controller.protocol.group.coordinator as group_mod
    from broker_sim.runners.noop import NoopRunner
    from broker_sim.worker import Worker, WorkerConfig
    from controller.admin import wait_for

    trace: list[tuple[float, str, str, int]] = []
    orig_transition = group_mod.GroupCoordinator.transition

    def traced(self: Any, target: Any) -> None:
        trace.append((time.time(), target.value, self.reason, self.join_generation))
        orig_transition(self, target)

    group_mod.GroupCoordinator.transition = traced  # observation only, in this process
    out = [f"# {joins} joins into {tasks} tasks × {brokers} brokers (controller in this process, brokers in a farm)\n"]
    prof = cProfile.Profile()
    try:
        with zookeeper(heap_mb=1024, name="prof") as zk:
            c = Cluster(zk.address, tasks, brokers, name="prof")
            try:
                c.create_tasks()
                ctl = c.start_controller()
                ctl.wait_active(60)
                c.start_farm()
                c.wait_converged(300)
                unwrap = _wrap(ctl, prof)
                share = tasks // (brokers + 1)
                for r in range(joins):
                    coord = ctl.ctx.groups["default"]
                    gen0 = coord.generation
                    s0 = ctl.thread.snapshot()
                    w = Worker(
                        WorkerConfig(
                            broker_id=f"joiner-{r}",
                            settings=c.settings,
                            pool_size=8,
                            status_interval_s=1.0,
                            intervals_flush_s=3600.0,
                            on_halt="kill",
                        ),
                        runner=NoopRunner(),
                    )
                    del trace[:]
                    t0 = time.time()
                    w.start()
                    wait_for(
                        lambda: (
                            coord.state.value == "Stable"
                            and coord.generation > gen0
                            and len(w.running_tasks()) >= share
                            and w.running_tasks() == set(w.table.desired)
                        ),
                        120,
                        0.005,
                    )
                    starts = [i.start for i in w.open_intervals()]
                    s1 = ctl.thread.snapshot()
                    out.append(
                        f"join {r + 1}: last task started +{(max(starts) if starts else time.time()) - t0:.3f}s, "
                        f"{coord.generation - gen0} generations"
                    )
                    out += [
                        f"   +{t - t0:.3f}s -> {state:<18} (join generation {jg}) {reason}"
                        for t, state, reason, jg in trace
                    ]
                    for k, v in s1.items():
                        b = s0.get(k)
                        dc = v.count - (b.count if b else 0)
                        if dc:
                            dp = v.process_time_s - (b.process_time_s if b else 0)
                            dq = v.queue_time_s - (b.queue_time_s if b else 0)
                            out.append(
                                f"     {k:<20} {dc:4d} events, processing {dp * 1000:7.1f} ms, queued {dq * 1000:8.1f} ms in all"
                            )
                    w.stop()
                    c.wait_converged(120, 0.1)
                unwrap()
            finally:
                c.close()
    finally:
        group_mod.GroupCoordinator.transition = orig_transition
    out.append("\n# cProfile of the controller's event thread over these joins (cumulative)\n")
    out.append(_stats(prof, "cumulative", 30))
    out.append("\n# ... by own time\n")
    out.append(_stats(prof, "tottime", 15))
    return "\n".join(out)


def profile_load(tasks: int) -> str:
    """cProfile of ``FailoverLoad.load`` over ``tasks`` tasks: multiRead, pipelined and sequential, alternating."""
    from controller.daemon.loading import FailoverLoad

    out = [f"# failover state load of {tasks} tasks in one group (no brokers)\n"]
    with zookeeper(heap_mb=1024, name="prof") as zk:
        c = Cluster(zk.address, tasks, 0, name="prof")
        try:
            c.create_tasks()
            for i, method in enumerate(("multiread", "pipelined", "sequential") * 2):
                prof = cProfile.Profile()
                orig = FailoverLoad.load

                def _load(self: Any, _orig: Any = orig, _prof: cProfile.Profile = prof) -> None:
                    _prof.enable()
                    try:
                        _orig(self)
                    finally:
                        _prof.disable()

                FailoverLoad.load = _load  # type: ignore[method-assign]
                try:
                    ctl = c.start_controller(f"ctl-{i}", load=method)
                    ctl.wait_active(120)
                    deadline = time.monotonic() + 300
                    while ctl.loader.last_load_s is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                finally:
                    FailoverLoad.load = orig  # type: ignore[method-assign]
                out.append(f"## {method} load: {ctl.loader.last_load_s:.3f}s\n")
                out.append(_stats(prof, "tottime", 12))
                ctl.stop()
                c.controllers.remove(ctl)
        finally:
            c.close()
    return "\n".join(out)


def profile_reads(n: int) -> str:
    """Raw read rates through kazoo: multiRead requests (``zkio.multi_read``), pipelined ``get_async``
    (``zkio.get_many``), one ``get`` per round trip."""
    from controller.daemon import get_sequential
    from controller.zk.client import ZkSettings, make_client
    from controller.zk.io import InterruptibleClient, get_many
    from controller.zk.multi_read import multi_read

    out = [f"# {n} reads of 300-byte znodes, median of 3\n"]
    with zookeeper(heap_mb=512, name="prof") as zk:
        client = make_client(ZkSettings(hosts=zk.address))
        try:
            client.ensure_path("/r")
            paths = [f"/r/t{i:05d}" for i in range(n)]
            for lo in range(0, n, 500):
                tx = client.transaction()
                for p in paths[lo : lo + 500]:
                    tx.create(p, b"x" * 300)
                tx.commit()
            zc = InterruptibleClient(client)
            for name, fn in (
                ("multiRead multi_read", multi_read),
                ("pipelined get_many", get_many),
                ("sequential get", get_sequential),
            ):
                times = []
                prof = cProfile.Profile()
                for _ in range(3):
                    t0 = time.perf_counter()
                    prof.enable()
                    fn(zc, paths)
                    prof.disable()
                    times.append(time.perf_counter() - t0)
                med = sorted(times)[1]
                out.append(f"## {name}: {med:.3f}s = {n / med:,.0f} reads/s\n")
                out.append(_stats(prof, "tottime", 8))
        finally:
            client.stop()
            client.close()
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profiles")
    p.add_argument("what", choices=("join", "load", "reads"))
    p.add_argument("--tasks", type=int, default=None)
    p.add_argument("--brokers", type=int, default=20)
    p.add_argument("--joins", type=int, default=3)
    p.add_argument("--n", type=int, default=10_000)
    a = p.parse_args()
    quiet_logging()
    if a.what == "join":
        text = profile_join(a.tasks or 1000, a.brokers, a.joins)
    elif a.what == "load":
        text = profile_load(a.tasks or 10_000)
    else:
        text = profile_reads(a.n)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"profile_{a.what}.txt"
    path.write_text(text)
    print(text)
    print(f"\n(written to {path})")


if __name__ == "__main__":
    main()
