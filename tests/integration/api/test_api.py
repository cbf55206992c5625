"""The HTTP API against a real ZooKeeper, a controller and no-op brokers, all as processes: every endpoint,
every status code it promises (200/201/401/403/404/409/422/503/504), and the event stream delivering a
task move."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.protocol.tasks.spec import decode_task
from controller.zk.client import ZkSettings, make_client
from controller.zk.server import ZooKeeperServer, free_port
from controller.zk.subtrees import delete_tree
from tests.api_support import REPO, TOKEN, ApiCluster, ApiHandle, init_root, os_environ_without_auth
from tests.cli_support import ok
from tests.offsets_support import fake_checkpoint, spark_spec
from tests.waiting import wait_until

NOOP = {"kind": "noop"}


@pytest.fixture(scope="module")
def api(api_clusters: Callable[..., ApiHandle]) -> ApiHandle:
    return api_clusters("api")


def _owner(cluster: ApiCluster, task: str) -> str | None:
    r = cluster.request("GET", f"/api/v1/tasks/{task}")
    return (r.body.get("owner") or {}).get("broker") if r.status == 200 else None


def test_reads_docs_and_metrics(api):
    cluster, _zk, layout = api
    assert cluster.request("GET", "/api/v1/tasks").body == []
    brokers = cluster.request("GET", "/api/v1/brokers").body
    assert {b["broker_id"] for b in brokers} == {"b1", "b2"} and all(b["epoch"] > 0 for b in brokers)
    ctl = wait_until(
        lambda: (r := cluster.request("GET", "/api/v1/controller").body)["controller"] and r, 30, "a controller"
    )
    assert ctl["controller"]["controller_id"] == "c1" and ctl["epoch"] >= 1
    status = cluster.request("GET", "/api/v1/status").body
    assert status["controller"]["controller_id"] == "c1" and len(status["brokers"]) == 2
    assert isinstance(cluster.request("GET", "/api/v1/groups").body, list)
    schema = cluster.request("GET", "/api/v1/openapi.json").body
    assert "/api/v1/tasks/{task_id}/reassign" in schema["paths"] and "/api/v1/events" in schema["paths"]
    with urllib.request.urlopen(cluster.base + "/api/v1/docs", timeout=10) as r:
        assert r.status == 200 and b"swagger" in r.read().lower()
    with urllib.request.urlopen(cluster.base + "/", timeout=10) as r:
        assert b"zkcontroller" in r.read()
    with urllib.request.urlopen(cluster.base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'zkc_api_requests_total{method="GET",route="/api/v1/status",status="200"}' in text
    assert TOKEN not in cluster.log("api")


def test_metrics_carry_each_task_s_figures_validated(api):
    """A pipeline's figures as its owner reports them become per-task gauges on /metrics (task and group
    labels only); a figure that is not a valid number is left out, and a task nobody runs has none."""
    from controller.protocol.records import codecs, task_records
    from controller.protocol.records.task_records import OwnerInfo, TaskStatus

    cluster, zk, layout = api
    specs = [{"id": t, "group": "figures", "pipeline": NOOP} for t in ("fig-1", "fig-2")]
    assert cluster.request("POST", "/api/v1/tasks", specs).status == 201
    # fig-1 is run by "broker x" (this test's session, as a broker's would hold it) and reports its figures
    zk.create(layout.task_owner("fig-1"), codecs.encode(OwnerInfo("x", 1)), ephemeral=True, makepath=True)
    metrics = {"rows": 1200, "batches": 8, "input_rows_per_s": 150.5, "backlog_files": 3, "processed_rows_per_s": "x"}
    status = TaskStatus(
        "x", "RUNNING", 1, time.time(), metrics=metrics, session=task_records.session_hex(zk.client_id[0])
    )
    zk.create(layout.status("fig-1"), codecs.encode(status), makepath=True)

    def scrape() -> str | None:
        with urllib.request.urlopen(cluster.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return text if 'zkc_task_rows{group="figures",task="fig-1"} 1200.0' in text else None

    text = wait_until(scrape, 20, "fig-1's figures on /metrics (cached at most 5 s)")
    assert 'zkc_task_backlog_files{group="figures",task="fig-1"} 3.0' in text
    assert 'zkc_task_input_rows_per_second{group="figures",task="fig-1"} 150.5' in text
    assert 'zkc_task_running{group="figures",task="fig-1"} 1.0' in text
    assert 'zkc_task_processed_rows_per_second{group="figures",task="fig-1"}' not in text  # not a number
    assert 'zkc_task_running{group="figures",task="fig-2"} 0.0' in text
    assert 'zkc_task_rows{group="figures",task="fig-2"}' not in text  # nobody runs it: no figures
    assert "zkc_task_metrics_truncated 0.0" in text


def test_writes_need_the_token_reads_do_not(api):
    cluster, zk, layout = api
    spec = {"id": "auth-1", "pipeline": NOOP}
    r = cluster.request("POST", "/api/v1/tasks", spec, token=None)
    assert r.status == 401 and r.body["error"] == "unauthorized"
    r = cluster.request("POST", "/api/v1/tasks", spec, token="wrong")
    assert r.status == 403 and r.body["error"] == "forbidden"
    assert zk.exists(layout.task("auth-1")) is None
    assert cluster.request("GET", "/api/v1/tasks", token=None).status == 200


def test_create_validate_conflict_and_dry_run(api):
    cluster, zk, layout = api
    r = cluster.request("POST", "/api/v1/tasks", {"id": "c-1", "pipeline": NOOP})
    assert r.status == 201 and r.body["tasks"] == ["c-1"]
    r = cluster.request("POST", "/api/v1/tasks", {"id": "c-1", "pipeline": NOOP})
    assert r.status == 409 and r.body["error"] == "conflict" and "c-1" in r.body["message"]
    r = cluster.request(
        "POST", "/api/v1/tasks", [{"id": "c-2", "pipeline": NOOP}, {"id": "c-3", "weight": -1, "pipeline": NOOP}]
    )
    assert r.status == 422 and r.body["error"] == "invalid_spec"
    assert "c-3" in r.body["message"] and "weight" in r.body["message"]
    assert zk.exists(layout.task("c-2")) is None, "nothing may be written when one spec is refused"
    r = cluster.request("POST", "/api/v1/tasks?dry_run=true", [{"id": "c-4", "pipeline": NOOP}])
    assert r.status == 200 and r.body["dry_run"] is True and zk.exists(layout.task("c-4")) is None
    r = cluster.request("POST", "/api/v1/tasks", [{"id": "c-5", "pipeline": NOOP}, {"id": "c-6", "pipeline": NOOP}])
    assert r.status == 201 and sorted(r.body["tasks"]) == ["c-5", "c-6"]
    rows = cluster.request("GET", "/api/v1/tasks?offset=1&limit=2")
    assert rows.status == 200 and len(rows.body) == 2 and int(rows.headers["x-total-count"]) >= 3
    # paged at the source: the cursor walks every task once
    seen, cursor = [], ""
    while cursor is not None:
        page = cluster.request("GET", f"/api/v1/tasks?limit=2&cursor={cursor}")
        assert page.status == 200 and len(page.body) <= 2 and "x-total-count" not in page.headers
        seen += [row["task_id"] for row in page.body]
        cursor = page.headers.get("x-next-cursor")
    assert sorted(seen) == sorted(row["task_id"] for row in cluster.request("GET", "/api/v1/tasks").body)
    r = wait_until(lambda: (d := cluster.request("GET", "/api/v1/tasks/c-1")).body.get("owner") and d, 30, "c-1 owned")
    assert r.status == 200 and r.body["spec"]["id"] == "c-1" and r.body["owner"]["broker"] in ("b1", "b2")


def test_unknown_things_are_404(api):
    cluster, _zk, _layout = api
    for method, path, body in [
        ("GET", "/api/v1/tasks/nope", None),
        ("PUT", "/api/v1/tasks/nope/pause", None),
        ("POST", "/api/v1/tasks/nope/restart", None),
        ("DELETE", "/api/v1/tasks/nope", None),
        ("POST", "/api/v1/brokers/nope/shutdown", None),
        ("GET", "/api/v1/groups/nope", None),
        ("POST", "/api/v1/tasks/c-1/reassign", {"to": "nope"}),
    ]:
        r = cluster.request(method, path, body)
        assert r.status == 404 and r.body["error"] == "not_found", (method, path, r)
    r = cluster.request("POST", "/api/v1/tasks/c-1/reassign", {"too": "b1"})
    assert r.status == 422


def test_pause_resume_restart_reassign_delete(api):
    cluster, zk, layout = api
    assert cluster.request("POST", "/api/v1/tasks", {"id": "m-1", "pipeline": NOOP}).status == 201
    owner = wait_until(lambda: _owner(cluster, "m-1"), 30, "m-1 owned")
    r = cluster.request("PUT", "/api/v1/tasks/m-1/pause")
    assert r.status == 200 and r.body["state"] == "PAUSED"
    assert decode_task(zk.get(layout.task("m-1"))[0], layout.task("m-1")).state == "PAUSED"
    r = cluster.request("POST", "/api/v1/tasks/m-1/reassign", {"to": "b1"})
    assert r.status == 409 and "resume it first" in r.body["message"]
    assert cluster.request("PUT", "/api/v1/tasks/m-1/resume").body["state"] == "RUNNING"
    assert cluster.request("POST", "/api/v1/tasks/m-1/restart").status == 200
    target = "b2" if owner == "b1" else "b1"
    wait_until(lambda: _owner(cluster, "m-1"), 30, "m-1 owned again")
    r = cluster.request("POST", "/api/v1/tasks/m-1/reassign?wait=true&timeout=45", {"to": target})
    assert r.status == 200 and r.body["done"] is True, r.body
    assert _owner(cluster, "m-1") == target
    r = cluster.request("POST", "/api/v1/rebalance?wait=true&timeout=45")
    assert r.status == 200 and r.body["done"] is True, r.body
    r = cluster.request("DELETE", "/api/v1/tasks/m-1?wait=true&timeout=45")
    assert r.status == 200 and r.body["done"] is True, r.body
    assert cluster.request("GET", "/api/v1/tasks/m-1").status == 404
    r = cluster.request("DELETE", "/api/v1/tasks/c-1?wait=true&timeout=-1")
    assert r.status == 422


def test_stop_offsets_and_reset_offsets(api, tmp_path):
    """PUT /stop?wait, GET /offsets, POST /reset-offsets and DELETE ?purge_checkpoint, over a checkpoint in
    Spark's format where the brokers keep it (the server reads none of it: the brokers answer)."""
    cluster, zk, layout = api
    spec = spark_spec("so-1", tmp_path).model_dump(mode="json")
    assert cluster.request("POST", "/api/v1/tasks", spec).status == 201
    wait_until(lambda: _owner(cluster, "so-1"), 30, "so-1 owned")
    roots = {b["checkpoint_root"] for b in cluster.request("GET", "/api/v1/brokers").body}
    assert len(roots) == 1 and layout.root.strip("/") in next(iter(roots))  # one state dir, scoped by the root
    ck = Path(next(iter(roots))) / "so-1"
    fake_checkpoint(ck, tmp_path)
    r = cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets", {"to": "earliest"})
    assert r.status == 409 and "must be STOPPED" in r.body["message"], r.body
    r = cluster.request("GET", "/api/v1/tasks/so-1/offsets")
    assert r.status == 200 and r.body["last_committed"] == 2 and r.body["sources"][0]["files_pending"] == 1, r.body

    r = cluster.request("PUT", "/api/v1/tasks/so-1/stop?wait=true&timeout=30")
    assert r.status == 200 and r.body["confirmed"] is True and r.body["state"] == "STOPPED", r.body
    for body in ({}, {"to": "yesterday"}, {"to_batch": -1}, {"to_batch": True}, {"to": "earliest", "to_batch": 1}, [1]):
        r = cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets", body)
        assert r.status == 422 and r.body["error"] == "invalid_parameter", (body, r.body)
    r = cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets", {"to_batch": 5})
    assert r.status == 422 and r.body["error"] == "invalid_checkpoint" and "(kept: 0 to 2)" in r.body["message"]
    r = cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets?dry_run=true", {"to_batch": 1})
    assert r.status == 200 and r.body["dry_run"] is True and (ck / "offsets" / "2").exists()
    r = cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets", {"to_batch": 1})
    assert r.status == 200 and r.body["position"] == 1 and not (ck / "offsets" / "2").exists(), r.body
    assert cluster.request("POST", "/api/v1/tasks/so-1/reset-offsets", {"to_batch": 1}, token=None).status == 401
    history = cluster.request("GET", "/api/v1/tasks/so-1").body["history"]
    assert [e["action"] for e in history] == ["stop", "reset-offsets"], history

    r = cluster.request("DELETE", "/api/v1/tasks/so-1?purge_checkpoint=true")
    assert r.status == 422 and "needs wait" in r.body["message"]
    r = cluster.request("DELETE", "/api/v1/tasks/so-1?wait=true&timeout=30&purge_checkpoint=true")
    assert r.status == 200 and r.body["done"] is True and not ck.exists(), r.body
    assert cluster.request("GET", "/api/v1/tasks/so-1/offsets").status == 404


def shown_status(cluster: ApiCluster, task: str) -> str | None:
    r = cluster.request("GET", f"/api/v1/tasks/{task}")
    return r.body.get("shown") if r.status == 200 else None


def test_restart_every_failed_task_in_one_write(api):
    cluster, zk, layout = api
    failing = {"kind": "noop", "fail_after_s": 0.1, "fail_message": "broke"}
    r = cluster.request(
        "POST",
        "/api/v1/tasks",
        [
            {"id": "rf-1", "restart": {"max_attempts": 0}, "pipeline": failing},
            {"id": "rf-2", "restart": {"max_attempts": 0}, "pipeline": failing},
            {"id": "rf-ok", "pipeline": NOOP},
        ],
    )
    assert r.status == 201, r.body
    wait_until(
        lambda: [shown_status(cluster, t) for t in ("rf-1", "rf-2", "rf-ok")] == ["FAILED", "FAILED", "RUNNING"],
        45,
        "rf-1 and rf-2 FAILED",
    )
    assert cluster.request("GET", "/api/v1/tasks/rf-1").body["restart"]["gave_up"] is True
    r = cluster.request("POST", "/api/v1/tasks/restart?only_failed=true&group=elsewhere")
    assert r.status == 200 and r.body["restarted"] == [] and r.body["multis"] == 0, r.body
    r = cluster.request("POST", "/api/v1/tasks/restart?only_failed=true&group=default")
    assert r.status == 200 and [c["task_id"] for c in r.body["restarted"]] == ["rf-1", "rf-2"], r.body
    assert r.body["multis"] == 1 and all(c["restart_nonce"] == 1 for c in r.body["restarted"])
    assert len({zk.exists(layout.task(t)).mzxid for t in ("rf-1", "rf-2")}) == 1, "one multi"
    assert decode_task(zk.get(layout.task("rf-ok"))[0], layout.task("rf-ok")).restart_nonce == 0
    for t in ("rf-1", "rf-2", "rf-ok"):
        assert cluster.request("DELETE", f"/api/v1/tasks/{t}").status == 200


def test_a_failed_task_says_why_through_the_api_and_describe(api):
    """Its last failure (error, class, stack trace, time, restart count) reaches the API and `task describe`,
    and stays there while the task runs again after it."""
    cluster, _zk, _layout = api
    failing = {"kind": "noop", "fail_after_s": 0.2, "fail_message": "the sink refused \x1b[31mrow 7"}
    began = time.time()
    r = cluster.request("POST", "/api/v1/tasks", [{"id": "why-1", "restart": {"max_attempts": 1}, "pipeline": failing}])
    assert r.status == 201, r.body
    wait_until(lambda: shown_status(cluster, "why-1") == "FAILED", 45, "why-1 FAILED")
    body = cluster.request("GET", "/api/v1/tasks/why-1").body
    failure = body["last_failure"]
    assert failure["kind"] == "NoopFailure" and failure["error"] == "the sink refused \x1b[31mrow 7", failure
    assert failure["trace"].startswith("NoopFailure: the sink refused") and failure["restarts"] == 1, failure
    assert began <= failure["at"] <= time.time()
    assert body["status"]["last_failure"] == failure
    out = ok(cluster.env, "task", "describe", "why-1")
    assert "Last failure:" in out and "NoopFailure: the sink refused \\x1b[31mrow 7 (1 restart before it)" in out, out
    assert "\x1b" not in out and "Trace:\n  NoopFailure: the sink refused" in out, out
    assert cluster.request("DELETE", "/api/v1/tasks/why-1").status == 200


def _read_events(url: str, into: list[dict[str, Any]], stop: threading.Event) -> None:
    with urllib.request.urlopen(url, timeout=120) as stream:
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                into.append(json.loads(line[len("data: ") :]))
            if stop.is_set():
                return


def test_the_event_stream_delivers_a_task_move(api):
    cluster, _zk, _layout = api
    assert cluster.request("POST", "/api/v1/tasks", {"id": "e-1", "pipeline": NOOP}).status == 201
    owner = wait_until(lambda: _owner(cluster, "e-1"), 30, "e-1 owned")
    target = "b2" if owner == "b1" else "b1"
    events: list[dict[str, Any]] = []
    stop = threading.Event()
    reader = threading.Thread(
        target=_read_events,
        args=(cluster.base + "/api/v1/events?max_events=200", events, stop),
        name="test-sse-reader",
        daemon=True,
    )
    reader.start()
    try:
        wait_until(lambda: any(e["kind"] == "watching" for e in events), 30, "the stream to start")
        assert cluster.request("POST", "/api/v1/tasks/e-1/reassign", {"to": target}).status == 200
        moved = wait_until(
            lambda: [
                e
                for e in events
                if e["kind"] == "task_owner" and e["subject"] == "e-1" and e["detail"].get("owner") == target
            ],
            45,
            "the move on the stream",
        )
        assert moved[0]["detail"]["previous"] in (owner, None)
    finally:
        stop.set()


def test_controlled_shutdown_through_the_api(api):
    cluster, _zk, _layout = api
    cluster.start_broker("b3")
    wait_until(lambda: any(b["broker_id"] == "b3" for b in cluster.request("GET", "/api/v1/brokers").body), 30, "b3")
    r = cluster.request("POST", "/api/v1/brokers/b3/shutdown?wait=true&timeout=45")
    assert r.status == 200 and r.body["done"] is True, r.body
    assert cluster.procs["b3"].wait(30) == 0


def test_zookeeper_unreachable_is_503(tmp_path):
    """An API server whose ZooKeeper goes away answers 503 at once (no request hangs on a dead session)."""
    server = ZooKeeperServer(data_dir=tmp_path / "zk", port=free_port(), tick_ms=200)
    server.start(timeout=90)
    env = {
        **os_environ_without_auth(),
        "ZKC_ZK": server.address,
        "ZKC_ROOT": "/api503",
        "ZKC_STATE_DIR": str(tmp_path / "state"),
    }
    cluster = None
    try:
        cluster = ApiCluster(env={**env, "PYTHONPATH": str(tmp_path)}, logs=tmp_path, port=free_port())
        cluster.env["PYTHONPATH"] = str(__import__("tests.api_support").api_support.REPO)
        cluster.start("api", "api", "run", "--port", str(cluster.port))
        wait_until(lambda: _answers(cluster), 60, "the API to answer")
        server.stop()
        started = time.monotonic()
        r = wait_until(
            lambda: (x := cluster.request("GET", "/api/v1/tasks", timeout=20)).status == 503 and x,
            30,
            "a 503 once ZooKeeper is gone",
        )
        assert r.body["error"] == "zookeeper_unavailable"
        assert time.monotonic() - started < 25
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()


def test_a_root_never_set_up_is_refused_until_init(zk_hosts, tmp_path):
    """An API server on a mistyped root warns when it starts; every read and write is a 404 ``no_cluster``
    with the command line's message, and nothing is written; once ``zkctl init`` set the root up, it serves."""
    root = f"/apityp-{uuid.uuid4().hex[:8]}"
    env = {
        **os_environ_without_auth(),
        "ZKC_ZK": zk_hosts,
        "ZKC_ROOT": root,
        "ZKC_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(REPO),
    }
    zk = make_client(ZkSettings(hosts=zk_hosts, root="/"))
    cluster = ApiCluster(env=env, logs=tmp_path, port=free_port())
    try:
        cluster.start("api", "api", "run", "--port", str(cluster.port))
        wait_until(lambda: _answers(cluster), 60, "the API to answer")
        want = f"no zkcontroller cluster at {root} on {zk_hosts} (roots there: "
        assert f"warning: {want}" in cluster.log("api"), cluster.log("api")[-3000:]
        spec = {"id": "a", "pipeline": NOOP}
        for method, path, body in (
            ("POST", "/api/v1/tasks", spec),
            ("GET", "/api/v1/tasks", None),
            ("GET", "/api/v1/status", None),
            ("PUT", "/api/v1/maintenance", {"on": True, "reason": "typo"}),
            ("GET", "/api/v1/events?max_events=1", None),
        ):
            r = cluster.request(method, path, body, token=None)
            assert r.status == 404 and r.body["error"] == "no_cluster", (method, path, r.status, r.body)
            assert (
                r.body["message"].startswith(want) and f"zkctl init --zk-root {root} creates one" in r.body["message"]
            ), r.body
        assert zk.exists(root) is None  # nothing was written
        init_root(env)
        assert cluster.request("POST", "/api/v1/tasks", spec, token=None).status == 201
        assert [t["task_id"] for t in cluster.request("GET", "/api/v1/tasks", token=None).body] == ["a"]
    finally:
        cluster.stop()
        try:
            if zk.exists(root) is not None:
                delete_tree(zk, root)
        finally:
            zk.stop()
            zk.close()


def _answers(cluster: ApiCluster) -> bool:
    try:
        return cluster.request("GET", "/healthz", timeout=5).status == 200
    except OSError:
        return False


def test_maintenance_and_settings_through_the_api(api):
    cluster, _zk, _layout = api
    r = cluster.request("PUT", "/api/v1/maintenance", {"on": True, "reason": "rack 3 work"})
    assert r.status == 200 and r.body["on"] is True and r.body["by"] == "operator", r.body
    assert cluster.request("GET", "/api/v1/status").body["maintenance"]["reason"] == "rack 3 work"
    assert cluster.request("PUT", "/api/v1/maintenance", {"on": "yes"}).status == 422
    assert cluster.request("PUT", "/api/v1/maintenance", {"on": False}, token=None).status == 401
    assert cluster.request("PUT", "/api/v1/maintenance", {"on": False}).body["on"] is False
    r = cluster.request("PATCH", "/api/v1/settings", {"max_moves": 5, "max_moves_per_broker": 2})
    assert r.status == 200 and r.body["throttle"] == {"max_moves": 5, "max_moves_per_broker": 2}, r.body
    r = cluster.request("PATCH", "/api/v1/settings", {"max_moves": 0})
    assert r.status == 400 and "max_moves: 0 is not a whole number >= 1" in r.body["message"], r.body
    r = cluster.request("PATCH", "/api/v1/settings?group=default", {"max_moves": 1})
    assert r.body["group_throttle"] == {"default": {"max_moves": 1, "max_moves_per_broker": None}}
    assert cluster.request("GET", "/api/v1/settings").body["throttle"]["max_moves"] == 5
    r = cluster.request("POST", "/api/v1/rebalance?group=default&preferred=true&wait=true&timeout=45")
    assert r.status == 200 and r.body["done"] is True, r.body
