"""Process brokers and controllers of a chaos run. A process broker runs ``python -m broker_sim.chaos
broker``: the same ``Worker`` as ``zkctl broker run``, whose runner also appends every start and stop
to a journal file (written before a start and after a stop), so that the run windows of a process that
was killed -9 are known exactly."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from broker_sim.runners.base import RunStatus, TaskRunner
from broker_sim.runners.noop import NoopRunner
from controller.protocol.records.task_records import RunInterval
from controller.protocol.tasks.spec import TaskSpec

log = logging.getLogger(__name__)


class JournalRunner(TaskRunner):
    """A no-op runner that appends ``start`` (before starting) and ``stop`` (after stopping) lines to a
    journal, so the run windows of a process killed -9 are known: a start with no stop ran until the
    process died."""

    def __init__(self, path: str | Path, inner: TaskRunner | None = None) -> None:
        self.inner = inner or NoopRunner()
        self.name = self.inner.name
        self.stop_budget_s = self.inner.stop_budget_s
        self.runs_processes = self.inner.runs_processes
        self._f = open(path, "a", buffering=1)
        self._lock = threading.Lock()
        self._wedged = False
        self._unwedged = threading.Event()

    def _note(self, event: str, task: str) -> None:
        with self._lock:
            self._f.write(json.dumps({"e": event, "t": task, "ts": time.time(), "pid": os.getpid()}) + "\n")

    def start(self, task_id: str, spec: TaskSpec, generation: int) -> None:
        self._note("start", task_id)
        try:
            self.inner.start(task_id, spec, generation)
        except BaseException:
            self._note("stop", task_id)
            raise

    def stop(self, task_id: str, timeout: float = 60.0) -> None:
        running = task_id in self.inner.running()
        if self._wedged:  # a runner with no wedge of its own (spark): the stop hangs, the task runs on
            self._unwedged.wait()  # bounded by kill/close
            return  # killed: the process ends now, its journal's open runs end with it
        self.inner.stop(task_id, timeout)
        if running:
            self._note("stop", task_id)

    def wedge(self, on: bool) -> None:
        """The "wedged-stop" fault: every stop hangs from now on, as a wedged driver's would. The inner
        runner's own wedge if it has one (the no-op runner's); else this runner's stops block until ``kill``
        (a Spark query then runs on until the broker's watchdog kills its JVM and halts)."""
        inner = getattr(self.inner, "wedge", None)
        if inner is not None:
            inner(on)
            return
        self._wedged = on
        if on:
            self._unwedged.clear()
        else:
            self._unwedged.set()

    def status(self, task_id: str) -> RunStatus:
        return self.inner.status(task_id)

    def running(self) -> set[str]:
        return self.inner.running()

    def processes(self) -> tuple[set[int], set[int]]:
        return self.inner.processes()

    def kill(self) -> None:
        self._unwedged.set()
        self.inner.kill()

    def close(self) -> None:
        self._unwedged.set()
        self._wedged = False
        for t in sorted(self.inner.running()):
            self.stop(t)
        self.inner.close()
        with self._lock:
            self._f.close()


def read_journal(path: Path, broker: str, died_at: float | None) -> list[RunInterval]:
    """Run intervals from a journal; a start with no stop ends at ``died_at`` (or stays open)."""
    out: list[RunInterval] = []
    open_: dict[str, float] = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut short by kill -9
        if rec["e"] == "start":
            open_[rec["t"]] = rec["ts"]
        elif rec["e"] == "stop" and rec["t"] in open_:
            start = open_.pop(rec["t"])
            out.append(
                RunInterval(
                    task_id=rec["t"], broker=broker, start=start, end=rec["ts"], acquired=start, released=rec["ts"]
                )
            )
    for t, start in open_.items():
        out.append(RunInterval(task_id=t, broker=broker, start=start, end=died_at, acquired=start, released=died_at))
    return out


class JournalTail:
    """What a journal says runs now, read incrementally (a long run's journals grow to megabytes: a checker
    that samples every second reads only what was appended since it last looked). A line not yet complete
    is left for the next look."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._running: set[str] = set()

    def running(self) -> set[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return set(self._running)
        end = chunk.rfind(b"\n") + 1
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by kill -9 (the next start follows it)
            if rec.get("e") == "start":
                self._running.add(rec["t"])
            elif rec.get("e") == "stop":
                self._running.discard(rec["t"])
        self._offset += end
        return set(self._running)


def install_thread_dump() -> None:
    """SIGQUIT writes every thread's stack to stderr (the log) and the process runs on: what a broker was doing
    when a chaos run failed (its post-mortem sends it). faulthandler writes from the signal handler itself,
    so a process whose Python threads are all stuck still answers; the dump names threads by id only, so the
    main thread then logs each id's name (when it next runs Python code)."""

    def names(_sig: int, _frame: Any) -> None:
        log.warning("thread names:\n%s", "\n".join(f"  0x{t.ident or 0:016x} {t.name}" for t in threading.enumerate()))

    signal.signal(signal.SIGQUIT, names)
    faulthandler.register(signal.SIGQUIT, file=sys.stderr, all_threads=True, chain=True)


def broker_main(argv: list[str]) -> int:
    from broker_sim.worker import Worker, WorkerConfig, install_signal_handlers
    from broker_sim.worker.logsink import log_without_blocking
    from controller.protocol.group.rules import COOPERATIVE, PROTOCOLS, protocols_for
    from controller.zk.client import settings_from_env

    p = argparse.ArgumentParser(prog="python -m broker_sim.chaos broker")
    p.add_argument("--id", required=True)
    p.add_argument("--zk", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--session-timeout", type=float, default=4.0)
    p.add_argument("--journal", required=True)
    p.add_argument("--runner", choices=("noop", "spark"), default="noop")
    p.add_argument("--spark-master", default="local[1]")
    p.add_argument("--checkpoint-root", default=None)
    p.add_argument("--protocol", choices=PROTOCOLS, default=COOPERATIVE)
    a = p.parse_args(argv)
    log_without_blocking(logging.INFO)  # a full output pipe must not stall the fence's threads
    install_thread_dump()
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    settings = settings_from_env(hosts=a.zk, root=a.root, session_timeout_s=a.session_timeout)
    config = WorkerConfig(
        broker_id=a.id,
        settings=settings,
        protocols=protocols_for(a.protocol),
        status_interval_s=0.5,
        intervals_flush_s=2.0,
    )
    inner: TaskRunner | None = None
    if a.runner == "spark":
        from broker_sim.runners.spark import SparkRunner

        inner = SparkRunner(
            spark_master=a.spark_master,
            checkpoint_root=a.checkpoint_root,
            spark_conf={
                "spark.driver.memory": "512m",
                "spark.sql.shuffle.partitions": "1",
                "spark.ui.enabled": "false",
                "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
            },
        )
    runner = JournalRunner(a.journal, inner)
    worker = Worker(config, runner=runner)
    stop_now = threading.Event()
    install_signal_handlers(worker, stop_now.set)
    # the chaos tool's "wedged-stop" fault: every stop hangs from now on (with any runner: a SIGUSR2 left to
    # its default action would end the process, which is another fault)
    signal.signal(signal.SIGUSR2, lambda _s, _f: runner.wedge(True))
    worker.start()
    try:
        while not (worker.exited.is_set() or stop_now.wait(0.1)):
            pass
    finally:
        worker.stop()
    return 0


#: How long the exit waiter of a process watches what is left of its process group (a JVM it started) after it
#: exited: the supervisor SIGKILLs the group when it notices the exit, well within this
GROUP_WATCH_S = 30.0


def group_has_live_members(pgid: int) -> bool:
    """Whether a process group has a member that is not a zombie. ``killpg(pgid, 0)`` also finds a member that
    died and was not yet reaped by whoever inherited it (an init that never reaps keeps it forever), which runs
    nothing: only when it finds one are the members looked at."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process leads a group of that id: not ours to judge, say alive
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def _ignore_broker_signals() -> None:
    """Run in the child between fork and exec: SIGUSR2 (the wedged-stop fault) and SIGQUIT (a thread dump)
    ignored until ``broker_main`` installs its handlers. Left to their default actions they end a broker that
    is still importing. An ignored disposition survives exec and the broker's handler replaces it; a handler
    would not survive exec, and a blocked signal would stay blocked past the handler, never delivered."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


class ChaosProcess:
    """A child process we started (stopped by its pid only). A named thread blocks in ``wait`` and stamps the
    moment it exits: the supervisor that notices the exit a poll later (most of a second under load) must
    not stretch the run windows of a process that was gone by then into its successor's."""

    def __init__(
        self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None, broker: bool = False
    ) -> None:
        self.name = name  # the child leads its own process group: signals reach it and what it started (a JVM)
        self.log_path = log_path
        with open(log_path, "ab") as out:
            self.popen = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                preexec_fn=_ignore_broker_signals if broker else None,
            )
        self.started = time.time()
        self.frozen = False
        self.stopping = False  # the harness ends it (a kill or a bounce): its exit is the fault's, not a halt
        self._exit_at: float | None = None
        self._group_gone_at: float | None = None
        self._group_watched = threading.Event()
        threading.Thread(target=self._wait, name=f"chaos-wait-{name}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _wait(self) -> None:
        """Stamp the exit, then watch the process group until nothing of it runs (bounded): a task the broker
        ran in a process it started (a Spark query in its JVM) may outlive it."""
        self.popen.wait()  # not a loop: it returns when the process exits, which the run's end makes sure of
        self._exit_at = time.time()
        deadline = time.monotonic() + GROUP_WATCH_S
        while time.monotonic() < deadline:
            if not group_has_live_members(self.pid):
                self._group_gone_at = time.time()  # the first look follows the exit by microseconds
                break
            time.sleep(0.02)
        self._group_watched.set()

    def exit_time(self) -> float | None:
        """When the process exited (wall clock), as its waiter saw it; None while it runs."""
        return self._exit_at

    def group_gone(self) -> bool:
        """Whether nothing of its process group runs any more (it, and what it started)."""
        return self._group_gone_at is not None or (self._exit_at is not None and not group_has_live_members(self.pid))

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int, group: bool = True) -> bool:
        """Signal its process group (it and what it started), or with ``group=False`` the process alone (a
        JVM it started has signal handlers of its own). False when it is gone: nothing was delivered."""
        if self.alive():
            try:
                (os.killpg if group else os.kill)(self.pid, sig)
                return True
            except ProcessLookupError:
                pass
        return False

    def kill9(self) -> float:
        """SIGKILL of its group; returns when the group was gone (the end of its run windows)."""
        self.stopping = True
        if self.frozen:
            self.signal(signal.SIGCONT)
            self.frozen = False
        self.signal(signal.SIGKILL)
        self.popen.wait(10)
        return self.reap_group()

    def reap_group(self, timeout: float = 5.0) -> float:
        """After the leader exited: SIGKILL whatever is left of its process group (a JVM it started), and
        return when the group was gone, which is when the run windows of its tasks end.

        A task runs in the process or in one it started, in its group: no run outlives the group. So the end
        is the leader's exit when nothing of the group survived it (the common case, stamped precisely), else
        when the survivors were gone: on their own, or at this SIGKILL when they still ran (the notice time,
        then the right end: they could run a task until then). Should the group's end not be seen within
        ``timeout``, the time now, after the SIGKILL: later than any real end, it can only make the overlap
        check stricter."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._group_watched.wait(timeout)
        return self._group_gone_at if self._group_gone_at is not None else time.time()

    def terminate(self, timeout: float) -> bool:
        """SIGTERM (a broker's controlled shutdown, a controller's stop); SIGKILL if not gone in time."""
        self.stopping = True
        if self.frozen:
            self.signal(signal.SIGCONT)
            self.frozen = False
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(10)
            return False
        finally:
            self.reap_group()


#: A line of a post-mortem is cut to this many characters; only the part of a log that can hold the lines wanted
#: is read (a log is bounded by nothing)
LINE_CHARS = 300


def _read_lines(path: Path, start: int, end: int | None) -> list[str]:
    """The lines of a log between two byte offsets (``end`` None: its end), each cut to ``LINE_CHARS``."""
    try:
        with open(path, "rb") as f:
            stop = f.seek(0, os.SEEK_END) if end is None else end
            f.seek(max(0, start))
            text = f.read(max(0, stop - f.tell())).decode(errors="replace")
    except OSError as exc:
        return [f"(log unreadable: {exc})"]
    return [t[:LINE_CHARS] for t in text.splitlines()]


def log_tail(path: Path, lines: int, end: int | None = None) -> list[str]:
    """The last ``lines`` lines of a log (before byte ``end`` if given)."""
    if end is None:
        try:
            end = path.stat().st_size
        except OSError as exc:
            return [f"(log unreadable: {exc})"]
    return _read_lines(path, end - lines * (LINE_CHARS + 1), end)[-lines:]


def log_head(path: Path, since: int, lines: int) -> list[str]:
    """Up to ``lines`` lines of a log from byte ``since`` on."""
    return _read_lines(path, since, since + lines * (LINE_CHARS + 1))[:lines]


#: Lines of a thread dump a post-mortem shows (a broker's dozen or so threads take ~10 lines each)
DUMP_LINES = 300


def dump_and_tail(
    brokers: dict[str, ChaosProcess], controllers: dict[str, ChaosProcess], lines: int = 25, wait_s: float = 1.0
) -> list[str]:
    """The processes' side of a post-mortem: each live broker process is sent SIGQUIT (its threads' stacks
    into its log, ``install_thread_dump``) and, ``wait_s`` later, each log's tail before the dump and the
    dump itself (up to ``DUMP_LINES`` lines), and each controller process's log tail. A frozen process would
    dump only once thawed: it is said to be frozen instead."""
    sizes: dict[str, int] = {}
    for bid, proc in sorted(brokers.items()):
        if proc.alive() and not proc.frozen:
            try:
                sizes[bid] = proc.log_path.stat().st_size
            except OSError:
                continue
            proc.signal(signal.SIGQUIT, group=False)  # the broker alone: a JVM it started would dump too
    if sizes:
        time.sleep(wait_s)
    out: list[str] = []
    for bid, proc in sorted(brokers.items()):
        state = "frozen" if proc.frozen else f"exit {proc.popen.poll()}"
        since = sizes.get(bid)
        out.append(f"--- {proc.log_path.name} ({state})\n" + "\n".join(log_tail(proc.log_path, lines, since)))
        if since is not None:
            dump = log_head(proc.log_path, since, DUMP_LINES)
            out.append(f"--- {proc.log_path.name}: its threads on SIGQUIT\n" + "\n".join(dump))
    for _cid, proc in sorted(controllers.items()):
        state = "frozen" if proc.frozen else f"exit {proc.popen.poll()}"
        out.append(f"--- {proc.log_path.name} ({state})\n" + "\n".join(log_tail(proc.log_path, lines)))
    return out


def zkctl_command() -> list[str]:
    exe = Path(sys.executable).parent / "zkctl"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("zkctl")
    return [found] if found else [sys.executable, "-m", "cli.main"]
