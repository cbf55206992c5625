"""A broker farm: N simulated brokers (``broker_sim.worker.Worker``, no-op runner, each with its own
ZooKeeper session) in one child process, driven by JSON lines on stdin, answering JSON lines on stdout.

Benchmarks put the brokers here so that the controller being measured has the parent's interpreter (and
GIL) to itself: 100 in-process workers on 2 cores would otherwise be measured along with it.

    python -m benchmarks.farm --zk HOST:PORT --root /r --brokers 100 [--first 0] [--prefix broker]

Commands: ``{"cmd": "status"}``, ``{"cmd": "rss"}``, ``{"cmd": "start", "id": ...}``,
``{"cmd": "leave", "id": ...}``, ``{"cmd": "intervals"}``, ``{"cmd": "stop"}`` (stops every broker, then exits).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


# ---- the child ----------------------------------------------------------------------------------------
def _serve(args: argparse.Namespace) -> None:
    import psutil

    from benchmarks.common import quiet_logging
    from broker_sim.runners.noop import NoopRunner
    from broker_sim.worker import Worker, WorkerConfig
    from controller import codecs
    from controller.protocol import COOPERATIVE, EAGER
    from controller.zkclient import ZkSettings

    quiet_logging()
    settings = ZkSettings(hosts=args.zk, root=args.root, session_timeout_s=args.session_timeout)
    protocols = (COOPERATIVE, EAGER) if args.protocol == COOPERATIVE else (EAGER,)
    workers: dict[str, Worker] = {}
    lock = threading.Lock()

    def start(bid: str) -> None:
        group = "default" if args.groups <= 1 else f"g{int(bid.rsplit('-', 1)[1]) % args.groups}"
        cfg = WorkerConfig(broker_id=bid, settings=settings, group=group, protocols=protocols, assignors=(args.assignor,),
                           pool_size=args.pool, status_interval_s=1.0, intervals_flush_s=3600.0, on_halt="kill")
        w = Worker(cfg, runner=NoopRunner(args.start_latency, args.stop_latency)).start()
        with lock:
            workers[bid] = w

    def out(doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    ids = [f"{args.prefix}-{i:03d}" for i in range(args.first, args.first + args.brokers)]
    rss_before = psutil.Process().memory_info().rss  # the interpreter with everything imported, no broker yet
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="farm-start") as ex:
        list(ex.map(start, ids))
    out({"event": "ready", "brokers": len(workers), "start_s": round(time.monotonic() - t0, 3), "pid": os.getpid(),
         "rss_before": rss_before})
    proc = psutil.Process()
    for line in sys.stdin:  # ends at EOF (parent gone) or on "stop"
        try:
            req = json.loads(line)
        except json.JSONDecodeError:
            out({"error": "bad json"})
            continue
        cmd = req.get("cmd")
        if cmd == "status":
            with lock:
                ws = list(workers.values())
            counts = Counter()
            per = []
            states = Counter()
            for w in ws:
                r = w.running_tasks()
                per.append(len(r))
                counts.update(r)
                states[w.state()] += 1
            out({"running": sum(per), "distinct": len(counts), "dupes": sum(1 for v in counts.values() if v > 1),
                 "min": min(per) if per else 0, "max": max(per) if per else 0, "brokers": len(ws), "states": dict(states)})
        elif cmd == "rss":
            mem = proc.memory_info()
            out({"rss": mem.rss, "threads": proc.num_threads(), "brokers": len(workers), "cpu_s": sum(proc.cpu_times()[:2])})
        elif cmd == "start":
            start(req["id"])
            out({"ok": True})
        elif cmd == "leave":
            with lock:
                w = workers.pop(req["id"])
            w.stop()
            out({"ok": True})
        elif cmd == "intervals":
            with lock:
                ws = list(workers.values())
            now = time.time()
            items = []
            for w in ws:
                items += [codecs.to_jsonable(i) for i in list(w.intervals) + w.open_intervals()]
            out({"intervals": items, "now": now})
        elif cmd == "stop":
            with lock:
                ws = list(workers.values())
                workers.clear()
            with ThreadPoolExecutor(max_workers=16, thread_name_prefix="farm-stop") as ex:
                list(ex.map(lambda w: w.stop(), ws))
            out({"stopped": len(ws)})
            return
        else:
            out({"error": f"unknown command {cmd!r}"})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.farm")
    p.add_argument("--zk", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--brokers", type=int, required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--prefix", default="broker")
    p.add_argument("--protocol", default="cooperative")
    p.add_argument("--assignor", default="cooperative-sticky")
    p.add_argument("--pool", type=int, default=8)
    p.add_argument("--groups", type=int, default=1, help="broker i joins group g<i %% groups> (1: 'default')")
    p.add_argument("--session-timeout", type=float, default=20.0)
    p.add_argument("--start-latency", type=float, default=0.0)
    p.add_argument("--stop-latency", type=float, default=0.0)
    _serve(p.parse_args(argv))


# ---- the parent's handle ------------------------------------------------------------------------------
class Farm:
    """Starts the farm as a child process and talks to it; ``close`` stops it (by its pid if need be)."""

    def __init__(self, zk: str, root: str, brokers: int, first: int = 0, prefix: str = "broker",
                 session_timeout: float = 20.0, pool: int = 8, protocol: str = "cooperative",
                 start_latency: float = 0.0, stop_latency: float = 0.0, log_path: Path | None = None,
                 ready_timeout: float = 300.0, groups: int = 1) -> None:
        cmd = [sys.executable, "-m", "benchmarks.farm", "--zk", zk, "--root", root, "--brokers", str(brokers),
               "--first", str(first), "--prefix", prefix, "--session-timeout", str(session_timeout),
               "--pool", str(pool), "--protocol", protocol, "--start-latency", str(start_latency),
               "--stop-latency", str(stop_latency), "--groups", str(groups)]
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, bufsize=1, start_new_session=True)
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name=f"farm-reader-{self.pid}", daemon=True)
        self._reader.start()
        self.ready = self._next(ready_timeout)
        if "event" not in self.ready:
            raise RuntimeError(f"farm did not start: {self.ready}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"farm {self.pid}: no answer within {timeout}s") from None
        if line is None:
            raise RuntimeError(f"farm {self.pid} exited (code {self.proc.poll()})")
        return json.loads(line)

    def call(self, cmd: str, timeout: float = 120.0, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def close(self, timeout: float = 120.0) -> None:
        if self.proc.poll() is None:
            try:
                self.call("stop", timeout=timeout)
            except Exception:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # our child, by its pid
                self.proc.wait(10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self) -> "Farm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if __name__ == "__main__":
    main()
