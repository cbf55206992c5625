"""The one SparkSession of a worker process: its master and settings, created lazily and stopped for good.

Why these defaults: tasks of one worker share the session, so the scheduler is FAIR (one pool per task, see
``spark_jobs``); workers run on small shared machines, so the UI is off, shuffles use few partitions and the
driver heap is bounded. Everything is overridable with ``spark_conf`` (``--spark-conf k=v``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from controller.protocol.errors import ZkcError


class SparkSetupError(ZkcError, RuntimeError):
    """Spark cannot start here (no Java, no pyspark, a clashing session); the message says what to do."""

    status = 503
    code = "spark_setup"


class SparkDriverDied(SparkSetupError):
    """The driver JVM this process launched exited under a session in use (killed, crashed, out of memory):
    every query ended with it and nothing can start on its gateway; only a new process starts a new JVM."""

    code = "spark_driver_died"


def driver_death(pid: int, returncode: int | None, session_dropped: bool) -> str | None:
    """Why a session is dead: the driver JVM we launched has exited (``returncode``) while we still held its
    session. None while it runs, and when we dropped the session first: our own stop ends the JVM after that."""
    if returncode is None or session_dropped:
        return None
    if returncode < 0:
        try:
            how = f"signal {-returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            how = f"signal {-returncode}"
    else:
        how = f"exit code {returncode}"
    return f"its Spark driver JVM (pid {pid}) exited with {how} while its session was in use"


def local_master() -> str:
    """``local[N]`` with N = the cores of this machine: the default when no master is given."""
    return f"local[{os.cpu_count() or 1}]"


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def default_conf(master: str) -> dict[str, str]:
    cores = os.cpu_count() or 1
    conf = {
        "spark.scheduler.mode": "FAIR",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(min(8, max(2, cores))),
        "spark.driver.memory": "1g",
        "spark.sql.streaming.numRecentProgressUpdates": "20",
    }
    if is_local(master):  # nothing to reach from outside: stay on loopback (also silences the hostname warning)
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    return conf


def check_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return
    if not shutil.which("java"):
        raise SparkSetupError(
            "java not found: Spark needs a Java 17 runtime "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)"
        )


def spark_home() -> str:
    """The Spark distribution inside the installed pyspark wheel (``bin/spark-submit``, ``jars/``)."""
    env = os.environ.get("SPARK_HOME")
    if env and os.path.isfile(os.path.join(env, "bin", "spark-submit")):
        return env
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("pyspark is not installed: pip install 'pyspark[connect]==4.3.0'") from None
    home = os.path.dirname(pyspark.__file__)
    if not os.path.isfile(os.path.join(home, "bin", "spark-submit")):
        raise SparkSetupError(f"{home} holds no bin/spark-submit: reinstall pyspark or set SPARK_HOME")
    return home


MASTER_CONNECT_TIMEOUT_S = 5.0


def standalone_masters(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://h1:p1,h2:p2`` master URL (none for local, yarn, k8s...)."""
    if not master.startswith("spark://"):
        return []
    out = []
    for part in master[len("spark://") :].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise SparkSetupError(f"Spark master {master!r}: {part!r} is not host:port (spark://HOST:7077)")
        out.append((host.strip("[]"), int(port)))
    return out


def check_master_reachable(master: str, timeout: float = MASTER_CONNECT_TIMEOUT_S) -> None:
    """Refuse a standalone master that answers on none of its addresses, at once and with what to do: Spark
    itself retries for a minute and then leaves a SparkContext that never gets an executor."""
    masters = standalone_masters(master)
    errors = []
    for host, port in masters:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
    if masters:
        raise SparkSetupError(
            f"cannot reach the Spark master {master} ({'; '.join(errors)}): start it "
            f"($SPARK_HOME/sbin/start-master.sh), fix --spark-master, or leave it out to run Spark locally"
        )


@dataclass
class SessionHolder:
    """Creates the process's SparkSession on first use; ``stop`` also ends the JVM this holder launched.

    Shared: every runner of a process on the same master holds the same holder (``acquire_session``), as
    a process has one SparkContext; the last ``release`` stops it. The first runner's settings win.
    """

    master: str
    conf: dict[str, str]
    app_name: str
    refs: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _spark: Any = field(default=None, repr=False)
    _launched_jvm: bool = field(default=False, repr=False)
    #: the driver JVM's process (``subprocess.Popen``), if this holder launched it
    _jvm: Any = field(default=None, repr=False)
    startup_s: float | None = None
    #: wall time the session's start began (None: not begun)
    started_at: float | None = None

    def get(self) -> Any:
        """The session, started on first use; refused once its JVM died (its gateway answers nothing)."""
        with self._lock:
            if self._spark is None:
                self._spark = self._create()
            elif (death := self.death()) is not None:
                raise SparkDriverDied(f"{death}: its SparkSession is gone; restart this process for a new one")
            return self._spark

    def death(self) -> str | None:
        """Why the session is dead (the JVM this holder launched exited, and not by our ``stop``), or None.
        Lock-free, so a watchdog may ask while a stop holds the lock: the exit is read before the session,
        and ``stop`` drops the session before it ends the JVM."""
        proc = self._jvm
        if proc is None:
            return None
        returncode = proc.poll()
        return driver_death(proc.pid, returncode, session_dropped=self._spark is None)

    @property
    def started(self) -> bool:
        return self._spark is not None

    def jvm_pid(self) -> int | None:
        """The pid of the driver JVM, if this holder launched it (and it runs)."""
        proc = self._jvm
        if self._spark is None or proc is None:
            return None
        return None if proc.poll() is not None else proc.pid

    def _create(self) -> Any:
        import time

        check_java()
        try:
            from pyspark import SparkContext
            from pyspark.sql import SparkSession
        except ImportError:
            raise SparkSetupError("pyspark is not installed: pip install 'pyspark[connect]==4.3.0'") from None
        active = SparkContext._active_spark_context
        if active is not None and active.master != self.master:
            raise SparkSetupError(
                f"this process already runs a SparkContext on {active.master!r}; one SparkSession "
                f"per worker process (wanted {self.master!r}): run another worker process instead"
            )
        for var in ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
            if var in os.environ:
                raise SparkSetupError(f"{var} is set: the spark runner needs a classic (non-Connect) session")
        self.started_at = time.time()
        check_master_reachable(self.master)
        self._launched_jvm = SparkContext._gateway is None
        t0 = time.monotonic()
        builder = SparkSession.builder.master(self.master).appName(self.app_name)
        for key, value in self.conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        self._jvm = getattr(SparkContext._gateway, "proc", None) if self._launched_jvm else None
        self.startup_s = round(time.monotonic() - t0, 3)
        return spark

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the session; if this holder launched the JVM, shut the gateway and wait for that JVM to exit.
        A session whose JVM died is forgotten all the same (its stop cannot reach the JVM)."""
        with self._lock:
            dead = self.death() is not None
            spark, self._spark = self._spark, None
            if spark is None:
                return
            from pyspark import SparkContext
            from pyspark.sql import SparkSession

            try:
                spark.stop()
            except Exception:
                if not dead:
                    raise
                SparkSession._instantiatedSession = SparkSession._activeSession = None
            if not self._launched_jvm or SparkContext._gateway is None:
                return
            gateway = SparkContext._gateway
            proc = getattr(gateway, "proc", None)
            try:
                gateway.shutdown()
            finally:
                SparkContext._gateway = None
                SparkContext._jvm = None
            if proc is not None:
                try:
                    if proc.stdin:
                        proc.stdin.close()  # the gateway JVM exits when its stdin closes
                    proc.wait(timeout)
                except Exception:
                    proc.kill()
                    proc.wait(10)
            self._jvm = None


_HOLDERS: dict[str, SessionHolder] = {}
_HOLDERS_LOCK = threading.Lock()


def acquire_session(master: str, conf: dict[str, str], app_name: str) -> SessionHolder:
    """The process's holder for ``master`` (no JVM starts until ``get``); pair with ``release_session``."""
    with _HOLDERS_LOCK:
        others = [m for m, h in _HOLDERS.items() if m != master and h.refs > 0]
        if others:
            raise SparkSetupError(
                f"this process already runs a Spark runner on {others[0]!r}; one SparkSession per "
                f"worker process (wanted {master!r}): run another worker process instead"
            )
        holder = _HOLDERS.get(master)
        if holder is None:
            holder = _HOLDERS[master] = SessionHolder(master=master, conf=dict(conf), app_name=app_name)
        holder.refs += 1
        return holder


def release_session(holder: SessionHolder, timeout: float = 30.0) -> None:
    """Drop one reference; the last one stops the session and its JVM."""
    with _HOLDERS_LOCK:
        holder.refs -= 1
        last = holder.refs <= 0
        if last:
            _HOLDERS.pop(holder.master, None)
    if last:
        holder.stop(timeout)


__all__ = [
    "SparkSetupError",
    "SparkDriverDied",
    "driver_death",
    "SessionHolder",
    "acquire_session",
    "release_session",
    "local_master",
    "is_local",
    "default_conf",
    "check_java",
    "check_master_reachable",
    "spark_home",
]
