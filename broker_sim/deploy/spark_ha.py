"""Spark standalone in high availability on the cluster's own ZooKeeper, as processes: two or more masters in
ZooKeeper recovery mode (Spark's own: a Curator leader latch, the cluster's state kept in znodes) under
``<cluster root>/spark``, and workers that register with every master. Brokers submit to the
``spark://m1:7077,m2:7077`` URL this prints; Spark's driver follows the active master itself.

What Spark needs of ZooKeeper is Spark's business: each master holds a session of 60 s (Spark's fixed value,
capped by the server's ``maxSessionTimeout``), so a master killed outright is replaced once its session
expires; a master stopped cleanly hands over at once. Every process is started in a group of its own and
stopped by its pid.

On a secured cluster the masters authenticate with SASL (DIGEST-MD5) through a JAAS ``Client`` section
(``write_client_jaas``): Spark's Curator has no way to send the digest credentials zkcontroller's processes
use, and the policy's ``spark_users`` give that SASL identity rights on ``<root>/spark`` alone."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_sim.runners.procs import spawn, stop_process
from broker_sim.runners.spark_session import check_java, spark_home
from controller.protocol.errors import ZkcError

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
STATUS_TIMEOUT_S = 3.0
MAX_STATUS_BYTES = 4 * 1024 * 1024  # a master's /json/ answer read at most this far (it lists apps and workers)


#: ZooKeeper 3.9 runs in FIPS mode by default, which refuses SASL DIGEST-MD5: its clients and servers need it off
SASL_DIGEST_OPT = "-Dzookeeper.fips-mode=false"


class SparkHAError(ZkcError, RuntimeError):
    """A Spark master or worker that did not start, or a spec that cannot run."""

    code = "spark_ha"


def recovery_conf(zk_hosts: str, root: str) -> dict[str, str]:
    """The masters' recovery settings: ZooKeeper mode, the cluster's ensemble, a directory under its root."""
    if not zk_hosts or any(c.isspace() for c in zk_hosts):
        raise SparkHAError(f"ZooKeeper hosts {zk_hosts!r}: expected host:port[,host:port...]")
    if not root.startswith("/") or "//" in root or ".." in root.split("/"):
        raise SparkHAError(f"cluster root {root!r}: expected an absolute znode path")
    return {
        "spark.deploy.recoveryMode": "ZOOKEEPER",
        "spark.deploy.zookeeper.url": zk_hosts,
        "spark.deploy.zookeeper.dir": f"{root.rstrip('/')}/spark",
    }


def master_url(addresses: list[tuple[str, int]]) -> str:
    """``spark://h1:p1,h2:p2``: what a driver is given to follow whichever master is active."""
    return "spark://" + ",".join(f"{h}:{p}" for h, p in addresses)


@dataclass(frozen=True)
class SparkHASpec:
    zk_hosts: str
    root: str
    workdir: Path
    masters: int = 2
    workers: int = 1
    worker_cores: int = 1
    worker_memory: str = "1g"
    host: str = "127.0.0.1"
    daemon_memory: str = "256m"
    #: extra JVM options of the daemons (the test suite's C1-only flags, for instance)
    java_opts: str = ""
    #: ``spark.worker.timeout``: a worker silent this long is dead, and a master taking the lead waits this long
    #: for the workers and applications it recovered to answer before it drops the silent ones (and their
    #: cores go to the live applications): Spark's 60 s holds a pipeline whose worker died that long
    worker_timeout_s: int = 60
    #: a JAAS file with a ``Client`` section (``write_client_jaas``): the masters' SASL login to ZooKeeper
    jaas_file: Path | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.masters <= 5 or not 0 <= self.workers <= 8 or not 1 <= self.worker_cores <= 64:
            raise SparkHAError("between 1 and 5 masters, 0 and 8 workers, 1 and 64 cores a worker")
        recovery_conf(self.zk_hosts, self.root)  # refused here, before anything starts
        if not 5 <= self.worker_timeout_s <= 3600:
            raise SparkHAError("the worker timeout is between 5 and 3600 s")
        if self.jaas_file is not None and not Path(self.jaas_file).is_file():
            raise SparkHAError(f"JAAS file {self.jaas_file}: not a file")


@dataclass
class Daemon:
    """One Spark master or worker process (its group stopped by its pid)."""

    name: str
    port: int
    ui_port: int
    proc: subprocess.Popen[Any] | None = None
    log: Path = field(default_factory=Path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class SparkHA:
    """The masters and workers of ``spec``, started by ``start`` and stopped by ``stop`` (a context manager)."""

    def __init__(self, spec: SparkHASpec) -> None:
        self.spec = spec
        self.home = spark_home()
        self.masters = [Daemon(f"master-{i + 1}", _free_port(), _free_port()) for i in range(spec.masters)]
        self.workers = [Daemon(f"worker-{i + 1}", 0, _free_port()) for i in range(spec.workers)]
        self.dir = Path(spec.workdir).resolve()  # the daemons run in it: every path they are given is absolute
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf_file = self.dir / "spark-ha.conf"

    @property
    def url(self) -> str:
        return master_url([(self.spec.host, m.port) for m in self.masters])

    def __enter__(self) -> SparkHA:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _env(self, master: bool = False) -> dict[str, str]:
        opts = self.spec.java_opts
        if master and self.spec.jaas_file is not None:  # only masters talk to ZooKeeper
            opts += f" -Djava.security.auth.login.config={Path(self.spec.jaas_file).resolve()} {SASL_DIGEST_OPT}"
        return {
            **os.environ,
            "SPARK_HOME": self.home,
            "SPARK_LOCAL_IP": self.spec.host,
            "SPARK_DAEMON_MEMORY": self.spec.daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": opts.strip(),
            "SPARK_WORKER_DIR": str(self.dir / "work"),
            "SPARK_LOG_DIR": str(self.dir / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }

    def start(self, timeout: float = 300.0) -> SparkHA:
        """Every master, then (once one is ALIVE) every worker; refused with the log's tail if one exits. Each
        wait is bounded by ``timeout``: a JVM start on a loaded machine took over a minute (measured: 104 s)."""
        check_java()
        conf = {
            **recovery_conf(self.spec.zk_hosts, self.spec.root),
            "spark.worker.timeout": str(self.spec.worker_timeout_s),
        }
        self.conf_file.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
        try:
            for m in self.masters:
                self.start_master(m)
            _wait(lambda: self.active() is not None, timeout, "a Spark master to be ALIVE", self.masters)
            for w in self.workers:
                self.start_worker(w)
            _wait(lambda: self.alive_workers() >= len(self.workers), timeout, "the workers to register", self.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def start_master(self, m: Daemon) -> None:
        cmd = [os.path.join(self.home, "bin", "spark-class"), MASTER_CLASS, "--host", self.spec.host]
        cmd += ["--port", str(m.port), "--webui-port", str(m.ui_port), "--properties-file", str(self.conf_file)]
        m.log = self.dir / f"{m.name}.log"
        m.proc = spawn(cmd, env=self._env(master=True), cwd=self.dir, log=m.log)

    def start_worker(self, w: Daemon) -> None:
        """A worker (again, after a kill: a supervisor's restart) registering with every master."""
        cmd = [os.path.join(self.home, "bin", "spark-class"), WORKER_CLASS, self.url, "--host", self.spec.host]
        cmd += ["--cores", str(self.spec.worker_cores), "--memory", self.spec.worker_memory]
        cmd += ["--webui-port", str(w.ui_port), "--work-dir", str(self.dir / "work")]
        cmd += ["--properties-file", str(self.conf_file)]  # (the worker timeout sets its heartbeat)
        w.log = self.dir / f"{w.name}.log"
        w.proc = spawn(cmd, env=self._env(), cwd=self.dir, log=w.log)

    def add_worker(self) -> Daemon:
        """One more worker, started now (registering with every master)."""
        w = Daemon(f"worker-{len(self.workers) + 1}", 0, _free_port())
        self.workers.append(w)
        self.start_worker(w)
        return w

    def state(self, d: Daemon) -> dict[str, Any] | None:
        """A master's or worker's own account (its web UI's ``/json/``: a master's status, workers and
        applications, a worker's executors), or None when it does not answer."""
        if not d.alive():
            return None
        try:
            with urllib.request.urlopen(f"http://{self.spec.host}:{d.ui_port}/json/", timeout=STATUS_TIMEOUT_S) as r:
                body = json.loads(r.read(MAX_STATUS_BYTES))
        except (OSError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def apps(self) -> dict[str, str]:
        """The running applications (id -> name), as the active master lists them."""
        m = self.active()
        st = self.state(m) if m is not None else None
        apps = st.get("activeapps") if st else None
        rows = apps if isinstance(apps, list) else []
        return {a["id"]: str(a.get("name")) for a in rows if isinstance(a, dict) and isinstance(a.get("id"), str)}

    def executor_apps(self, w: Daemon) -> set[str]:
        """The applications a worker runs executors for (its own account)."""
        st = self.state(w)
        execs = st.get("executors") if st else None
        return (
            {e["appid"] for e in execs if isinstance(e, dict) and isinstance(e.get("appid"), str)}
            if isinstance(execs, list)
            else set()
        )

    def status(self, m: Daemon) -> str | None:
        """ALIVE, STANDBY, RECOVERING, COMPLETING_RECOVERY, or None (down, not answering)."""
        st = self.state(m)
        value = st.get("status") if st else None
        return value if isinstance(value, str) else None

    def active(self) -> Daemon | None:
        return next((m for m in self.masters if self.status(m) == "ALIVE"), None)

    def alive_workers(self) -> int:
        m = self.active()
        st = self.state(m) if m is not None else None
        n = st.get("aliveworkers", 0) if st else 0
        return n if isinstance(n, int) else 0

    def kill(self, d: Daemon) -> None:
        """kill -9 of a master or worker (its whole group: a worker's executors with it), no SIGTERM first: a
        master given SIGTERM would close its ZooKeeper session and hand over at once."""
        if d.proc is not None:
            try:
                os.killpg(d.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            stop_process(d.proc, grace_s=0.0, timeout_s=30)

    def stop(self) -> None:
        """Every worker, then every master, by pid (SIGTERM, then SIGKILL)."""
        for d in [*self.workers, *self.masters]:
            if d.proc is not None:
                try:
                    stop_process(d.proc, grace_s=10, timeout_s=30)
                except TimeoutError:
                    log.error("Spark %s (pid %d) did not stop", d.name, d.proc.pid)


def write_client_jaas(path: Path, credential: str) -> Path:
    """A JAAS file (mode 0600) whose ``Client`` section logs ZooKeeper's Java client in with SASL DIGEST-MD5 as
    ``user:password``; the ZooKeeper servers need ``authProvider.sasl`` and the user in their ``Server``
    section (docs/security-acls.md)."""
    user, sep, password = credential.strip().partition(":")
    bad = set('"\\\n\r;')
    if not sep or not user or not password or bad & set(user + password) or ":" in user:
        raise SparkHAError("the Spark SASL credential must be one line user:password, without quotes, ';' or '\\'")
    body = (
        "Client {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
        f'  username="{user}"\n  password="{password}";\n}};\n'
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body)
    os.chmod(path, 0o600)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(cond: Any, timeout: float, what: str, daemons: list[Daemon]) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        dead = [d for d in daemons if d.proc is not None and d.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(f"{d.name}: {_tail(d.log)}" for d in (dead or daemons))
            raise SparkHAError(f"waiting for {what}: {'exited' if dead else 'timed out'}\n{tails}")
        time.sleep(0.5)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
