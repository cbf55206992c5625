"""A whole cluster as containers of the one zkcontroller image, through the Docker SDK for Python: build the
image, start ZooKeeper nodes, controllers and brokers with restart policies, upgrade them, list them, remove them.
A seeded chaos run over them is ``container_chaos``.

Containers use host networking (loopback addresses, ports picked free on the host), so the cluster is
reached from the host exactly as from inside. Everything a cluster makes carries the label
``zkc.cluster=<name>``; ``down`` removes what has it. The SDK (``pip install 'zkcontroller[docker]'``)
is imported lazily: without it, or without an engine, ``ContainersUnavailable`` says what is missing.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.protocol.cluster.layout import ZkLayout, check_name
from controller.protocol.errors import ZkcError
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import free_port

log = logging.getLogger(__name__)

LABEL = "zkc.cluster"
ROLE = "zkc.role"
DEFAULT_IMAGE = "zkcontroller:latest"
SESSION_S = 8.0


class ContainersUnavailable(ZkcError, RuntimeError):
    """No Docker SDK, or no engine answering: the message says which, in one line."""

    status = 503
    code = "containers_unavailable"


def engine() -> Any:
    """A Docker client whose engine answered a ping."""
    try:
        import docker
    except ModuleNotFoundError:
        raise ContainersUnavailable("the Docker SDK is not installed: pip install 'zkcontroller[docker]'") from None
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:  # docker.errors.DockerException and connection errors alike
        raise ContainersUnavailable(
            f"no Docker engine answers ({type(exc).__name__}); start one, or set DOCKER_HOST"
        ) from None
    return client


def project_dir() -> Path:
    """The source tree holding the Dockerfile (the image is built from it)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "Dockerfile").exists():
        raise ContainersUnavailable(
            f"no Dockerfile next to the installed package ({root}); build from a source checkout"
        )
    return root


def host_ca_bundle() -> str | None:
    """The CA bundle this host's own pip and Python trust (``PIP_CERT``, ``SSL_CERT_FILE``,
    ``REQUESTS_CA_BUNDLE``, else Debian's system bundle): the build's pip then trusts what the host trusts,
    a TLS-intercepting proxy's CA included."""
    for candidate in (os.environ.get(v) for v in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")):
        if candidate and os.path.isfile(candidate):
            return candidate
    system = "/etc/ssl/certs/ca-certificates.crt"
    return system if os.path.isfile(system) else None


def build_image(
    tag: str = DEFAULT_IMAGE, base: str | None = None, ca_bundle: str | None = None, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Build the image (host networking, so the build reaches Debian's and PyPI's mirrors). ``ca_bundle``
    (default: ``host_ca_bundle()``) lets pip inside the build trust a TLS-intercepting proxy; it is in the
    build context only while the build runs, and not in the image."""
    import docker

    client = engine()
    root = project_dir()
    ca_bundle = ca_bundle or host_ca_bundle()
    staged = root / "build-ca.pem"
    started = time.monotonic()
    args = {"BASE": base} if base else {}
    try:
        if ca_bundle:
            shutil.copyfile(ca_bundle, staged)
        try:
            image, logs = client.images.build(path=str(root), tag=tag, buildargs=args, network_mode="host", rm=True)
        except docker.errors.BuildError as exc:
            tail = [c.get("stream", c.get("error", "")).rstrip() for c in exc.build_log][-8:]
            raise ContainersUnavailable(
                f"the image build failed: {exc.msg} | " + " | ".join(t for t in tail if t)
            ) from None
    finally:
        staged.unlink(missing_ok=True)
    for chunk in logs:
        line = chunk.get("stream", "").rstrip()
        if line.startswith("Step "):
            echo(line)
    return {
        "tag": tag,
        "id": image.short_id,
        "size_mb": round(image.attrs["Size"] / 1e6, 1),
        "seconds": round(time.monotonic() - started, 1),
    }


@dataclass(frozen=True)
class ClusterSpec:
    name: str = "zkc"
    zk_nodes: int = 3
    controllers: int = 2
    brokers: int = 3
    runner: str = "noop"
    image: str = DEFAULT_IMAGE
    root: str = "/zkc"
    journal_dir: str | None = None  # chaos: brokers journal every start/stop here (host path)
    data_dir: str | None = None  # a host directory the brokers mount as /data/checkpoints (else a volume)
    #: Spark standalone in HA: masters in ZooKeeper recovery mode (state under <root>/spark), workers with
    #: ``spark_cores`` each; with masters the brokers submit to them, not to a local Spark
    spark_masters: int = 0
    spark_workers: int = 1
    spark_cores: int = 1

    def __post_init__(self) -> None:
        check_name("cluster name", self.name)
        ZkLayout(self.root)
        if self.runner not in ("noop", "spark"):
            raise ValueError(f"unknown runner {self.runner!r} (noop or spark)")
        if not (1 <= self.zk_nodes <= 7 and 1 <= self.controllers <= 5 and 1 <= self.brokers <= 50):
            raise ValueError("zk nodes 1-7, controllers 1-5, brokers 1-50")
        if not (0 <= self.spark_masters <= 5 and 1 <= self.spark_workers <= 20 and 1 <= self.spark_cores <= 64):
            raise ValueError("Spark masters 0-5, workers 1-20, cores a worker 1-64")
        if self.spark_masters and self.runner != "spark":
            raise ValueError("Spark masters serve the spark runner's brokers: --runner spark")

    def broker_id(self, i: int) -> str:
        return f"{self.name}-broker-{i + 1}"


@dataclass
class ClusterInfo:
    name: str
    zk: str
    root: str
    containers: list[str] = field(default_factory=list)
    brokers: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: the brokers' Spark: ``spark://h1:p1,h2:p2`` of the masters in HA, or ``local[1]``
    spark_master: str = "local[1]"
    #: each Spark master's web UI (its ``/json/`` says ALIVE or STANDBY), by container name
    spark_uis: dict[str, str] = field(default_factory=dict)


def _run(
    client: Any,
    spec: ClusterSpec,
    name: str,
    role: str,
    command: list[str],
    env: dict[str, str],
    volumes: dict[str, dict[str, str]] | None = None,
    entrypoint: list[str] | None = None,
) -> Any:
    # the image's health check is zkctl's; a Spark daemon is none of its roles
    health = {"healthcheck": {"test": ["NONE"]}} if role == "spark" else {}
    return client.containers.run(
        spec.image,
        command=command,
        name=name,
        detach=True,
        network_mode="host",
        restart_policy={"Name": "always"},
        labels={LABEL: spec.name, ROLE: role},
        environment={"ZKC_ROLE": role, "ZKC_ROOT": spec.root, **env},
        volumes=volumes or {},
        entrypoint=entrypoint,
        init=True,
        **health,
    )


def up(spec: ClusterSpec, timeout: float = 240.0, echo: Callable[[str], None] = print) -> ClusterInfo:
    """Start the cluster; return once ZooKeeper answers and every broker is registered."""
    client = engine()
    if client.containers.list(all=True, filters={"label": f"{LABEL}={spec.name}"}):
        raise ContainersUnavailable(
            f"cluster {spec.name!r} exists already: `zkctl cluster down --name {spec.name}` first"
        )
    try:
        client.images.get(spec.image)
    except Exception:
        raise ContainersUnavailable(
            f"no image {spec.image}: build it with `zkctl cluster build --tag {spec.image}`"
        ) from None
    started = time.monotonic()
    ports = {i: (free_port(), free_port(), free_port()) for i in range(1, spec.zk_nodes + 1)}
    zk = ",".join(f"127.0.0.1:{p[0]}" for p in ports.values())
    ensemble = ",".join(f"{i}=127.0.0.1:{c}:{q}:{e}" for i, (c, q, e) in ports.items())
    checkpoints = f"{spec.name}-checkpoints"
    client.volumes.create(checkpoints, labels={LABEL: spec.name})
    info = ClusterInfo(spec.name, zk, spec.root)
    try:
        for i, (c, _q, _e) in ports.items():
            env = {"ZKC_ZK_SERVER_ID": str(i), "ZKC_ZK_ENSEMBLE": ensemble} if spec.zk_nodes > 1 else {}
            cmd = ["zk", "start", "--foreground", "--data-dir", "/data/state/zookeeper"] + (
                ["--port", str(c)] if spec.zk_nodes == 1 else []
            )
            info.containers.append(
                _run(client, spec, f"{spec.name}-zk{i}", "zk", cmd, {**env, "ZKC_ZK_PORT": str(c)}).name
            )
        wait_until(lambda: _zk_answers(zk), 120, "ZooKeeper to answer")
        _lay_out(zk, spec.root)  # as `zkctl init`: the brokers may register before any controller has started
        common = {"ZKC_ZK": zk}
        for i in range(spec.controllers):
            cid = f"{spec.name}-ctl-{i + 1}"
            info.containers.append(
                _run(
                    client,
                    spec,
                    cid,
                    "controller",
                    ["controller", "run", "--id", cid, "--session-timeout", str(SESSION_S)],
                    common,
                ).name
            )
        if spec.spark_masters:
            info.containers += _start_spark(client, spec, zk, checkpoints, info, max(timeout, SPARK_START_S))
        for i in range(spec.brokers):
            info.containers.append(_start_broker(client, spec, i, common, checkpoints, info.spark_master).name)
            info.brokers.append(spec.broker_id(i))
        wait_until(
            lambda: set(registered_brokers(zk, spec.root)) >= set(info.brokers), timeout, "every broker to register"
        )
    except BaseException:
        echo(f"cluster {spec.name} did not come up; removing what it started")
        down(spec.name, volumes=True)
        raise
    info.seconds = round(time.monotonic() - started, 1)
    return info


#: how long a Spark master may take to be ALIVE, and the workers to register (JVMs on a loaded host: minutes)
SPARK_START_S = 600.0
#: the Spark launcher inside the image (pyspark's own ``bin/spark-class``)
SPARK_CLASS = "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')/bin/spark-class"


def _start_spark(
    client: Any, spec: ClusterSpec, zk: str, checkpoints: str, info: ClusterInfo, timeout: float
) -> list[str]:
    """Spark's masters in ZooKeeper recovery mode (state under ``<root>/spark``) and its workers, the shared
    checkpoint storage mounted where the brokers have it (executors write the sinks and checkpoints); returns
    once one master is ALIVE and every worker registered with it. Sets ``info.spark_master``."""
    from broker_sim.deploy.spark_ha import recovery_conf

    opts = " ".join(f"-D{k}={v}" for k, v in recovery_conf(zk, spec.root).items())
    masters = [(free_port(), free_port()) for _ in range(spec.spark_masters)]
    info.spark_master = "spark://" + ",".join(f"127.0.0.1:{p}" for p, _ in masters)
    env = {"SPARK_NO_DAEMONIZE": "1", "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m"}
    names = []
    for i, (port, ui) in enumerate(masters):
        name = f"{spec.name}-spark-master-{i + 1}"
        line = (
            f"exec {SPARK_CLASS} org.apache.spark.deploy.master.Master --host 127.0.0.1 --port {port} --webui-port {ui}"
        )
        menv = {**env, "SPARK_DAEMON_JAVA_OPTS": opts}
        names.append(_run(client, spec, name, "spark", ["-c", line], menv, entrypoint=["/bin/sh"]).name)
        info.spark_uis[name] = f"http://127.0.0.1:{ui}/json/"
    wait_until(lambda: "ALIVE" in spark_statuses(info).values(), timeout, "a Spark master to be ALIVE")
    volumes = {spec.data_dir or checkpoints: {"bind": "/data/checkpoints", "mode": "rw"}}
    for i in range(spec.spark_workers):
        name = f"{spec.name}-spark-worker-{i + 1}"
        line = (
            f"exec {SPARK_CLASS} org.apache.spark.deploy.worker.Worker {info.spark_master} --host 127.0.0.1"
            f" --cores {spec.spark_cores} --memory 1g --webui-port {free_port()} --work-dir /data/state/spark"
        )
        names.append(_run(client, spec, name, "spark", ["-c", line], env, volumes, entrypoint=["/bin/sh"]).name)
    wait_until(lambda: spark_workers_alive(info) >= spec.spark_workers, timeout, "the Spark workers to register")
    return names


def _spark_json(url: str) -> dict[str, Any]:
    """A Spark master's account of itself (bounded in size and time), or {} where it does not answer."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            body = json.loads(r.read(4 * 1024 * 1024))
    except (OSError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def spark_statuses(info: ClusterInfo) -> dict[str, str]:
    """Each Spark master's status (ALIVE, STANDBY, RECOVERING, ...; "" where it does not answer)."""
    return {name: str(_spark_json(url).get("status", "")) for name, url in info.spark_uis.items()}


def spark_workers_alive(info: ClusterInfo) -> int:
    """The workers the ALIVE master counts as alive (0 where none is ALIVE)."""
    for url in info.spark_uis.values():
        body = _spark_json(url)
        if body.get("status") == "ALIVE":
            n = body.get("aliveworkers", 0)
            return n if isinstance(n, int) else 0
    return 0


def _start_broker(
    client: Any, spec: ClusterSpec, i: int, env: dict[str, str], checkpoints: str, spark_master: str = "local[1]"
) -> Any:
    bid = spec.broker_id(i)
    args = ["--id", bid, "--zk", env["ZKC_ZK"], "--root", spec.root, "--session-timeout", str(SESSION_S)]
    volumes = {spec.data_dir or checkpoints: {"bind": "/data/checkpoints", "mode": "rw"}}
    spark = ["--runner", "spark", "--checkpoint-root", "/data/checkpoints", "--spark-master", spark_master]
    if spark_master != "local[1]":  # one core per application: every broker gets its share of the workers
        spark += ["--spark-conf", "spark.cores.max=1", "--spark-conf", "spark.executor.memory=512m"]
    env = {**env, "ZKC_BROKER_ID": bid}
    if spec.journal_dir is None:
        cmd = ["broker", "run", "--id", bid, "--session-timeout", str(SESSION_S)] + (
            spark if spec.runner == "spark" else ["--runner", "noop"]
        )
        return _run(client, spec, bid, "broker", cmd, env, volumes)
    # a chaos broker journals each start and stop, one file per life of the container
    volumes[spec.journal_dir] = {"bind": "/journal", "mode": "rw"}
    line = (
        "exec python -m broker_sim.chaos broker "
        + " ".join(args)
        + f" --journal /journal/{bid}.$(date +%s%N).log"
        + (" " + shlex.join(spark) if spec.runner == "spark" else "")
    )
    return _run(client, spec, bid, "broker", ["-c", line], env, volumes, entrypoint=["/bin/sh"])


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` twice a second; ContainersUnavailable naming ``what`` past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise ContainersUnavailable(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def _zk_answers(zk: str) -> bool:
    try:
        client = make_client(ZkSettings(hosts=zk, root="/"), timeout=3)
    except Exception:
        return False
    client.stop()
    client.close()
    return True


def _lay_out(zk: str, root: str) -> None:
    """Set the cluster's root up (idempotent): a broker refuses a root that was never set up."""
    from controller.zk.layout_io import ensure_layout

    client = make_client(ZkSettings(hosts=zk, root=root), timeout=10)
    try:
        ensure_layout(client, ZkLayout(root))
    finally:
        client.stop()
        client.close()


def registered_brokers(zk: str, root: str) -> list[str]:
    """The broker ids registered under ``root`` (none where ZooKeeper does not answer)."""
    try:
        client = make_client(ZkSettings(hosts=zk, root=root), timeout=5)
    except Exception:
        return []
    try:
        ids: list[str] = client.get_children(ZkLayout(root).broker_ids)
        return ids
    except Exception:
        return []
    finally:
        client.stop()
        client.close()


#: the most lines of a replaced container's log that ``upgrade`` keeps
LOG_TAIL_LINES = 20_000


def _ended(old: Any, logs_dir: str | None) -> dict[str, Any]:
    """How a container's last life ended, as Docker recorded it (exit code, start and finish times), and, with
    ``logs_dir``, its log saved there: both go with the container when it is removed, and they are what tells
    a broker that exited at the roll's request from one that halted at its fence deadline, and when it did."""
    old.reload()
    state = old.attrs.get("State", {})
    out: dict[str, Any] = {
        "broker": old.name,
        "container": old.short_id,
        "exit_code": state.get("ExitCode"),
        "started_at": state.get("StartedAt"),
        "finished_at": state.get("FinishedAt"),
        "log": None,
    }
    if logs_dir is not None:
        path = Path(logs_dir) / f"{old.name}.{old.short_id}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(old.logs(timestamps=True, tail=LOG_TAIL_LINES))
        out["log"] = str(path)
    return out


def _replace(client: Any, old: Any, image: str) -> Any:
    """The same container (name, command, environment, mounts, labels) on another image."""
    cfg, host = old.attrs.get("Config", {}), old.attrs.get("HostConfig", {})
    old.remove(force=True)
    return client.containers.run(
        image,
        command=cfg.get("Cmd"),
        entrypoint=cfg.get("Entrypoint"),
        name=old.name,
        detach=True,
        network_mode="host",
        restart_policy={"Name": "always"},
        labels=cfg.get("Labels") or {},
        environment=cfg.get("Env") or [],
        volumes=host.get("Binds") or [],
        init=True,
    )


def upgrade(
    name: str,
    image: str,
    zk: str,
    root: str,
    group: str = "default",
    batch: int = 1,
    timeout: float = 300.0,
    echo: Callable[[str], None] = print,
    logs_dir: str | None = None,
    in_place: bool = False,
) -> dict[str, Any]:
    """Roll cluster ``name``'s brokers to ``image`` with the controller's planned roll (``in_place``: the first
    batch's tasks wait for its restart instead of moving away first): a broker's restart
    policy is turned off when its turn comes, so that once its tasks have moved and it exits, its container
    is replaced by one of the new image under the same name and broker id (which joins again; the roll goes
    on). Returns the roll's last state and how each replaced container ended (``replaced``; with
    ``logs_dir``, its log saved there first); a paused roll raises, with its reason."""
    from controller.admin import AdminClient
    from controller.protocol.cluster.roll_plan import RollState

    client = engine()
    try:
        client.images.get(image)
    except Exception:
        raise ContainersUnavailable(f"no image {image}: build it with `zkctl cluster build --tag {image}`") from None
    brokers = {
        c.name: c for c in client.containers.list(all=True, filters={"label": [f"{LABEL}={name}", f"{ROLE}=broker"]})
    }
    if not brokers:
        raise ContainersUnavailable(f"cluster {name!r} has no broker containers")
    zkc = make_client(ZkSettings(hosts=zk, root=root), timeout=10)
    try:
        admin = AdminClient(zkc, ZkLayout(root))
        started = admin.roll(group, batch=batch, timeout_s=timeout, in_place=in_place)
        st: RollState | None = started
        replaced: set[str] = set()
        ended: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout * (len(started.order) + 2)
        while time.monotonic() < deadline:
            st = admin.roll_status()
            if st is None or st.phase in ("done", "paused"):
                break
            for bid in st.batch_now():
                c = brokers.get(bid)
                if c is None or bid in replaced:
                    continue
                c.reload()
                if c.attrs.get("HostConfig", {}).get("RestartPolicy", {}).get("Name") != "no":
                    c.update(restart_policy={"Name": "no"})  # its exit after the roll's shutdown is final
                elif c.status == "exited":
                    ended.append(_ended(c, logs_dir))
                    brokers[bid] = _replace(client, c, image)
                    replaced.add(bid)
                    echo(f"  {bid}: exited (code {ended[-1]['exit_code']}); replaced by a container of {image}")
            time.sleep(0.5)
        if st is None or st.phase != "done":
            raise ContainersUnavailable(
                f"the roll did not finish: {st.phase + ': ' + st.reason if st else 'no roll'}"
                "; `zkctl broker roll --resume` goes on once the broker is back"
            )
        return {
            "image": image,
            "brokers": sorted(replaced),
            "moves": st.moves,
            "steps": len(st.order),
            "replaced": ended,
        }
    finally:
        zkc.stop()
        zkc.close()


def ps(name: str | None = None) -> list[dict[str, Any]]:
    """The containers of one cluster (or of every cluster): name, role, state, health, restarts."""
    client = engine()
    label = f"{LABEL}={name}" if name else LABEL
    out = []
    for c in sorted(client.containers.list(all=True, filters={"label": label}), key=lambda c: c.name):
        state = c.attrs.get("State", {})
        out.append(
            {
                "name": c.name,
                "cluster": c.labels.get(LABEL),
                "role": c.labels.get(ROLE),
                "status": c.status,
                "health": (state.get("Health") or {}).get("Status"),
                "restarts": c.attrs.get("RestartCount", 0),
                "pid": state.get("Pid"),
            }
        )
    return out


def down(name: str, volumes: bool = False) -> dict[str, Any]:
    """Remove every container of the cluster (and, with ``volumes``, its volumes). Host networking: the
    cluster made no network to remove."""
    client = engine()
    removed = []
    for c in client.containers.list(all=True, filters={"label": f"{LABEL}={name}"}):
        c.remove(force=True, v=volumes)
        removed.append(c.name)
    gone_volumes = []
    if volumes:
        for v in client.volumes.list(filters={"label": f"{LABEL}={name}"}):
            v.remove(force=True)
            gone_volumes.append(v.name)
    return {"containers": sorted(removed), "volumes": sorted(gone_volumes), "networks": []}
