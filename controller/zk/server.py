"""An embedded, real ZooKeeper server: Java started from the jars that the pyspark wheel ships.

Used by ``zkctl zk start``, the demo, the tests and the benchmarks, so that nothing needs Docker or a
separately installed ZooKeeper. ``ZOOKEEPER_HOME`` points at a ZooKeeper distribution instead.
Servers run detached with a pid file in their data directory and are always stopped by that pid.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from controller.protocol.errors import ZkcError

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
PID_FILE = "zookeeper.pid"
LOG_FILE = "zookeeper.log"
CFG_FILE = "zoo.cfg"

# Jars ZooKeeper's server needs, out of the ~300 that pyspark ships (the full set slows the JVM start).
_PYSPARK_JAR_PATTERNS = (
    "zookeeper-*.jar",
    "slf4j-api-*.jar",
    "log4j-slf4j2-impl-*.jar",
    "log4j-api-*.jar",
    "log4j-core-*.jar",
    "commons-cli-*.jar",
    "netty-*.jar",
    "metrics-core-*.jar",
    "snappy-java-*.jar",
)


class ZooKeeperSetupError(ZkcError, RuntimeError):
    """Java or the ZooKeeper jars are missing, or the server did not come up. The message says what to do."""

    status = 503
    code = "zookeeper_setup"


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return os.path.join(java_home, "bin", "java")
    java = shutil.which("java")
    if not java:
        raise ZooKeeperSetupError(
            "java not found: the embedded ZooKeeper needs a Java 17 runtime "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)"
        )
    return java


def zookeeper_classpath() -> str:
    """Classpath for ZooKeeper: ``$ZOOKEEPER_HOME`` if set, else the jars inside the installed pyspark."""
    home = os.environ.get("ZOOKEEPER_HOME")
    if home:
        jars = sorted(glob.glob(os.path.join(home, "lib", "*.jar")) + glob.glob(os.path.join(home, "*.jar")))
        if not any("zookeeper" in os.path.basename(j) for j in jars):
            raise ZooKeeperSetupError(f"ZOOKEEPER_HOME={home} holds no zookeeper-*.jar (expected under lib/)")
        return os.pathsep.join(jars)
    try:
        import pyspark
    except ImportError:
        raise ZooKeeperSetupError(
            "pyspark is not installed: pip install 'pyspark==4.3.0' (it ships the ZooKeeper jars)"
        ) from None
    jar_dir = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    jars = []
    for pattern in _PYSPARK_JAR_PATTERNS:
        jars.extend(sorted(glob.glob(os.path.join(jar_dir, pattern))))
    if not any(os.path.basename(j).startswith("zookeeper-") for j in jars):
        raise ZooKeeperSetupError(f"no zookeeper-*.jar in {jar_dir}: reinstall pyspark or set ZOOKEEPER_HOME")
    return os.pathsep.join(jars)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


STATUS_TIMEOUT_S = 10.0  # how long `zk status` waits for a running server's answer


def four_letter_word(host: str, port: int, word: str, timeout: float = 1.0) -> str:
    """Send one of ZooKeeper's four-letter commands (ruok, srvr, mntr) and return the reply ('' on failure)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


def default_jvm_options() -> tuple[str, ...]:
    """The server JVM's options: ``$SERVER_JVMFLAGS`` (as ZooKeeper's own scripts read it) if set, else C1
    only. An embedded server shares a small machine's cores with the cluster it serves, and the C2
    compiler's bursts in its first minutes took up to 40% of a core of two (docs/benchmarks.md, "The
    machine's own load"); C1 alone compiles in a fraction of that, its code a little slower per request."""
    flags = os.environ.get("SERVER_JVMFLAGS")
    return tuple(shlex.split(flags)) if flags is not None else ("-XX:TieredStopAtLevel=1",)


@dataclass
class ZooKeeperServer:
    """One ZooKeeper server process. ``peers`` (server id -> (client, quorum, election) ports) makes it part of an ensemble."""

    data_dir: Path
    port: int = 2181
    host: str = "127.0.0.1"
    tick_ms: int = 500
    max_session_timeout_ms: int = 60_000
    heap_mb: int = 256
    server_id: int | None = None
    peers: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    extra_config: dict[str, str] = field(default_factory=dict)
    peer_hosts: dict[int, str] = field(default_factory=dict)  # server id -> host, where not ``host`` (containers)
    jvm_options: tuple[str, ...] = field(default_factory=default_jvm_options)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        # the process this object started: whether it still runs is then its exit status, not a look at
        # /proc (whose cmdline of a process still starting can read empty: a false "exited")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid_file(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir.resolve() / 'data'}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,mntr,stat,cons,wchc",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "minSessionTimeout=1000",
            "maxClientCnxns=0",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if self.peers:
            lines += ["initLimit=10", "syncLimit=5", "standaloneEnabled=false", "reconfigEnabled=false"]
            for sid, (client, quorum, election) in sorted(self.peers.items()):
                host = self.peer_hosts.get(sid, self.host)
                # our own client port on every address when the members are other hosts (containers)
                client_host = "0.0.0.0" if sid == self.server_id and host not in ("127.0.0.1", "localhost") else host
                lines.append(f"server.{sid}={host}:{quorum}:{election};{client_host}:{client}")
        else:
            lines += [f"clientPort={self.port}", f"clientPortAddress={self.host}"]
        lines += [f"{k}={v}" for k, v in self.extra_config.items()]
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        if self.peers:
            (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        cfg = self.data_dir / CFG_FILE
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def _our_process(self, pid: int) -> psutil.Process | None:
        """The process with this pid if it is our ZooKeeper (guards against a recycled pid)."""
        try:
            proc = psutil.Process(pid)
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        if MAIN_CLASS in cmdline and str((self.data_dir / CFG_FILE).resolve()) in cmdline:
            return proc
        return None

    def is_running(self) -> bool:
        pid = self.read_pid()
        return pid is not None and self._our_process(pid) is not None

    def is_serving(self) -> bool:
        """Whether it serves clients: ``srvr`` shows its mode. ``ruok`` proves less: it answers ``imok`` from the
        moment the port is open, before the server has loaded its data (a client's requests then fail), and
        an ensemble member without a quorum answers it too."""
        return "Mode:" in four_letter_word(self.host, self.port, "srvr")

    def command(self) -> list[str]:
        """The java command line of this server (its config written first)."""
        cfg = self.write_config()
        return [
            find_java(),
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            *self.jvm_options,
            "-Dzookeeper.log.dir=" + str(self.data_dir.resolve()),
            "-Dzookeeper.admin.enableServer=false",
            "-cp",
            zookeeper_classpath(),
            MAIN_CLASS,
            str(cfg.resolve()),
        ]

    def start(self, wait: bool = True, timeout: float = 60.0) -> int:
        """Start the server detached and (by default) wait until it serves; return its pid."""
        if self.is_running():
            pid = self.read_pid()
            assert pid is not None
            if wait:
                self.wait_until_serving(timeout)
            return pid
        cmd = self.command()
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        self._proc = proc
        if wait:
            try:
                self.wait_until_serving(timeout, proc)
            except ZooKeeperSetupError:
                self.stop()
                raise
        return proc.pid

    def wait_until_serving(self, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
        """Until it serves clients (``is_serving``; a standalone server as an ensemble member), at most
        ``timeout``: a caller's first request must not meet a server still loading its data."""
        if proc is None and self._proc is not None and self._proc.pid == self.read_pid():
            proc = self._proc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (proc is not None and proc.poll() is not None) or (proc is None and not self.is_running()):
                code = proc.returncode if proc is not None else "?"
                raise ZooKeeperSetupError(
                    f"ZooKeeper exited with code {code}; see {self.log_file}:\n{self._log_tail()}"
                )
            if self.is_serving():
                return
            time.sleep(0.1)
        raise ZooKeeperSetupError(
            f"ZooKeeper on {self.address} did not serve within {timeout:.0f}s; see {self.log_file}"
        )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> bool:
        """Stop the server by its pid (SIGTERM, then SIGKILL). Returns True if a process was stopped."""
        pid = self.read_pid()
        if pid is None:
            return False
        proc = self._our_process(pid)
        stopped = False
        if proc is not None:
            try:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except psutil.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
                stopped = True
            except psutil.NoSuchProcess:
                stopped = True
        try:
            self.pid_file.unlink()
        except FileNotFoundError:
            pass
        return stopped

    def kill(self) -> None:
        """SIGKILL the server (for outage tests); the pid file stays so ``start`` can reuse the data."""
        pid = self.read_pid()
        proc = self._our_process(pid) if pid else None
        if proc is not None:
            proc.kill()
            proc.wait(10)

    def status(self) -> dict[str, object]:
        pid = self.read_pid()
        running = pid is not None and self._our_process(pid) is not None
        # A server that runs answers; a young JVM on a busy machine (C1 only, the 4lw handler not yet loaded)
        # can take seconds to, and a 1 s wait then reported a running server with no mode.
        srvr = four_letter_word(self.host, self.port, "srvr", timeout=STATUS_TIMEOUT_S) if running else ""
        mode = next((line.split(":", 1)[1].strip() for line in srvr.splitlines() if line.startswith("Mode:")), None)
        version = next(
            (line.split(":", 1)[1].strip() for line in srvr.splitlines() if line.startswith("Zookeeper version:")), None
        )
        return {
            "running": running,
            "serving": bool(srvr),
            "pid": pid if running else None,
            "address": self.address,
            "mode": mode,
            "version": version,
            "data_dir": str(self.data_dir),
        }


def ensemble(base_dir: Path, size: int = 3, host: str = "127.0.0.1") -> list[ZooKeeperServer]:
    """``size`` servers forming one ensemble on free loopback ports (not started)."""
    peers = {sid: (free_port(), free_port(), free_port()) for sid in range(1, size + 1)}
    return [
        ZooKeeperServer(data_dir=Path(base_dir) / f"zk{sid}", port=peers[sid][0], host=host, server_id=sid, peers=peers)
        for sid in peers
    ]


def start_ensemble(servers: list[ZooKeeperServer], timeout: float = 90.0) -> None:
    """Start all servers without waiting (a quorum needs a majority up), then wait for each to serve."""
    procs = [s.start(wait=False) for s in servers]
    assert all(procs)
    for s in servers:
        s.wait_until_serving(timeout)


def parse_ensemble(spec: str) -> tuple[dict[int, tuple[int, int, int]], dict[int, str]]:
    """``1=host:client:quorum:election,2=...`` (what a container of an ensemble is told) -> (peers, hosts)."""
    peers: dict[int, tuple[int, int, int]] = {}
    hosts: dict[int, str] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        sid, sep, rest = item.partition("=")
        parts = rest.split(":")
        if not sep or len(parts) != 4 or not sid.strip().isdigit() or not all(p.isdigit() for p in parts[1:]):
            raise ZooKeeperSetupError(f"bad ensemble member {item!r}: expected ID=HOST:CLIENT:QUORUM:ELECTION")
        peers[int(sid)] = (int(parts[1]), int(parts[2]), int(parts[3]))
        hosts[int(sid)] = parts[0]
    if not peers:
        raise ZooKeeperSetupError("an ensemble needs at least one member")
    return peers, hosts
