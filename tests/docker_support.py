"""The container tests' shared parts: a Docker client (or a skip with the reason), the image of this tree built
once per session, and one life of a cluster of containers (``container_cluster``: up, the report of a failure,
the teardown by label), and the Spark pipelines they run on a directory every container mounts. Registered for every test through ``pytest_plugins`` in tests/conftest.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from broker_sim.chaos.sinks import pipeline_spec
from broker_sim.deploy.container_chaos import container_sink_ids
from controller.admin import AdminClient
from tests.api_support import REPO, os_environ_without_auth
from tests.waiting import wait_until

ZKCTL = [sys.executable, "-m", "cli.main"]
IMAGE = "zkcontroller:test"
BASE = os.environ.get("ZKC_BASE_IMAGE", "zkc-base:bookworm")
T = TypeVar("T")
SETUP = "run `make docker-engine` (scripts/docker-engine.sh start) as root"


def docker_engine() -> Any:
    """A Docker client whose engine answers; the test is skipped, with the reason, where none does."""
    try:
        import docker
    except ModuleNotFoundError:
        pytest.skip("the Docker SDK is not installed (pip install 'zkcontroller[docker]')")
    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers ({type(exc).__name__}): {SETUP}")
    return client


@pytest.fixture(scope="session")
def image() -> str:
    """The image of this tree, built once per session (on the debootstrapped base when there is one)."""
    client = docker_engine()
    args = []
    try:
        client.images.get(BASE)
        args = ["--base", BASE]
    except Exception:
        pytest.skip(f"no base image {BASE} (no registry is assumed reachable): {SETUP}")
    started = time.monotonic()
    p = subprocess.run(
        ZKCTL + ["--json", "cluster", "build", "--tag", IMAGE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    built = json.loads(p.stdout)
    print(f"image {IMAGE}: {built['size_mb']} MB, built in {time.monotonic() - started:.0f}s")
    return IMAGE


def zkctl_command(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ZKCTL + list(args),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(env or os_environ_without_auth()), "PYTHONPATH": str(REPO)},
    )


LOG_TAIL = 150  # lines of each container's log a failing container test prints


def _utc(t: float | None) -> str:
    """An interval's epoch time as Docker prints its timestamps (UTC, RFC 3339), to read the two side by side."""
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def cluster_report(client: Any, label: str, admin: AdminClient | None = None, logs_dir: Path | None = None) -> str:
    """What a failing container test prints: every run interval recorded in ZooKeeper, the containers labelled
    ``label`` (each life's start, finish and exit code) with the tail of their logs (a ZooKeeper node's only
    when it is not a zkc cluster's), and the logs the upgrade kept of the containers it replaced. Each part is
    best effort: a report must not hide the failure it explains."""
    out: list[str] = []
    if admin is not None:
        try:
            out.append("run intervals (task broker generation: acquired start end released, UTC):")
            for i in admin.intervals():
                out.append(
                    f"  {i.task_id} {i.broker} g{i.generation}: {_utc(i.acquired)} {_utc(i.start)} "
                    f"{_utc(i.end)} {_utc(i.released)}"
                )
            out.append(f"roll: {admin.roll_status()}")
        except Exception as exc:
            out.append(f"  (not read: {type(exc).__name__}: {exc})")
    try:
        containers = client.containers.list(all=True, filters={"label": label})
    except Exception as exc:
        containers = []
        out.append(f"containers not listed: {type(exc).__name__}: {exc}")
    for c in sorted(containers, key=lambda c: c.name):
        st = c.attrs.get("State", {})
        out.append(
            f"--- container {c.name} {c.short_id} ({c.status}, started {st.get('StartedAt')}, finished "
            f"{st.get('FinishedAt')}, exit {st.get('ExitCode')}, restarts {c.attrs.get('RestartCount')}):"
        )
        if c.labels.get("zkc.role") != "zk":
            try:
                out.append(c.logs(timestamps=True, tail=LOG_TAIL).decode(errors="replace"))
            except Exception as exc:
                out.append(f"  (no log: {type(exc).__name__})")
    for f in sorted(logs_dir.glob("*.log")) if logs_dir is not None and logs_dir.is_dir() else []:
        out.append(f"--- replaced container {f.stem} (its last {LOG_TAIL} lines):")
        out.append("\n".join(f.read_text(errors="replace").splitlines()[-LOG_TAIL:]))
    return "\n".join(out)


@dataclass
class ContainerRun(Generic[T]):
    """A cluster of containers in a test: what its ``up`` returned, and what a failure's report reads (the
    test sets ``admin`` and ``logs_dir`` once it has them)."""

    client: Any
    label: str
    up: T
    admin: AdminClient | None = None
    logs_dir: Path | None = None


@contextmanager
def container_cluster(
    label: str, up: Callable[[], T], down: Callable[[], object] | None = None
) -> Iterator[ContainerRun[T]]:
    """One life of a cluster of containers carrying ``label``: ``up`` brings it up (a failure there is the
    test's too), the body uses it; on any failure the cluster's report is printed; always ``down`` (the way
    under test: ``zkctl cluster down``, Compose's ``down``) runs, then whatever still carries the label is
    removed by id, so that no failure leaves a container running. What ``down`` left behind fails a test that
    had not failed already: a cleanup that misses a container is a defect the test is there to catch."""
    client = docker_engine()
    run: ContainerRun[T] | None = None
    failed = False
    problems: list[str] = []
    try:
        run = ContainerRun(client, label, up())
        yield run
    except BaseException:
        failed = True
        print(cluster_report(client, label, run.admin if run else None, run.logs_dir if run else None))
        raise
    finally:
        if down is not None:
            try:
                down()
            except Exception as exc:  # said after the sweep: a failed down must still leave no container
                problems.append(f"down failed: {type(exc).__name__}: {exc}")
        problems += remove_by_label(client, label)
        if problems and failed:
            print("teardown: " + "; ".join(problems))
    assert not problems, "teardown: " + "; ".join(problems)


def remove_by_label(client: Any, label: str) -> list[str]:
    """Remove, each by its id, every container (killed first: ``force``), network and volume carrying ``label``,
    in that order (a network or volume in use cannot go); say what there was and what could not be removed."""
    api, only = client.api, {"label": label}
    kinds: tuple[tuple[str, Callable[[], list[Any]], Callable[[str], object]], ...] = (
        (
            "container",
            lambda: client.containers.list(all=True, filters=only),
            lambda i: api.remove_container(i, force=True, v=True),
        ),
        ("network", lambda: client.networks.list(filters=only), api.remove_network),
        ("volume", lambda: client.volumes.list(filters=only), lambda i: api.remove_volume(i, force=True)),
    )
    found: list[str] = []
    for kind, listed, remove in kinds:
        try:
            items = listed()
        except Exception as exc:
            found.append(f"{kind}s not listed: {type(exc).__name__}: {exc}")
            continue
        for item in items:
            found.append(f"{kind} {item.name} left behind")
            try:
                remove(item.id)
            except Exception as exc:
                found.append(f"{kind} {item.name} not removed: {type(exc).__name__}: {exc}")
    return found


def zkctl_cluster(
    name: str, root: str, *args: str, timeout: float = 600
) -> AbstractContextManager[ContainerRun[dict[str, Any]]]:
    """``zkctl cluster up --docker`` of cluster ``name`` on ZooKeeper root ``root`` with ``args``, as a
    ``container_cluster`` whose ``up`` is the command's JSON and which ``zkctl cluster down --volumes`` ends."""

    def up() -> dict[str, Any]:
        p = zkctl_command(
            "--json", "--zk-root", root, "cluster", "up", "--docker", "--name", name, *args, timeout=timeout
        )
        assert p.returncode == 0, p.stdout + p.stderr
        info: dict[str, Any] = json.loads(p.stdout)
        return info

    return container_cluster(f"zkc.cluster={name}", up, down=lambda: zkctl_down(name))


def zkctl_down(name: str) -> None:
    """``zkctl cluster down --volumes`` of the named cluster, which must succeed."""
    down = zkctl_command("--json", "cluster", "down", "--name", name, "--volumes")
    assert down.returncode == 0, down.stdout + down.stderr


def create_shared_pipelines(admin: AdminClient, data: Path, tasks: list[str]) -> None:
    """Streaming pipelines reading ``in/<task>`` of the shared directory (mounted at /data/checkpoints in the
    containers, written by their non-root user) into ``out/<task>``."""
    for t in tasks:
        (data / "in" / t).mkdir(parents=True)
        (data / "in" / t).chmod(0o777)
    admin.create_tasks(
        [pipeline_spec(t, Path("/data/checkpoints/in") / t, Path("/data/checkpoints/out") / t) for t in tasks]
    )


def every_record_once(data: Path, tasks: list[str], records: int, what: str) -> None:
    """Wait until each task's sink holds ids 0 to ``records - 1``; then each must be there exactly once."""
    wait_until(lambda: all(sorted(set(sink_ids(data, t))) == list(range(records)) for t in tasks), 400, what)
    for t in tasks:
        ids = sink_ids(data, t)
        assert len(ids) == records and sorted(ids) == list(range(records)), f"{t}: {len(ids)} rows for {records}"


def sink_ids(data: Path, task: str) -> list[int]:
    """The ids in ``task``'s sink of the shared directory (none while a batch is being written)."""
    try:
        return container_sink_ids(data, task)
    except (OSError, ValueError):  # a sink being written
        return []
