"""The API and the CLI against a hostile client and a careless operator, on a real ZooKeeper with a real
controller, brokers and ``zkctl api run``: Host names and cross-site writes
refused, bodies bounded and JSON, every error in the ``{error, message}`` shape, event streams that cost no
thread and are capped, settings bounded everywhere they enter, terminal escapes never printed, long id lists
summarised, a held migration lock explained, a dead broker's runs ended when its session did."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from controller.protocol.records import codecs
from controller.protocol.records.task_records import IntervalLog, RunInterval, TaskStatus
from tests.api_support import REPO, ZKCTL, ApiCluster, ApiHandle, init_root, os_environ_without_auth
from tests.waiting import wait_until

NOOP = {"kind": "noop"}
HUGE = 99999999999999999999999


@pytest.fixture(scope="module")
def open_api(api_clusters: Callable[..., ApiHandle]) -> ApiHandle:
    """A cluster whose API has no admin token (writes open to same-origin clients): the worst case."""
    return api_clusters("hostile", brokers=("b1", "b2", "b3"), token=None)


def raw(
    cluster: ApiCluster,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, dict[str, str], Any]:
    """One request with exactly these headers (http.client adds Host unless given)."""
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        conn.putrequest(method, path, skip_host="Host" in hdrs, skip_accept_encoding=True)
        for k, v in hdrs.items():
            conn.putheader(k, v)
        if body is not None and "Content-Length" not in hdrs:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data
        return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed
    finally:
        conn.close()


def zkctl(cluster: ApiCluster, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ZKCTL + list(args), env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


# ---- 2. cross-site writes, DNS rebinding -------------------------------------------------------------
def test_writes_from_another_origin_or_as_forms_are_refused(open_api):
    cluster, zk, layout = open_api
    assert cluster.request("POST", "/api/v1/tasks", {"id": "xs-1", "pipeline": NOOP}, token=None).status == 201
    before = zk.get(layout.task("xs-1"))[1].version
    status, _h, body = raw(
        cluster,
        "POST",
        "/api/v1/tasks/restart?only_failed=false",
        headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert status == 403 and body["error"] == "cross_site", body
    status, _h, body = raw(cluster, "POST", "/api/v1/tasks/xs-1/restart", headers={"Origin": "null"})
    assert status == 403 and body["error"] == "cross_site"
    # the same host and port over another scheme is another origin (this server speaks http)
    status, _h, body = raw(
        cluster, "POST", "/api/v1/tasks/xs-1/restart", headers={"Origin": f"https://127.0.0.1:{cluster.port}"}
    )
    assert status == 403 and body["error"] == "cross_site", body
    status, _h, body = raw(
        cluster,
        "POST",
        "/api/v1/brokers/b1/shutdown",
        body=b"x=1",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 415 and body["error"] == "unsupported_media_type", body
    status, _h, body = raw(
        cluster, "PUT", "/api/v1/maintenance", body=b'{"on": true}', headers={"Content-Type": "text/plain"}
    )
    assert status == 415
    assert zk.get(layout.task("xs-1"))[1].version == before, "nothing restarted"
    assert zk.exists(layout.broker("b1")) is not None and cluster.procs["b1"].poll() is None, "b1 still up"
    # the same write from this origin (the console) and from a client that sends no Origin both go through
    status, _h, body = raw(
        cluster,
        "POST",
        "/api/v1/tasks/xs-1/restart",
        headers={"Origin": f"http://127.0.0.1:{cluster.port}", "Sec-Fetch-Site": "same-origin"},
    )
    assert status == 200, body
    assert cluster.request("POST", "/api/v1/tasks/xs-1/restart", token=None).status == 200


def test_only_this_servers_host_names_are_answered(open_api):
    cluster, _zk, _layout = open_api
    status, _h, body = raw(cluster, "GET", "/api/v1/status", headers={"Host": f"rebound.example:{cluster.port}"})
    assert status == 421 and body["error"] == "host_not_allowed", body
    status, _h, _b = raw(cluster, "POST", "/api/v1/tasks/xs-1/restart", headers={"Host": "rebound.example"})
    assert status == 421
    for host in (f"localhost:{cluster.port}", f"127.0.0.1:{cluster.port}"):
        assert raw(cluster, "GET", "/healthz", headers={"Host": host})[0] == 200


def test_a_public_bind_without_a_token_needs_insecure(open_api):
    cluster, _zk, _layout = open_api
    r = zkctl(cluster, "api", "run", "--host", "0.0.0.0", "--port", "0", timeout=30)
    assert r.returncode != 0 and "--insecure" in r.stderr, r.stderr


# ---- 5. errors, bodies ---------------------------------------------------------------------------------
def test_every_error_is_error_and_message_and_bodies_are_bounded(open_api):
    cluster, _zk, _layout = open_api
    for method, path, body, headers, want in [
        ("GET", "/api/v1/nothing-here", None, {}, 404),
        ("DELETE", "/api/v1/status", None, {}, 405),
        ("POST", "/api/v1/tasks", b"{not json", {"Content-Type": "application/json"}, 422),
        ("POST", "/api/v1/tasks", b"[]", {"Content-Type": "application/json", "Content-Length": "50000000"}, 413),
        (
            "POST",
            "/api/v1/tasks",
            b"{}",
            {"Content-Type": "application/json", "Transfer-Encoding": "chunked", "Content-Length": None},
            411,
        ),
    ]:
        hdrs = {k: v for k, v in headers.items() if v is not None}
        if headers.get("Content-Length", "") is None:  # chunked: send the body framed as chunks
            status, got = _chunked(cluster, path, body or b"")
        else:
            status, _h, got = raw(cluster, method, path, body, hdrs)
        assert status == want, (method, path, status, got)
        assert isinstance(got, dict) and set(got) == {"error", "message"}, (path, got)


def _chunked(cluster: ApiCluster, path: str, body: bytes) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=30)
    try:
        conn.request("POST", path, body=iter([body]), headers={"Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


# ---- 4. settings that would switch everything off ------------------------------------------------------
def test_numbers_are_bounded_everywhere_settings_enter(open_api):
    cluster, zk, layout = open_api
    assert cluster.request("PATCH", "/api/v1/settings", {"max_moves": 7}).status == 200
    r = cluster.request("PATCH", "/api/v1/settings", {"max_moves": HUGE})
    assert r.status == 400 and r.body["error"] and "at most 1,000,000" in r.body["message"], r.body
    r = cluster.request("PATCH", "/api/v1/settings", {"preferred_check_s": 1e-9})
    assert r.status == 400 and "preferred_check_s" in r.body["message"]
    res = zkctl(cluster, "settings", "set", f"max_moves={HUGE}")
    assert res.returncode == 1 and "max_moves" in res.stderr, (res.stdout, res.stderr)
    res = zkctl(cluster, "maintenance", "auto", "--max-offline-brokers", str(HUGE))
    assert res.returncode != 0
    res = zkctl(cluster, "settings", "set", "preferred_check_s=1e-9")
    assert res.returncode == 1
    res = zkctl(cluster, "--json", "settings", "show")
    assert res.returncode == 0 and json.loads(res.stdout)["throttle"]["max_moves"] == 7
    r = cluster.request("GET", "/api/v1/settings")
    assert r.body["throttle"]["max_moves"] == 7 and r.body["refused"] == [], r.body

    # written behind the tools' back: the controller keeps the last good value of the refused field only
    body = json.loads(zk.get(layout.settings)[0])
    body["throttle"]["max_moves"] = HUGE
    body["max_offline_brokers"] = 3
    zk.set(layout.settings, json.dumps(body).encode())
    wait_until(
        lambda: "keeping the last good value of a refused field: max_moves" in cluster.log("controller"),
        30,
        "the controller to name the refused field",
    )
    assert "ignoring the settings" not in cluster.log("controller")
    # the tools show the other fields as stored and say which field was refused and why, not just its default
    r = cluster.request("GET", "/api/v1/settings")
    assert r.status == 200 and r.body["max_offline_brokers"] == 3, r.body
    assert r.body["throttle"]["max_moves"] is None and len(r.body["refused"]) == 1, r.body
    assert r.body["refused"][0].startswith("max_moves: ") and "at most 1,000,000" in r.body["refused"][0], r.body
    res = zkctl(cluster, "settings", "show")
    assert res.returncode == 0 and "refused (shown at its default): max_moves: " in res.stdout, res.stdout
    assert ["max_offline_brokers", "cluster", "3"] in [line.split() for line in res.stdout.splitlines()], res.stdout
    res = zkctl(cluster, "--json", "settings", "show")
    shown = json.loads(res.stdout)
    assert shown["max_offline_brokers"] == 3 and shown["refused"] == r.body["refused"], shown
    assert cluster.request("PATCH", "/api/v1/settings", {"max_moves": 7, "max_offline_brokers": None}).status == 200


# ---- 5. what the CLI prints ----------------------------------------------------------------------------
def test_the_cli_prints_no_terminal_escapes_and_summarises_long_id_lists(open_api, tmp_path):
    cluster, zk, layout = open_api
    evil = "boom \x1b]0;PWNED\x07 \x1b[2J\x9b31m done"
    assert cluster.request("POST", "/api/v1/tasks", {"id": "esc-1", "group": "nobody", "pipeline": NOOP}).status == 201
    status = TaskStatus(broker="b1", state="FAILED", generation=1, updated=time.time(), error=evil)
    zk.create(layout.status("esc-1"), codecs.encode(status), makepath=True)
    for args in (["task", "list"], ["task", "describe", "esc-1"]):
        res = zkctl(cluster, *args)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\x07" not in res.stdout and "\x9b" not in res.stdout, repr(res.stdout)
    assert "\\x1b]0;PWNED\\x07" in zkctl(cluster, "task", "list").stdout

    specs = tmp_path / "many.yaml"
    specs.write_text("".join(f"- id: many-{i}\n  group: nobody\n  pipeline: {{kind: noop}}\n" for i in range(300)))
    res = zkctl(cluster, "task", "create", "-f", str(specs))
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("Created 300 tasks: many-0,") and "more; --json lists every id" in first, first
    assert len(res.stdout) < 1000, len(res.stdout)
    res = zkctl(cluster, "task", "delete", *[f"many-{i}" for i in range(300)], timeout=120)


# ---- 3. event streams ----------------------------------------------------------------------------------
def _open_stream(cluster: ApiCluster) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", cluster.port), timeout=30)
    s.sendall(
        f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{cluster.port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    return s


def _read_until(s: socket.socket, needle: bytes, limit: float = 30) -> bytes:
    got = b""
    deadline = time.monotonic() + limit
    while needle not in got:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {needle!r} in {got[:300]!r}")
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def _streams_open(cluster: ApiCluster) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("zkc_api_event_streams "))


def test_event_streams_cost_no_thread_and_closed_ones_free_everything(open_api):
    cluster, _zk, _layout = open_api
    streams = [_open_stream(cluster) for _ in range(120)]  # three times the server's worker threads
    try:
        for s in streams:
            assert b'"kind":"watching"' in _read_until(s, b'"kind":"watching"')
        for path in ("/healthz", "/api/v1/status", "/api/v1/tasks"):
            started = time.monotonic()
            status, _h, _b = raw(cluster, "GET", path)
            assert status == 200 and time.monotonic() - started < 3, (path, time.monotonic() - started)
        assert _streams_open(cluster) == 120
        assert (
            cluster.request("POST", "/api/v1/tasks", {"id": "ev-1", "group": "nobody", "pipeline": NOOP}).status == 201
        )
        for s in streams[:10]:
            assert b'"task_created"' in _read_until(s, b'"subject":"ev-1"')
    finally:
        for s in streams:
            s.close()
    wait_until(lambda: _streams_open(cluster) == 0, 30, "every closed stream freed")


def test_a_cap_on_streams_answers_503_with_the_reason(zk_hosts, tmp_path):
    env = {
        **os_environ_without_auth(),
        "ZKC_ZK": zk_hosts,
        "ZKC_ROOT": f"/cap-{uuid.uuid4().hex[:8]}",
        "ZKC_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(REPO),
    }
    from controller.zk.server import free_port

    init_root(env)
    cluster = ApiCluster(env=env, logs=tmp_path, port=free_port())
    cluster.start("api", "api", "run", "--port", str(cluster.port), "--max-streams", "3")
    streams: list[socket.socket] = []
    try:
        wait_until(lambda: _answers(cluster), 60, "the API to answer")
        streams = [_open_stream(cluster) for _ in range(3)]
        for s in streams:
            _read_until(s, b'"kind":"watching"')
        status, headers, body = raw(cluster, "GET", "/api/v1/events")
        assert status == 503 and body["error"] == "too_many_streams" and "--max-streams 3" in body["message"], body
        assert headers.get("retry-after") == "5"
        streams.pop().close()
        wait_until(lambda: _streams_open(cluster) == 2, 30, "the closed stream freed")
        s = _open_stream(cluster)
        streams.append(s)
        _read_until(s, b'"kind":"watching"')
        # SIGTERM with streams open: they end, the server stops with exit 0 (a stop asked for), no traceback
        cluster.procs["api"].send_signal(signal.SIGTERM)
        code = cluster.procs["api"].wait(20)  # stops within the graceful window (the streams ended, not cancelled)
        log = cluster.log("api")
        assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]
        assert code == 0 and "API stopped" in log and "Aborted" not in log, (code, log[-3000:])
        assert b"event: end" in _read_until(s, b"event: end"), "the open stream was ended, not cut"
    finally:
        for s in streams:
            s.close()
        cluster.stop()


def _metric(cluster: ApiCluster, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", cluster.port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} "))


def _tcp_state(s: socket.socket) -> int:
    """The kernel's TCP state of a socket, read without reading from it (Linux's TCP_INFO: 1 established)."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO"), reason="reads the socket's TCP state (Linux)")
def test_a_reader_that_never_reads_is_dropped_while_another_keeps_up(zk_hosts, tmp_path):
    """A stream whose reader stops reading fills its socket, then its buffer of events: the server drops it
    and closes its connection (the reader is never read from again), while a stream that reads gets every
    event and /healthz answers at once throughout."""
    env = {
        **os_environ_without_auth(),
        "ZKC_ZK": zk_hosts,
        "ZKC_ROOT": f"/slow-{uuid.uuid4().hex[:8]}",
        "ZKC_STATE_DIR": str(tmp_path / "state"),
        "PYTHONPATH": str(REPO),
    }
    from controller.zk.server import free_port

    init_root(env)
    cluster = ApiCluster(env=env, logs=tmp_path, port=free_port())
    cluster.start(
        "api", "api", "run", "--port", str(cluster.port), "--stream-buffer", "50", "--stalled-reader-timeout", "20"
    )  # the stall guard well after the buffer: under load a 3 s guard could cut the reader before it fell behind
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connecting: a small window from the start
    good: socket.socket | None = None
    try:
        wait_until(lambda: _answers(cluster), 60, "the API to answer")
        slow.settimeout(30)
        slow.connect(("127.0.0.1", cluster.port))
        slow.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{cluster.port}\r\n\r\n".encode())
        _read_until(slow, b'"kind":"watching"')  # from here on, never read again
        good = _open_stream(cluster)
        seen = _read_until(good, b'"kind":"watching"')
        assert _streams_open(cluster) == 2
        # long task ids make long events: the socket buffers between the server and the reader (megabytes on
        # loopback) fill with fewer of them
        ids = [f"slow-{i:05d}-{'x' * 180}" for i in range(20_000)]
        created = 0
        while _streams_open(cluster) == 2:
            assert created < len(ids), "the reader that never reads was not dropped"
            batch = [{"id": t, "group": "nobody", "pipeline": NOOP} for t in ids[created : created + 500]]
            assert cluster.request("POST", "/api/v1/tasks", batch, token=None).status == 201
            created += len(batch)
            seen += _read_until(good, f'"subject":"{ids[created - 1]}"'.encode())  # the good reader keeps up
            started = time.monotonic()
            assert raw(cluster, "GET", "/healthz")[0] == 200 and time.monotonic() - started < 2
        assert _streams_open(cluster) == 1 and _metric(cluster, "zkc_api_event_streams_dropped") == 1, created
        wait_until(lambda: _tcp_state(slow) != 1, 60, "the server to close the dropped reader's connection")
        assert "closing the connection of" in cluster.log("api"), cluster.log("api")[-3000:]
        # the well-behaved stream still gets every event, and the server still answers at once
        assert (
            cluster.request(
                "POST", "/api/v1/tasks", {"id": "after-drop", "group": "nobody", "pipeline": NOOP}, token=None
            ).status
            == 201
        )
        assert b'"subject":"after-drop"' in _read_until(good, b'"subject":"after-drop"')
        assert all(f'"subject":"{t}"'.encode() in seen for t in ids[:created]), "the good reader missed events"
        started = time.monotonic()
        assert raw(cluster, "GET", "/healthz")[0] == 200 and time.monotonic() - started < 2
        assert "Traceback" not in cluster.log("api"), cluster.log("api")[-3000:]
    finally:
        slow.close()
        if good is not None:
            good.close()
        cluster.stop()


def _answers(cluster: ApiCluster) -> bool:
    try:
        return raw(cluster, "GET", "/healthz", timeout=5)[0] == 200
    except OSError:
        return False


# ---- 6. the timeline after a SIGKILL --------------------------------------------------------------------
def _overlaps(ivs: list[dict[str, Any]], now: float) -> list[tuple[str, str, str]]:
    found = []
    by_task: dict[str, list[dict[str, Any]]] = {}
    for iv in ivs:
        by_task.setdefault(iv["task_id"], []).append(iv)
    for t, runs in by_task.items():
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if a["broker"] != b["broker"] and a["start"] < (b["end"] or now) and b["start"] < (a["end"] or now):
                    found.append((t, a["broker"], b["broker"]))
    return found


def test_a_killed_brokers_runs_end_when_its_session_did_and_real_overlaps_still_show(open_api, tmp_path):
    cluster, zk, layout = open_api
    ids = [f"tl-{i}" for i in range(6)]
    assert cluster.request("POST", "/api/v1/tasks", [{"id": t, "pipeline": NOOP} for t in ids]).status == 201
    owners = wait_until(
        lambda: (
            (
                o := {
                    t: (cluster.request("GET", f"/api/v1/tasks/{t}").body.get("owner") or {}).get("broker") for t in ids
                }
            )
            and all(o.values())
            and o
        ),
        45,
        "every task owned",
    )
    victim = next(b for b in ("b3", "b2", "b1") if b in owners.values())
    mine = [t for t, o in owners.items() if o == victim]

    def flushed_open() -> bool:
        return {
            iv["task_id"]
            for iv in cluster.request("GET", "/api/v1/intervals").body
            if iv["broker"] == victim and iv["end"] is None
        } >= set(mine)

    wait_until(flushed_open, 45, f"{victim}'s open runs recorded")
    cluster.kill(victim)
    wait_until(
        lambda: all(
            (cluster.request("GET", f"/api/v1/tasks/{t}").body.get("owner") or {}).get("broker") not in (None, victim)
            for t in mine
        ),
        60,
        f"{mine} moved off {victim}",
    )
    wait_until(  # the new owners' runs are flushed: what the dead session's runs are ended against
        lambda: all(
            any(
                iv["broker"] != victim and iv["task_id"] == t for iv in cluster.request("GET", "/api/v1/intervals").body
            )
            for t in mine
        ),
        30,
        "the new owners' runs recorded",
    )
    ivs = cluster.request("GET", "/api/v1/intervals").body
    dead = [iv for iv in ivs if iv["broker"] == victim and iv["task_id"] in mine]
    assert dead and all(iv["end"] is not None for iv in dead), dead
    assert _overlaps([iv for iv in ivs if iv["task_id"] in ids], time.time()) == []
    out = tmp_path / "tl.png"
    res = zkctl(cluster, "--json", "timeline", "--from-zk", "--out", str(out))
    assert res.returncode == 0 and json.loads(res.stdout)["overlaps"] == 0, (res.stdout, res.stderr)

    # a real overlap (two runs recorded as overlapping) still shows, in the API and in the picture
    now = time.time()
    fake = IntervalLog(broker="ghost", intervals=(RunInterval("tl-0", "ghost", now - 30, now - 5),))
    zk.create(layout.broker_intervals("ghost"), codecs.encode(fake), makepath=True)
    real = IntervalLog(broker="ghost2", intervals=(RunInterval("tl-0", "ghost2", now - 20, now - 10),))
    zk.create(layout.broker_intervals("ghost2"), codecs.encode(real), makepath=True)
    ivs = cluster.request("GET", "/api/v1/intervals").body
    assert ("tl-0", "ghost", "ghost2") in _overlaps(ivs, time.time()), ivs
    res = zkctl(cluster, "--json", "timeline", "--from-zk", "--out", str(out))
    assert res.returncode == 0 and json.loads(res.stdout)["overlaps"] >= 1, res.stdout
    zk.delete(layout.broker_intervals("ghost"))
    zk.delete(layout.broker_intervals("ghost2"))
