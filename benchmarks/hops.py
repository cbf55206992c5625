"""Where a B2 join's time goes, hop by hop: ``python -m benchmarks.hops [--tasks 1000 --brokers 20 --joins 7]``.

One broker joins a stable group (as in B2: controller here, the group's brokers in a farm process, the joiner
here), several times. Every write of every process is in ZooKeeper's transaction log with the server's clock
and the writer's session, so the log read back after the run gives each hop of the chain without
instrumenting any process: the joiner's join request, the PreparingRebalance state, the members' rejoins, the
join result, the leader's proposal, the assignments, the revokers' releases, and (from the joiner's run
intervals) its first and last task start. Writes ``benchmarks/results/profile_hops.txt``: per hop, the median
over the joins (and min-max), and the farm's CPU per join.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.cluster import Cluster
from benchmarks.common import RESULTS_DIR, quiet_logging, zookeeper

# ZooKeeper's transaction types (org.apache.zookeeper.ZooDefs.OpCode) that name a path
_PATH_OPS = {1: "create", 2: "delete", 5: "set", 13: "check", 15: "create", 19: "create", 20: "delete", 21: "create"}
_MULTI = 14


def _path(op: int, body: bytes) -> str | None:
    if op not in _PATH_OPS:
        return None
    (n,) = struct.unpack_from(">i", body, 0)
    return body[4 : 4 + n].decode(errors="replace") if n >= 0 else None


def read_txn_log(path: Path) -> Iterator[tuple[float, int, list[tuple[str, str]]]]:
    """(server time s, session id, [(op, path)]) per transaction of one ``log.<zxid>`` file (the format of
    ``FileTxnLog``: a 16-byte header, then per entry a checksum, a length, the serialized TxnHeader + Txn,
    and an end-of-record byte; preallocated zeros after the last entry)."""
    data = path.read_bytes()
    off = 16
    while off + 12 <= len(data):
        _crc, n = struct.unpack_from(">qi", data, off)
        if n <= 0:
            return
        rec = data[off + 12 : off + 12 + n]
        off += 12 + n + 1
        session, _cxid, _zxid, time_ms, op = struct.unpack_from(">qiqqi", rec, 0)
        body = rec[32:]
        ops: list[tuple[str, str]] = []
        if op == _MULTI:
            (count,) = struct.unpack_from(">i", body, 0)
            o = 4
            for _ in range(count):
                sub, length = struct.unpack_from(">ii", body, o)
                p = _path(sub, body[o + 8 : o + 8 + length])
                if p is not None:
                    ops.append((_PATH_OPS[sub], p))
                o += 8 + length
        else:
            p = _path(op, body)
            if p is not None:
                ops.append((_PATH_OPS[op], p))
        yield time_ms / 1000.0, session, ops


def _hops(
    txns: list[tuple[float, str, list[tuple[str, str]]]], t0: float, first: float, last: float, root: str
) -> dict[str, float]:
    """The milestones of one join (two generations) from its writes, in log order, as ms between them."""
    group = f"{root}/groups/default/"

    def writes(who: str | None, op: str, sub: str, after: int, before: int | None = None) -> list[int]:
        """Indexes of the transactions in (after, before) that ``who`` made with an ``op`` under ``sub``."""
        end = len(txns) if before is None else before
        return [
            i
            for i in range(after + 1, end)
            if (who is None or txns[i][1] == who) and any(o == op and p.startswith(group + sub) for o, p in txns[i][2])
        ]

    def first_write(who: str | None, op: str, sub: str, after: int) -> int:
        found = writes(who, op, sub, after)
        if not found:
            raise ValueError(f"no {op} of {sub} after +{txns[after][0] - t0:.3f}s")
        return found[0]

    def at(i: int) -> float:
        return txns[i][0]

    h: dict[str, float] = {}
    joined = first_write(None, "create", "members/joiner", -1)
    h["joiner: session, registration, join request"] = at(joined) - t0
    i = joined
    released = joined
    for g in (1, 2):
        pr = first_write("ctl", "set", "state", i)
        jr = first_write("ctl", "create", "join/", pr)
        last_rejoin = max(writes(None, "set", "members/", pr if g == 1 else released, jr) + [pr])
        sync = first_write(None, "create", "sync/", jr)
        asg = first_write("ctl", "set", "assignment/", sync)
        if g == 1:
            h["g1: join request -> PreparingRebalance written"] = at(pr) - at(joined)
        else:
            h["revocations: g1 assignments -> first rejoin -> PreparingRebalance written"] = at(pr) - at(released)
        h[f"g{g}: PreparingRebalance -> last member rejoined"] = at(last_rejoin) - at(pr)
        h[f"g{g}: last rejoin -> join result written"] = at(jr) - at(last_rejoin)
        h[f"g{g}: join result -> leader's proposal written"] = at(sync) - at(jr)
        h[f"g{g}: proposal -> assignments written"] = at(asg) - at(sync)
        released = i = asg
    h["joiner: g2 assignments -> first task started"] = first - at(i)
    h["joiner: first -> last task started"] = last - first
    h["total: joiner started -> last task started"] = last - t0
    return {k: v * 1000 for k, v in h.items()}


def profile_hops(tasks: int, brokers: int, joins: int) -> str:
    import psutil

    from broker_sim.runners.noop import NoopRunner
    from broker_sim.worker import Worker, WorkerConfig
    from controller.admin import wait_for

    out = [
        f"# {joins} joins into {tasks} tasks × {brokers} brokers: hops from ZooKeeper's transaction log "
        "(server clock), ms\n"
    ]
    results: list[dict[str, float]] = []
    farm_cpu: list[float] = []
    with zookeeper(heap_mb=1024, name="hops") as zk:
        c = Cluster(zk.address, tasks, brokers, name="hops")
        try:
            c.create_tasks()
            ctl = c.start_controller()
            ctl.wait_active(60)
            c.start_farm()
            c.wait_converged(600)
            farm = psutil.Process(c.farm.pid)
            windows = []
            for r in range(joins):
                coord = ctl.ctx.groups["default"]
                gen0 = coord.generation
                share = tasks // (brokers + 1)
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
                cpu0 = sum(farm.cpu_times()[:2])
                t0 = time.time()
                w.start()
                wait_for(
                    lambda: (
                        coord.state.value == "Stable"
                        and coord.generation > gen0
                        and len(w.running_tasks()) >= share
                        and w.running_tasks() == set(w.table.desired)
                    ),
                    300,
                    0.005,
                )
                starts = [i.start for i in w.open_intervals()]
                farm_cpu.append(sum(farm.cpu_times()[:2]) - cpu0)
                windows.append((t0, min(starts), max(starts), coord.generation - gen0, ctl.client.client_id[0]))
                w.stop()
                c.wait_converged(300, 0.1)
            time.sleep(1.0)
            logs = sorted((Path(zk.data_dir) / "data").rglob("log.*"))
            txns_raw = [t for p in logs for t in read_txn_log(p)]
            for t0, first, last, gens, ctl_session in windows:
                txns = [
                    (t, "ctl" if s == ctl_session else str(s), ops)
                    for t, s, ops in txns_raw
                    if t0 - 0.01 <= t <= last + 0.05
                ]
                try:
                    results.append(_hops(txns, t0, first, last, c.root))
                except ValueError as exc:  # e.g. a join that took 1 or 3 generations
                    out.append(f"(a join of {gens} generations left out: {exc})")
        finally:
            c.close()
    if not results:
        return "\n".join(out + ["no join could be traced"])
    out.append(f"{'hop':<75} {'median':>7}  min-max   ({len(results)} joins)")
    for k in results[0]:
        vals = [r[k] for r in results]
        out.append(f"{k:<75} {statistics.median(vals):7.1f}  {min(vals):.0f}-{max(vals):.0f}")
    out.append(
        f"\nfarm process CPU (user+system) per join: median {statistics.median(farm_cpu) * 1000:.0f} ms "
        f"({min(farm_cpu) * 1000:.0f}-{max(farm_cpu) * 1000:.0f}); the farm runs the group's {brokers} brokers"
    )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hops")
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--brokers", type=int, default=20)
    p.add_argument("--joins", type=int, default=7)
    a = p.parse_args()
    quiet_logging()
    text = profile_hops(a.tasks, a.brokers, a.joins)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / "profile_hops.txt"
    path.write_text(text + "\n")
    print(text)
    print(f"\n(written to {path})")


if __name__ == "__main__":
    main()
