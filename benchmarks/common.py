"""Shared pieces of the benchmarks: the run context, machine info, tables, statistics, the embedded
ZooKeeper, JSON results, a per-thread CPU meter and a small sampling profiler."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


# ---- the run ------------------------------------------------------------------------------------------
@dataclass
class Bench:
    """What every benchmark gets: the mode, where results go, and how to print."""

    quick: bool = False
    out_dir: Path = RESULTS_DIR
    machine: dict[str, Any] = field(default_factory=dict)
    echo: Callable[[str], None] = print

    def log(self, msg: str) -> None:
        self.echo(f"  · {msg}")

    def write(self, name: str, doc: dict[str, Any]) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{name}.json"
        full = {
            "benchmark": name,
            "mode": "quick" if self.quick else "full",
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": self.machine,
            **doc,
        }
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(full, indent=1, default=jsonable) + "\n")
        tmp.replace(path)
        return path

    def png(self, name: str) -> Path:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self.out_dir / f"{name}.png"


def jsonable(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return value._asdict()
    if hasattr(value, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Path):
        return str(value)
    return str(value)


def quiet_logging() -> None:
    """Benchmarks print tables; kazoo's reconnect chatter and our INFO lines would bury them."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    for name in ("kazoo", "kazoo.client", "kazoo.protocol.connection", "py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in ("controller", "broker_sim"):
        logging.getLogger(name).setLevel(logging.ERROR)


# ---- machine ------------------------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def zookeeper_version() -> str | None:
    try:
        from controller.zk.server import zookeeper_classpath

        for jar in zookeeper_classpath().split(os.pathsep):
            m = re.match(r"zookeeper-(\d+\.\d+\.\d+)\.jar$", os.path.basename(jar))
            if m:
                return m.group(1)
    except Exception:
        return None
    return None


def java_version() -> str | None:
    try:
        out = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=20)
        first = (out.stderr or out.stdout).splitlines()[0]
        return first.strip()
    except Exception:
        return None


def machine_info() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "ram_gb": round(vm.total / 2**30, 1),
        "ram_available_gb_at_start": round(vm.available / 2**30, 1),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "zookeeper": zookeeper_version(),
        "java": java_version(),
        "kazoo": _version("kazoo"),
        "pyspark": _version("pyspark"),
        "matplotlib": _version("matplotlib"),
        "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
        return out.stdout.strip() or None
    except Exception:
        return None


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m.get('cpu_model')} · {m.get('logical_cores')} cores · {m.get('ram_gb')} GB RAM · Python {m.get('python')} · "
        f"ZooKeeper {m.get('zookeeper')} · kazoo {m.get('kazoo')} · pyspark {m.get('pyspark')} · load {m.get('load_avg_at_start')}"
    )


# ---- statistics and tables ----------------------------------------------------------------------------
def median(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = max(0, min(len(xs) - 1, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1000):
            return f"{v:,.0f}"
        if v != 0 and abs(v) < 0.01:
            return f"{v:.2g}"
        return (
            f"{v:.{digits}g}"
            if abs(v) < 1
            else f"{v:.{max(1, digits - len(str(int(abs(v)))))}f}".rstrip("0").rstrip(".")
        )
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(fmt(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def target(
    name: str, measured: Any, goal: str, ok: bool | None, note: str = "", quick_size: bool = False
) -> dict[str, Any]:
    """A target and its measured figure. ``quick_size``: measured at quick size while the target is
    defined at full size, so it is reported but not judged."""
    if quick_size:
        return {
            "target": name,
            "measured": measured,
            "goal": goal,
            "met": None,
            "note": ("quick size, judged at full size only; " + note).rstrip("; "),
        }
    return {"target": name, "measured": measured, "goal": goal, "met": ok, "note": note}


# ---- ZooKeeper ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def zookeeper(heap_mb: int = 512, name: str = "bench") -> Iterator[Any]:
    """A fresh embedded ZooKeeper on a free loopback port, stopped (by its pid) on exit."""
    from controller.zk.server import ZooKeeperServer, free_port

    tmp = tempfile.TemporaryDirectory(prefix=f"zkc-{name}-")
    server = ZooKeeperServer(
        data_dir=Path(tmp.name) / "zk", port=free_port(), tick_ms=200, max_session_timeout_ms=120_000, heap_mb=heap_mb
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
        tmp.cleanup()


# ---- CPU accounting -----------------------------------------------------------------------------------
def thread_cpu_s(native_ids: Sequence[int], pid: int | None = None) -> float:
    """User+system CPU seconds consumed so far by these OS threads of a process (Linux)."""
    wanted = set(native_ids)
    total = 0.0
    for t in psutil.Process(pid or os.getpid()).threads():
        if t.id in wanted:
            total += t.user_time + t.system_time
    return total


# ---- a sampling profiler of this process's threads ----------------------------------------------------
class StackSampler:
    """Samples ``sys._current_frames()`` every ``interval`` s from a named thread; aggregates, per
    thread-name prefix, the innermost project frames and whole-thread states (running/waiting). Cheap
    enough to leave on during a scenario; gives py-spy-like evidence without ptrace."""

    def __init__(self, interval: float = 0.005, name: str = "bench-sampler", max_samples: int = 200_000) -> None:
        self.interval = interval
        self.samples = 0
        self.max_samples = max_samples
        self.by_group: dict[str, Counter[str]] = {}
        self.leaf: dict[str, Counter[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @staticmethod
    def group_of(thread_name: str) -> str:
        n = re.sub(r"broker-\d+|ctl-[\w-]+|joiner-\d+|sp-\d+", "*", thread_name)
        n = re.sub(r"_\d+$", "_N", n)
        n = re.sub(r"-\d+$", "-N", n)
        return n

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval) and self.samples < self.max_samples:
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                group = self.group_of(names.get(ident, "?"))
                stack = []
                f = frame
                depth = 0
                while f is not None and depth < 60:
                    code = f.f_code
                    stack.append(f"{Path(code.co_filename).name}:{code.co_name}")
                    f = f.f_back
                    depth += 1
                top = stack[0] if stack else "?"
                ours = next((s for s in stack if s.split(":")[0] in _OURS), top)
                self.by_group.setdefault(group, Counter())[top] += 1
                self.leaf.setdefault(group, Counter())[ours] += 1
            self.samples += 1

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def report(self, top: int = 6) -> dict[str, Any]:
        """Per thread group: share of samples per innermost frame, and per innermost project frame."""
        out: dict[str, Any] = {}
        for group, counter in sorted(self.by_group.items(), key=lambda kv: -sum(kv[1].values())):
            n = sum(counter.values())
            out[group] = {
                "samples": n,
                "innermost": [(k, round(v / n, 3)) for k, v in counter.most_common(top)],
                "innermost_project_frame": [(k, round(v / n, 3)) for k, v in self.leaf[group].most_common(top)],
            }
        return out


_OURS = {
    p.name for d in ("controller", "broker_sim", "broker_sim/runners", "benchmarks") for p in (REPO / d).glob("*.py")
}
