"""A broker farm: simulated brokers (``broker_sim.worker.Worker``, no-op runner, each with its own ZooKeeper
session) in one child process, driven by JSON lines on stdin, answering JSON lines on stdout.

The simulator and the benchmarks put brokers here so that the controller has its interpreter (and GIL) to
itself, and so that a hundred brokers spread over several processes do not starve each other's heartbeats
(a hundred workers in one interpreter on two cores fence themselves).

    python -m broker_sim.sim.farm --zk HOST:PORT --root /r (--brokers N [--first 0] [--prefix broker] | --ids a,b)

Commands (one JSON object per line, one answer each):
``status``, ``running`` (counts and a digest of the running tasks), ``tasks``, ``rss``, ``start``/``leave``/
``kill`` (``id``), ``shutdown`` (``id``, ``within`` seconds: a controlled shutdown), ``pause``/``partition`` (``id``,
``seconds``; need ``--proxies``), ``intervals`` (every run interval, also of brokers gone), ``stop`` (stops
every broker, then exits).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from controller.protocol.errors import ZkcError

PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # the directory holding the broker_sim package
DIGEST_MOD = 1 << 64


_HASHES: dict[str, int] = {}  # task id -> its 64-bit hash; bounded by the tasks a farm ever ran


def task_digest(task_ids: Iterable[str]) -> int:
    """An order-free digest of a multiset of task ids (a sum of 64-bit hashes): farms add theirs, and the
    sum equals the digest of every task id exactly when each runs once (barring a 2^-64 collision). Each
    id's hash is computed once: the simulator asks every farm for it every 50 ms while it waits for the
    cluster to converge, and hashing 2,500 ids each time was CPU taken from the brokers it measures."""
    total = 0
    for t in task_ids:
        h = _HASHES.get(t)
        if h is None:
            h = _HASHES[t] = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
        total += h
    return total % DIGEST_MOD


# ---- the child ----------------------------------------------------------------------------------------
class _FarmServer:
    """The child's side: its workers, their network proxies (for pauses and partitions), their intervals."""

    def __init__(self, args: argparse.Namespace) -> None:
        from broker_sim.sim.netproxy import NetProxy
        from broker_sim.worker import Worker
        from controller.protocol.group.rules import protocols_for
        from controller.zk.client import ZkSettings

        self.args = args
        self.settings = ZkSettings(hosts=args.zk, root=args.root, session_timeout_s=args.session_timeout)
        self.protocols = protocols_for(args.protocol)
        self.workers: dict[str, Worker] = {}
        self.pauses: dict[str, threading.Event] = {}  # each worker's pause, given to it when built
        self.proxies: dict[str, NetProxy] = {}
        self.gone: list[Any] = []  # intervals of the brokers that left or were killed
        self.halts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.supervisor = threading.Thread(target=self._supervise, name="farm-supervisor", daemon=True)
        self.supervisor.start()

    def _supervise(self) -> None:
        """What systemd or docker's restart policy does for a deployed broker: one that halted at its fence
        deadline (an embedded worker kills itself) is started again under the same id."""
        import logging

        while not self.closing.wait(0.1):
            with self.lock:
                halted = [(b, w) for b, w in self.workers.items() if w.halted.is_set()]
            for bid, w in halted:
                with self.lock:
                    if self.workers.get(bid) is not w:
                        continue  # left or killed meanwhile
                    del self.workers[bid]
                    self.gone += list(w.intervals)
                    self.halts[bid] += 1
                logging.getLogger(__name__).warning("farm: %s halted at its fence deadline; restarting it", bid)
                try:
                    self.start(bid)
                except Exception:
                    logging.getLogger(__name__).exception("farm: restarting %s", bid)

    def start(self, bid: str) -> None:
        import dataclasses

        from broker_sim.runners.noop import NoopRunner
        from broker_sim.sim.netproxy import NetProxy
        from broker_sim.worker import Worker, WorkerConfig

        a = self.args
        settings = self.settings
        if a.proxies:
            proxy = self.proxies.get(bid)
            if proxy is None:
                host, port = a.zk.split(",")[0].rsplit(":", 1)
                proxy = self.proxies[bid] = NetProxy(host, int(port), name=f"proxy-{bid}")
            proxy.heal()
            settings = dataclasses.replace(settings, hosts=proxy.address)
        group = "default" if a.groups <= 1 else f"g{int(bid.rsplit('-', 1)[1]) % a.groups}"
        cfg = WorkerConfig(
            broker_id=bid,
            settings=settings,
            group=group,
            protocols=self.protocols,
            assignors=(a.assignor,),
            instance_id=bid if a.static else None,
            pool_size=a.pool,
            status_interval_s=1.0,
            metrics_interval_s=a.metrics_interval,
            intervals_flush_s=3600.0,
            on_halt="kill",
        )
        pause = threading.Event()
        w = Worker(cfg, runner=NoopRunner(a.start_latency, a.stop_latency), pause=pause).start()
        with self.lock:
            self.workers[bid] = w
            self.pauses[bid] = pause

    def _retire(self, bid: str) -> Any:
        with self.lock:
            w = self.workers.pop(bid)
        return w

    def _keep_intervals(self, w: Any) -> None:
        with self.lock:
            self.gone += list(w.intervals)

    def leave(self, bid: str) -> None:
        w = self._retire(bid)
        w.stop()
        self._keep_intervals(w)

    def kill(self, bid: str) -> None:
        w = self._retire(bid)
        w.kill()
        self._keep_intervals(w)

    def shutdown(self, bid: str, timeout: float) -> bool:
        with self.lock:
            w = self.workers[bid]
        w.request_shutdown()
        ok = w.exited.wait(timeout)
        self.leave(bid)
        return ok

    def partition(self, bid: str, seconds: float, freeze: bool = False) -> None:
        with self.lock:
            pause = self.pauses[bid]
        proxy = self.proxies[bid]
        if freeze:
            pause.set()
        proxy.partition()
        time.sleep(seconds)
        proxy.reset()
        proxy.heal()
        pause.clear()

    def snapshot(self) -> dict[str, list[str]]:
        with self.lock:
            ws = dict(self.workers)
        return {bid: sorted(w.running_tasks()) for bid, w in ws.items()}

    def intervals(self) -> list[Any]:
        with self.lock:
            ws = list(self.workers.values())
            out = list(self.gone)
        for w in ws:
            out += list(w.intervals) + w.open_intervals()
        return out

    def stop(self) -> int:
        self.closing.set()
        self.supervisor.join(5)
        with self.lock:
            ws = list(self.workers.values())
            self.workers.clear()
        with ThreadPoolExecutor(max_workers=16, thread_name_prefix="farm-stop") as ex:
            list(ex.map(lambda w: w.stop(), ws))
        for p in self.proxies.values():
            p.close()
        return len(ws)


def _serve(args: argparse.Namespace) -> None:
    import psutil

    from controller.protocol.records import codecs

    logging_quiet()
    farm = _FarmServer(args)

    def out(doc: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

    ids = (
        args.ids.split(",")
        if args.ids
        else [f"{args.prefix}-{i:03d}" for i in range(args.first, args.first + args.brokers)]
    )
    proc = psutil.Process()
    rss_before = proc.memory_info().rss  # the interpreter with everything imported, no broker yet
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="farm-start") as ex:
        list(ex.map(farm.start, [i for i in ids if i]))
    out(
        {
            "event": "ready",
            "brokers": len(farm.workers),
            "start_s": round(time.monotonic() - t0, 3),
            "pid": os.getpid(),
            "rss_before": rss_before,
        }
    )
    for line in sys.stdin:  # ends at EOF (parent gone) or on "stop"
        try:
            req = json.loads(line)
            cmd = req.get("cmd")
        except (json.JSONDecodeError, AttributeError):
            out({"error": "bad json"})
            continue
        try:
            if cmd == "status":
                snap = farm.snapshot()
                counts = Counter(t for ts in snap.values() for t in ts)
                per = [len(ts) for ts in snap.values()]
                with farm.lock:
                    states = Counter(getattr(w.state(), "value", str(w.state())) for w in farm.workers.values())
                out(
                    {
                        "running": sum(per),
                        "distinct": len(counts),
                        "dupes": sum(1 for v in counts.values() if v > 1),
                        "min": min(per) if per else 0,
                        "max": max(per) if per else 0,
                        "brokers": len(per),
                        "states": dict(states),
                    }
                )
            elif cmd == "running":
                snap = farm.snapshot()
                with farm.lock:
                    halts = dict(farm.halts)
                    ws = list(farm.workers.values())
                starts = [s for w in ws if (s := w.last_start()) is not None]  # (each worker's lock, not under ours)
                out(
                    {
                        "counts": {b: len(ts) for b, ts in snap.items()},
                        "digest": task_digest(t for ts in snap.values() for t in ts),
                        "halts": halts,
                        "last_start": max(starts, default=None),
                    }
                )
            elif cmd == "tasks":
                out({"tasks": farm.snapshot()})
            elif cmd == "rss":
                out(
                    {
                        "rss": proc.memory_info().rss,
                        "threads": proc.num_threads(),
                        "brokers": len(farm.workers),
                        "cpu_s": sum(proc.cpu_times()[:2]),
                    }
                )
            elif cmd == "start":
                farm.start(req["id"])
                out({"ok": True})
            elif cmd in ("leave", "kill"):
                getattr(farm, cmd)(req["id"])
                out({"ok": True})
            elif cmd == "shutdown":
                out({"ok": farm.shutdown(req["id"], float(req.get("within", 60.0)))})
            elif cmd in ("pause", "partition"):
                farm.partition(req["id"], float(req["seconds"]), freeze=cmd == "pause")
                out({"ok": True})
            elif cmd == "intervals":
                out({"intervals": [codecs.to_jsonable(i) for i in farm.intervals()], "now": time.time()})
            elif cmd == "stop":
                out({"stopped": farm.stop()})
                return
            else:
                out({"error": f"unknown command {cmd!r}"})
        except KeyError as exc:
            out({"error": f"{cmd}: no broker {exc}" if cmd != "start" else f"{cmd}: missing {exc}"})
    farm.stop()


def logging_quiet() -> None:
    """Warnings and errors only, on stderr (the parent keeps them in the farm's log)."""
    import logging

    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m broker_sim.sim.farm")
    p.add_argument("--zk", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--brokers", type=int, default=0)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--prefix", default="broker")
    p.add_argument("--ids", default="", help="comma-separated broker ids (instead of --brokers/--first/--prefix)")
    p.add_argument("--protocol", default="cooperative")
    p.add_argument("--assignor", default="cooperative-sticky")
    p.add_argument("--pool", type=int, default=8)
    p.add_argument("--groups", type=int, default=1, help="broker i joins group g<i %% groups> (1: 'default')")
    p.add_argument("--session-timeout", type=float, default=20.0)
    p.add_argument("--start-latency", type=float, default=0.0)
    p.add_argument("--stop-latency", type=float, default=0.0)
    p.add_argument("--metrics-interval", type=float, default=5.0, help="seconds between metric-only status writes")
    p.add_argument("--static", action="store_true", help="static membership (instance id = broker id)")
    p.add_argument("--proxies", action="store_true", help="each broker reaches ZooKeeper through its own proxy")
    _serve(p.parse_args(argv))


# ---- the parent's handle ------------------------------------------------------------------------------
class FarmError(ZkcError, RuntimeError):
    """The farm process did not answer, or exited."""


class Farm:
    """Starts a farm as a child process and talks to it; ``close`` stops it (by its pid if need be).
    ``wait_ready=False`` returns at once (start several farms together, then ``wait_ready()`` each)."""

    def __init__(
        self,
        zk: str,
        root: str,
        brokers: int = 0,
        first: int = 0,
        prefix: str = "broker",
        session_timeout: float = 20.0,
        pool: int = 8,
        protocol: str = "cooperative",
        assignor: str = "cooperative-sticky",
        start_latency: float = 0.0,
        stop_latency: float = 0.0,
        log_path: Path | None = None,
        ready_timeout: float = 300.0,
        groups: int = 1,
        ids: list[str] | None = None,
        static: bool = False,
        proxies: bool = False,
        metrics_interval: float = 5.0,
        wait_ready: bool = True,
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "broker_sim.sim.farm",
            "--zk",
            zk,
            "--root",
            root,
            "--brokers",
            str(brokers),
            "--first",
            str(first),
            "--prefix",
            prefix,
            "--session-timeout",
            str(session_timeout),
            "--pool",
            str(pool),
            "--protocol",
            protocol,
            "--assignor",
            assignor,
            "--start-latency",
            str(start_latency),
            "--stop-latency",
            str(stop_latency),
            "--groups",
            str(groups),
            "--metrics-interval",
            str(metrics_interval),
        ]
        if ids is not None:
            if any("," in i for i in ids):
                raise ValueError("broker ids must not contain ','")
            cmd += ["--ids", ",".join(ids)]
        cmd += ["--static"] * static + ["--proxies"] * proxies
        self.log_path = log_path
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            cmd,
            cwd=PACKAGE_PARENT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._call_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"farm-reader-{self.pid}", daemon=True)
        self._reader.start()
        self.ready: dict[str, Any] = {}
        self._ready_timeout = ready_timeout
        if wait_ready:
            self.wait_ready()

    def wait_ready(self) -> dict[str, Any]:
        if not self.ready:
            self.ready = self._next(self._ready_timeout)
            if "event" not in self.ready:
                raise FarmError(f"farm {self.pid} did not start: {self.ready}")
        return self.ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def log_tail(self, lines: int = 5) -> str:
        if self.log_path is None or not Path(self.log_path).exists():
            return ""
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise FarmError(f"farm {self.pid}: no answer within {timeout}s") from None
        if line is None:
            self._lines.put(None)  # every later call fails the same way
            tail = self.log_tail()
            raise FarmError(f"farm {self.pid} exited (code {self.proc.poll()})" + (f": {tail}" if tail else ""))
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, cmd: str, timeout: float = 120.0, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        with self._call_lock:
            try:
                self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise FarmError(f"farm {self.pid} exited (code {self.proc.poll()})") from None
            answer = self._next(timeout)
        if "error" in answer:
            raise FarmError(f"farm {self.pid}: {answer['error']}")
        return answer

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
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except Exception:
                pass
        if not isinstance(self._log, int):  # a log file, not subprocess.DEVNULL
            self._log.close()

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


if __name__ == "__main__":
    main()
