"""The container path, for real: the image built from this tree, a cluster of its containers through the
Docker SDK (``zkctl cluster build|up|ps|down``), a broker container killed and brought back by its
restart policy, ``zk-compose.yml`` (with its host-network override) running Spark pipelines exactly once
across a ``docker kill`` of a broker and of the active controller, and a seeded container chaos run.

They run wherever a Docker engine answers (CI starts one: ``scripts/docker-engine.sh start``, which also
imports a debootstrapped base image as ``zkc-base:bookworm``) and are skipped with the reason elsewhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker_sim.deploy.container_chaos import (
    CONTAINER_FAULTS,
    ContainerChaosSummary,
    ContainerFault,
    begin_fault,
    container_sink_ids,
    crash,
    summary_lines,
)
from broker_sim.sim.datagen import DatagenConfig, generate
from broker_sim.sim.injection import FaultRefused
from controller.admin import AdminClient
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, registration_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import free_port
from tests.api_support import REPO, ApiCluster, os_environ_without_auth
from tests.docker_support import (
    SETUP,
    container_cluster,
    create_shared_pipelines,
    docker_engine,
    every_record_once,
    sink_ids,
    zkctl_cluster,
    zkctl_command,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.slow]


class FaultLeftOut(UserWarning):
    """A fault this machine's engine cannot inject, left out of a chaos schedule (the run says so)."""


@dataclass(frozen=True)
class Uninjectable:
    """Fault kinds the engine here cannot inject, and why."""

    kinds: tuple[str, ...] = ()
    reason: str = ""

    def leave_out_args(self) -> list[str]:
        """``--leave-out`` for each kind, with the reason warned (pytest's warnings summary shows it)."""
        if self.kinds:
            warnings.warn(
                FaultLeftOut(f"left out of the chaos schedule: {', '.join(self.kinds)} ({self.reason})"), stacklevel=2
            )
        return [arg for k in self.kinds for arg in ("--leave-out", k)]


def _throwaway(client: Any, image: str, prefix: str) -> Any:
    """A container of the image that only sleeps, with no network (the caller removes it)."""
    return client.containers.run(
        image, ["300"], entrypoint=["sleep"], detach=True, network_mode="none", name=f"{prefix}-{uuid.uuid4().hex[:6]}"
    )


@pytest.fixture(scope="session")
def uninjectable(image: str) -> Uninjectable:
    """Probed once on a throwaway container: ``docker pause`` needs the cgroup freezer, which a nested or
    rootless engine may lack (``OCI runtime pause failed: unable to freeze``). Only that fault is left out."""
    client = docker_engine()
    probe = _throwaway(client, image, "zkc-pause-probe")
    try:
        probe.pause()
        probe.unpause()
        return Uninjectable()
    except Exception as exc:  # the engine's APIError, kept whole: it says what the engine could not do
        return Uninjectable(
            tuple(k for k in CONTAINER_FAULTS if k.startswith("pause")),
            f"docker pause of a throwaway container failed: {type(exc).__name__}: {exc}",
        )
    finally:
        probe.remove(force=True)


def _owners(admin: AdminClient) -> dict[str, str | None]:
    return {r.task_id: r.owner for r in admin.list_tasks()}


def test_cluster_up_kill_a_broker_restart_policy_and_down(image):
    name = f"t{uuid.uuid4().hex[:6]}"
    args = ("--zk-nodes", "1", "--controllers", "1", "--brokers", "2", "--runner", "noop", "--image", image)
    with zkctl_cluster(name, "/dock", *args) as run:
        client, info = run.client, run.up
        assert info["root"] == "/dock" and info["zk"].startswith("127.0.0.1:")
        zk = make_client(ZkSettings(hosts=info["zk"], root="/dock"))
        try:
            admin = AdminClient(zk, ZkLayout("/dock"))
            admin.create_tasks([TaskSpec(id=f"d{i}", pipeline=NoopPipeline(kind="noop")) for i in range(6)])
            owners = wait_until(
                lambda: (o := _owners(admin)) and all(o.values()) and len(set(o.values())) == 2 and o,
                120,
                "six tasks running on both broker containers",
            )
            victim = max(set(owners.values()), key=lambda b: sum(1 for v in owners.values() if v == b))
            survivor = next(b for b in set(owners.values()) if b != victim)
            # `docker kill`: its tasks run elsewhere; Docker counts it as a manual stop (the restart manager
            # leaves it down), so an operator or supervisor starts it again
            client.containers.get(victim).kill()
            moved = [t for t, o in owners.items() if o == victim]
            wait_until(
                lambda: all(_owners(admin).get(t) == survivor for t in moved),
                90,
                f"{moved} running on {survivor} after docker kill of {victim}",
            )
            client.containers.get(victim).start()
            wait_until(
                lambda: zk.exists(ZkLayout("/dock").broker(victim)) is not None, 90, f"{victim} registered again"
            )
            # a crash (kill -9 of the container's process, as the OOM killer would): back by its restart policy
            owners = wait_until(lambda: (o := _owners(admin)) and all(o.values()) and o, 60, "every task owned")
            crashed = next(b for b in (victim, survivor) if b in owners.values())
            lay = ZkLayout("/dock")
            dead_session = zk.exists(lay.broker(crashed)).ephemeralOwner
            crash(client.containers.get(crashed))
            moved = [t for t, o in owners.items() if o == crashed]

            def off_the_dead_session() -> bool:  # on the other broker, or on the crashed one's next life
                stats = [zk.exists(lay.task_owner(t)) for t in moved]
                return all(st is not None and st.ephemeralOwner != dead_session for st in stats)

            wait_until(off_the_dead_session, 90, f"{moved} running again after {crashed} crashed")
            wait_until(
                lambda: (
                    client.containers.get(crashed).status == "running"
                    and client.containers.get(crashed).attrs["RestartCount"] >= 1
                ),
                90,
                f"{crashed} back by its restart policy",
            )
            wait_until(
                lambda: zk.exists(ZkLayout("/dock").broker(crashed)) is not None, 90, f"{crashed} registered again"
            )
            ps = zkctl_command("--json", "cluster", "ps", "--name", name)
            rows = json.loads(ps.stdout)
            assert {r["role"] for r in rows} == {"zk", "controller", "broker"} and len(rows) == 4, rows
        finally:
            zk.stop()
            zk.close()


def test_commands_say_what_is_missing_in_one_line(tmp_path):
    env = {**os_environ_without_auth(), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    p = zkctl_command("cluster", "ps", env=env, timeout=60)
    assert p.returncode == 1 and p.stderr.strip().startswith("Error:") and len(p.stderr.strip().splitlines()) == 1
    assert "no Docker engine answers" in p.stderr or "SDK is not installed" in p.stderr, p.stderr


def _compose() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip(f"no docker-compose (Debian's docker-compose package, Compose 1.29): {SETUP}")
    return []


@pytest.mark.timeout(1200)  # its own bounded waits (ensemble, brokers, sinks, the reset's replay) sum past 300 s
def test_compose_file_runs_the_demo_pipelines_exactly_once_across_kills(image, tmp_path):
    compose = _compose()
    project = f"zkc{uuid.uuid4().hex[:6]}"
    data = tmp_path / "shared"
    data.mkdir()
    data.chmod(0o777)
    ports = {f"ZKC_ZK{i}_{k}": str(free_port()) for i in (1, 2, 3) for k in ("PORT", "QUORUM", "ELECTION")}
    env = {
        **os_environ_without_auth(),
        **ports,
        "ZKC_API_PORT": str(free_port()),
        "ZKC_CHECKPOINTS": str(data),
        "ZKC_IMAGE": image,
        "COMPOSE_PROJECT_NAME": project,
    }
    hosts = ",".join(f"127.0.0.1:{ports[f'ZKC_ZK{i}_PORT']}" for i in (1, 2, 3))
    base = compose + ["-f", str(_host_network_compose(tmp_path / "compose.yml")), "--project-directory", str(REPO)]
    services = ["zk1", "zk2", "zk3", "ctl-a", "ctl-b", "broker-1", "broker-2", "broker-3", "api"]

    def up() -> None:
        p = subprocess.run(
            base + ["up", "-d", *services], env=env, capture_output=True, text=True, timeout=600, cwd=REPO
        )
        assert p.returncode == 0, p.stdout + p.stderr

    def down() -> None:
        subprocess.run(base + ["down", "-v", "--remove-orphans"], env=env, capture_output=True, timeout=300, cwd=REPO)

    with container_cluster(f"com.docker.compose.project={project}", up, down) as run:
        client = run.client
        layout = ZkLayout("/zkc")
        wait_until(lambda: _connect(hosts), 120, "the 3-node ensemble to answer")
        zk = make_client(ZkSettings(hosts=hosts, root="/zkc", session_timeout_s=30))
        try:
            wait_until(
                lambda: zk.exists(layout.broker_ids) and len(zk.get_children(layout.broker_ids)) == 3,
                180,
                "three broker containers registered",
            )
            admin = AdminClient(zk, layout)
            tasks = ["pipeline-1", "pipeline-2"]
            records = 1500
            create_shared_pipelines(admin, data, tasks)
            for t in tasks:  # written as the host's user into the shared directory: readable by the containers
                generate(DatagenConfig(out_dir=str(data / "in" / t), records=records // 2, batch=50))
            wait_until(
                lambda: all(len(sink_ids(data, t)) > 0 for t in tasks), 300, "both pipelines writing their sinks"
            )
            owners = _owners(admin)
            victim = max((o for o in owners.values() if o), key=lambda b: sum(1 for v in owners.values() if v == b))
            client.containers.get(f"{project}_{victim}_1").kill()  # docker kill
            for t in tasks:
                generate(
                    DatagenConfig(out_dir=str(data / "in" / t), records=records // 2, batch=50, start_id=records // 2)
                )
            ctl = codecs.decode(registration_records.ControllerInfo, zk.get(layout.controller)[0])
            # docker kill: stays down; ctl-b takes over
            client.containers.get(f"{project}_{ctl.controller_id}_1").kill()
            every_record_once(data, tasks, records, "every record in both sinks")
            new_ctl = codecs.decode(registration_records.ControllerInfo, zk.get(layout.controller)[0])
            assert new_ctl.epoch > ctl.epoch
            api = ApiCluster(env, tmp_path, port=int(env["ZKC_API_PORT"]))
            _reset_through_the_api(client, project, api, data, tasks[0], records)
        finally:
            zk.stop()
            zk.close()


def _reset_through_the_api(client: Any, project: str, api: ApiCluster, data: Path, task: str, records: int) -> None:
    """Stop ``task``, reset it to earliest and resume it through the compose cluster's ``api`` service, which
    mounts none of the brokers' checkpoints: a broker carries the reset out; the replay lands exactly once."""
    shared = {m["Source"] for m in client.containers.get(f"{project}_broker-1_1").attrs["Mounts"]}
    for b in ("broker-2", "broker-3"):
        mounts = client.containers.get(f"{project}_{b}_1").attrs["Mounts"]
        assert [m["Source"] for m in mounts if m["Destination"] == "/data/checkpoints"] == [str(data)], mounts
    api_mounts = client.containers.get(f"{project}_api_1").attrs["Mounts"]
    assert not {m["Source"] for m in api_mounts} & shared, api_mounts  # the API cannot reach the checkpoints
    wait_until(lambda: _healthy(api), 120, "the api container to answer /healthz")
    started = time.monotonic()
    stopped = api.request("PUT", f"/api/v1/tasks/{task}/stop?wait=true&timeout=120", token=None, timeout=150)
    assert stopped.status == 200 and stopped.body["confirmed"], stopped.body
    # `docker exec` of zkctl in the api container: the same request, answered by the broker that holds the files
    exe = client.containers.get(f"{project}_api_1").exec_run(["zkctl", "--json", "task", "offsets", task], demux=True)
    assert exe.exit_code == 0, exe.output
    offsets = json.loads(exe.output[0])
    assert offsets["exists"] and offsets["last_committed"] >= 0, offsets
    reset = api.request("POST", f"/api/v1/tasks/{task}/reset-offsets", {"to": "earliest"}, token=None, timeout=90)
    assert reset.status == 200, reset
    assert reset.body["position"] == -1 and reset.body["broker"] and reset.body["sink_batches_removed"], reset.body
    assert container_sink_ids(data, task) == []  # stopped, so no read races a write: every batch went
    resumed = api.request("PUT", f"/api/v1/tasks/{task}/resume", token=None)
    assert resumed.status == 200 and resumed.body["state"] == "RUNNING", resumed
    wait_until(lambda: sorted(set(sink_ids(data, task))) == list(range(records)), 300, f"{task} replayed after reset")
    ids = sink_ids(data, task)
    assert len(ids) == records, f"{task}: {len(ids)} rows for {records} after the reset"
    history = api.request("GET", f"/api/v1/tasks/{task}/history", token=None)
    assert [e["action"] for e in history.body["events"]][-3:] == ["stop", "reset-offsets", "resume"], history
    print(f"{task}: stopped, reset through the api container and replayed in {time.monotonic() - started:.0f}s")


def _healthy(api: ApiCluster) -> bool:
    try:
        return api.request("GET", "/healthz", token=None, timeout=5).status == 200
    except OSError:
        return False


def _host_network_compose(out: Path) -> Path:
    """zk-compose.yml with zk-compose.host.yml applied, as one file: Compose 1.29 merges an override's
    settings but cannot drop the base file's port publishing, which host networking refuses, so the
    ``ports`` go here (with host networking every port is the host's anyway)."""
    import yaml

    base = yaml.safe_load((REPO / "zk-compose.yml").read_text())
    host = yaml.safe_load((REPO / "zk-compose.host.yml").read_text())
    for name, service in base["services"].items():
        service.pop("ports", None)
        extra = host["services"].get(name, {})
        for key, value in extra.items():
            if key == "environment":
                service[key] = {**service.get(key, {}), **value}
            else:
                service[key] = value
    out.write_text(yaml.safe_dump({k: v for k, v in base.items() if not k.startswith("x-")}, sort_keys=False))
    return out


def _connect(hosts: str) -> bool:
    try:
        c = make_client(ZkSettings(hosts=hosts, root="/"), timeout=3)
    except Exception:
        return False
    c.stop()
    c.close()
    return True


def test_container_chaos_finds_no_double_ownership(image, uninjectable):
    name = f"c{uuid.uuid4().hex[:6]}"
    chaos = partial(
        zkctl_command,
        "--json",
        "--zk-root",
        "/chaos",
        "cluster",
        "chaos",
        "--name",
        name,
        "--seed",
        "5",
        "--duration",
        "40",
        "--zk-nodes",
        "3",
        "--controllers",
        "2",
        "--brokers",
        "3",
        "--tasks",
        "12",
        "--image",
        image,
        *uninjectable.leave_out_args(),
        timeout=900,
    )
    # the run takes its cluster down itself: what carries its label after it fails the test (and is removed)
    with container_cluster(f"zkc.cluster={name}", chaos) as run:
        p = run.up
        assert p.returncode == 0, p.stdout + p.stderr
        summary = json.loads(p.stdout)
        assert summary["ok"] and summary["overlaps"] == [] and summary["intervals"] > 12, summary
        assert sum(summary["injected"].values()) >= 4, summary
        assert summary["left_out"] == sorted(uninjectable.kinds), summary


def test_a_fault_the_engine_refuses_is_not_injected_and_the_run_judged_on_the_rest(image):
    """A container that is not running cannot be paused nor killed: the engine's refusal (its own words) is
    recorded as not injected, the kill's stamp (which bounds a life's run windows) is dropped, and a run
    whose other faults happened with every check holding is green."""
    client = docker_engine()
    box = _throwaway(client, image, "zkc-refuse")
    try:
        box.kill()
        kills: dict[str, list[float]] = {}
        refused = []
        for kind in ("pause-broker", "kill-broker"):
            with pytest.raises(FaultRefused) as caught:
                begin_fault(client, ContainerFault(0.0, kind, box.name, 1.0), kills)
            assert "APIError" in str(caught.value) and "not running" in str(caught.value), caught.value
            refused.append((f"{kind} on {box.name}", str(caught.value)))
        assert kills == {box.name: []}
    finally:
        box.remove(force=True)
    summary = ContainerChaosSummary(
        seed=0,
        schedule=[{"kind": k} for k in ("pause-broker", "kill-broker", "crash-broker", "restart-zk", "kill-broker")],
        injected={"crash-broker": 1, "restart-zk": 1, "kill-broker": 1},
        failed=[],
        intervals=6,
        overlaps=[],
        restarted_and_back=True,
        converged_s=1.0,
        wall_s=1.0,
        not_injected=refused,
    )
    lines = summary_lines(summary)
    assert summary.ok and lines[-1].endswith("OK") and any("not running" in line for line in lines), lines


def test_the_teardown_removes_what_a_cluster_left_and_fails_a_test_that_passed(image):
    """``container_cluster`` is every container test's cleanup: a container its ``down`` missed is removed and
    fails the test; after a failing body it is removed too, and the body's own error is the one raised."""
    label = f"zkc.cluster=left{uuid.uuid4().hex[:6]}"
    client = docker_engine()

    def up() -> Any:
        return client.containers.run(
            image, ["300"], entrypoint=["sleep"], detach=True, network_mode="none", labels=dict([label.split("=")])
        )

    with pytest.raises(AssertionError, match=r"teardown: container \S+ left behind"):
        with container_cluster(label, up):
            pass
    assert client.containers.list(all=True, filters={"label": label}) == []
    with pytest.raises(RuntimeError, match="the body's own"):
        with container_cluster(label, up, down=lambda: None) as run:
            assert run.client.containers.get(run.up.id).status == "running"
            raise RuntimeError("the body's own")
    assert client.containers.list(all=True, filters={"label": label}) == []


def test_container_chaos_with_spark_pipelines_exactly_once(image, uninjectable):
    """Spark brokers in containers under docker kill, crashes, pauses and restarts: every sink holds every
    record exactly once, and no pipeline ever ran on two brokers at once. Pauses are left out, with the
    reason warned, where the engine cannot freeze a container."""
    name = f"s{uuid.uuid4().hex[:6]}"
    chaos = partial(
        zkctl_command,
        "--json",
        "--zk-root",
        "/schaos",
        "cluster",
        "chaos",
        "--name",
        name,
        "--seed",
        "11",
        "--duration",
        "45",
        "--zk-nodes",
        "1",
        "--controllers",
        "2",
        "--brokers",
        "2",
        "--pipelines",
        "2",
        "--records",
        "800",
        "--image",
        image,
        *uninjectable.leave_out_args(),
        timeout=1200,
    )
    # the run takes its cluster down itself: what carries its label after it fails the test (and is removed)
    with container_cluster(f"zkc.cluster={name}", chaos) as run:
        p = run.up
        assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
        summary = json.loads(p.stdout)
        assert summary["ok"] and summary["overlaps"] == [], summary
        # a pause the engine refused mid-run (the up-front probe passed) is not injected, and does not fail the run
        assert all(reason for _, reason in summary["not_injected"]), summary["not_injected"]
        assert all(v["missing"] == 0 and v["duplicates"] == 0 and v["held"] == 800 for v in summary["sinks"].values())
        assert summary["left_out"] == sorted(uninjectable.kinds), summary
