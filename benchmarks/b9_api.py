"""B9 the HTTP API and the console at scale: ``GET /api/v1/tasks`` latency and the console's first paint
(in a real headless Chromium) at 1,000 and 10,000 tasks, each task with an owner and a status, through a
real ``zkctl api run`` process; and 500 event streams open at 1,000 and 20,000 tasks, with ``/healthz`` and
``/api/v1/status`` p99 beside them and the server's memory before, during and after.

An active controller runs on each root (in this process), so that ``/api/v1/status`` reads its cluster
summary, as on a live cluster; the console's first paint reads that status and one page of tasks (read at
the source with a cursor), so it should not grow with the cluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

from benchmarks.common import REPO, Bench, median, table, target, zookeeper
from controller.admin import AdminClient, ensure_layout
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import ZkLayout
from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import Create, FencedWriter
from controller.zk.server import free_port

NAME = "b9_api"
SETTLE_S = 3.0  # between two page loads of the first-paint measure
TITLE = "B9 the HTTP API and the console at 1,000 and 10,000 tasks"


def _populate(client: Any, layout: ZkLayout, n: int) -> None:
    """``n`` tasks, each owned by one of 20 brokers and with a RUNNING status (as a loaded cluster reads)."""
    AdminClient(client, layout).create_tasks(
        [TaskSpec(id=f"task-{i:06d}", pipeline=NoopPipeline(kind="noop")) for i in range(n)]
    )
    ops = []
    for i in range(n):
        t, b = f"task-{i:06d}", f"broker-{i % 20:02d}"
        ops.append(Create(layout.task_owner(t), codecs.encode(task_records.OwnerInfo(broker=b, generation=1))))
        ops.append(
            Create(
                layout.status(t),
                codecs.encode(
                    task_records.TaskStatus(
                        broker=b,
                        state="RUNNING",
                        generation=1,
                        updated=time.time(),
                        metrics={"rows": i, "processed_rows_per_s": 1.5},
                    )
                ),
            )
        )
    FencedWriter(client, None).write(ops)


def _get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        size = len(r.read())
    return time.perf_counter() - t0, size


def _first_paint(url: str, rounds: int) -> list[float] | str:
    from tests.browser_support import chromium, missing, quit_browser

    why = missing()
    if why:
        return why
    out = []
    driver = chromium()
    try:
        for _ in range(rounds):
            driver.get("about:blank")
            # a quiet server, as an operator opening the console finds it: the last load's event stream (its
            # subscription reads the cluster once, after that page's first paint) has settled
            time.sleep(SETTLE_S)
            driver.get(url)
            deadline = time.monotonic() + 120
            while not driver.execute_script("return document.body && document.body.dataset.ready === '1'"):
                if time.monotonic() > deadline:
                    raise TimeoutError("the console did not paint within 120 s")
                time.sleep(0.02)
            out.append(driver.execute_script("return window.zkcFirstPaint") / 1000.0)
    finally:
        quit_browser(driver)
    return out


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _streams(base: str, port: int, pid: int, n: int, probes: int) -> dict[str, Any]:
    """``n`` event streams open (each until its ``watching`` summary arrived), then ``probes`` requests each
    to ``/healthz`` and ``/api/v1/status`` beside them; the server's RSS before, with them open, and after
    they closed."""
    before = _rss_mb(pid)
    socks = []
    t0 = time.perf_counter()
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=120)
            s.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            socks.append(s)
        for s in socks:
            got = b""
            while b'"kind":"watching"' not in got and b"too_many_streams" not in got:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            if b'"kind":"watching"' not in got:
                raise RuntimeError(f"a stream did not start: {got[:200]!r}")
        opened_s = time.perf_counter() - t0
        health = [_get(base + "/healthz")[0] for _ in range(probes)]
        status = [_get(base + "/api/v1/status")[0] for _ in range(probes)]
        during = _rss_mb(pid)
    finally:
        for s in socks:
            s.close()
    time.sleep(3)
    health_after = [_get(base + "/healthz")[0] for _ in range(probes)]
    return {
        "streams": n,
        "open_all_s": opened_s,
        "healthz_p99_s": _p99(health),
        "status_p99_s": _p99(status),
        "healthz_p99_after_s": _p99(health_after),
        "rss_before_mb": before,
        "rss_open_mb": during,
        "rss_after_mb": _rss_mb(pid),
    }


def run(bench: Bench) -> dict[str, Any]:
    sizes = (1000,) if bench.quick else (1000, 10_000, 20_000)
    stream_sizes = (1000,) if bench.quick else (1000, 20_000)
    if os.environ.get("B9_SIZES"):  # e.g. B9_SIZES=1000,10000: those sizes; event streams only at those of them
        sizes = tuple(int(x) for x in os.environ["B9_SIZES"].split(",") if x)
        stream_sizes = tuple(n for n in stream_sizes if n in sizes)
    n_streams, probes = (200, 30) if bench.quick else (500, 100)
    rounds = 3 if bench.quick else 7
    rows: list[list[Any]] = []
    stream_rows: list[list[Any]] = []
    results: dict[str, Any] = {}
    with zookeeper(heap_mb=512, name="b9") as zk:
        for n in sizes:
            root = f"/b9-{n}"
            layout = ZkLayout(root)
            client = make_client(ZkSettings(hosts=zk.address, root=root))
            port = free_port()
            proc = None
            ctl = None
            try:
                ensure_layout(client, layout)
                _populate(client, layout, n)
                ctl = Controller(ControllerConfig(f"b9-{n}", ZkSettings(hosts=zk.address, root=root))).start()
                if not ctl.wait_active(120):
                    raise RuntimeError("no active controller")
                admin = AdminClient(client, layout)
                deadline = time.monotonic() + 120
                while admin.status().source != "summary":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the controller wrote no summary")
                    time.sleep(0.2)
                env = {"ZKC_ZK": zk.address, "ZKC_ROOT": root, "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
                proc = subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "api", "run", "--port", str(port)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=REPO,
                )
                base = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 60
                while True:
                    try:
                        _get(base + "/healthz")
                        break
                    except OSError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise RuntimeError("the API server did not start") from None
                        time.sleep(0.2)
                _get(base + "/api/v1/tasks")  # warm-up
                lat, size = [], 0
                for _ in range(rounds):
                    dt, size = _get(base + "/api/v1/tasks")
                    lat.append(dt)
                first_page = [_get(base + "/api/v1/tasks?cursor=&limit=200")[0] for _ in range(rounds)]
                paint = _first_paint(base + "/", rounds)
                paint_med = median(paint) if isinstance(paint, list) else None
                bench.log(
                    f"{n:,} tasks: GET /api/v1/tasks p50 {median(lat) * 1000:.0f} ms ({size / 1e6:.1f} MB); "
                    f"first paint " + (f"{paint_med:.2f} s" if paint_med is not None else f"not measured ({paint})")
                )
                results[str(n)] = {
                    "get_tasks_s": lat,
                    "get_tasks_p50_s": median(lat),
                    "bytes": size,
                    "first_page_p50_s": median(first_page),
                    "first_paint_s": paint if isinstance(paint, list) else None,
                    "first_paint_p50_s": paint_med,
                    "browser": None if isinstance(paint, list) else paint,
                }
                rows.append([n, median(lat), max(lat), round(size / 1e6, 2), median(first_page), paint_med])
                if n in stream_sizes:
                    st = _streams(base, port, proc.pid, n_streams, probes)
                    results[str(n)]["streams"] = st
                    bench.log(
                        f"{n:,} tasks, {st['streams']} streams: /healthz p99 {st['healthz_p99_s'] * 1000:.0f} ms, "
                        f"/api/v1/status p99 {st['status_p99_s'] * 1000:.0f} ms, RSS {st['rss_before_mb']:.0f} -> "
                        f"{st['rss_open_mb']:.0f} -> {st['rss_after_mb']:.0f} MB"
                    )
                    stream_rows.append(
                        [
                            n,
                            st["streams"],
                            round(st["open_all_s"], 2),
                            st["healthz_p99_s"],
                            st["status_p99_s"],
                            round(st["rss_before_mb"]),
                            round(st["rss_open_mb"]),
                            round(st["rss_after_mb"]),
                        ]
                    )
            finally:
                if ctl is not None:
                    ctl.stop()
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(15)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(5)
                client.stop()
                client.close()
    headers = [
        "tasks",
        "GET /tasks p50 s",
        "max s",
        "MB",
        "GET /tasks?cursor= (200) p50 s",
        "console first paint p50 s",
    ]
    print(table(headers, rows))
    stream_headers = [
        "tasks",
        "streams",
        "all open s",
        "/healthz p99 s",
        "/status p99 s",
        "RSS before MB",
        "RSS open MB",
        "RSS after MB",
    ]
    print(table(stream_headers, stream_rows))
    targets = [
        target(
            f"B9 GET /api/v1/tasks at {n:,} tasks (p50)",
            f"{results[str(n)]['get_tasks_p50_s'] * 1000:.0f} ms",
            "(measure)",
            None,
        )
        for n in sizes
    ]
    targets += [
        target(
            f"B9 console first paint at {n:,} tasks (p50)",
            f"{results[str(n)]['first_paint_p50_s']:.2f} s" if results[str(n)]["first_paint_p50_s"] else "-",
            "(measure)",
            None,
        )
        for n in sizes
    ]
    base_paint = results[str(sizes[0])]["first_paint_p50_s"]
    targets += [
        target(
            f"B9 console first paint at {n:,} tasks vs {sizes[0]:,}",
            f"{results[str(n)]['first_paint_p50_s']:.2f} s" if results[str(n)]["first_paint_p50_s"] else "-",
            "≤ 1.5×",
            (results[str(n)]["first_paint_p50_s"] or 1e9) <= 1.5 * base_paint if base_paint else None,
            f"{base_paint:.2f} s at {sizes[0]:,}, same run" if base_paint else "not measured",
        )
        for n in sizes[1:]
    ]
    targets += [
        target(
            f"B9 /healthz p99 beside {n_streams} event streams at {n:,} tasks",
            f"{results[str(n)]['streams']['healthz_p99_s'] * 1000:.0f} ms",
            "(measure)",
            None,
        )
        for n in stream_sizes
    ]
    doc = {
        "sizes": list(sizes),
        "rounds": rounds,
        "results": results,
        "table": {"headers": headers, "rows": rows},
        "streams_table": {"headers": stream_headers, "rows": stream_rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
