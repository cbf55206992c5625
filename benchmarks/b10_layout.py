"""B10 — 100,000 tasks: the bucketed layout. One run against a real embedded ZooKeeper:

1. a flat root (layout version 1, what the earlier release wrote: ``<root>/tasks/<id>`` with a task spec,
   ``<root>/status/<id>`` with a status, the persistent containers, no ``<root>/layout`` marker) is written by
   hand in pipelined transactions;
2. on the flat root: one ``get_children(<root>/tasks)`` from kazoo (time, reply bytes), ZooKeeper's own Java
   client (``ZooKeeperMain ls <root>/tasks``, the jars of ``controller.zk.server``), whether this release
   refuses the root (``ensure_layout`` and a ``Controller`` raise ``LayoutError``), and what the admin
   reads (``zkctl task list`` / ``zkctl status``) show on it;
3. ``controller.admin.migration.migrate`` converts it (seconds, znodes moved, multis);
4. on the bucketed root: ``list_tasks`` (256 buckets in multiRead requests), the largest bucket listing, the
   Java client listing one bucket, ``AdminClient.list_tasks()`` and ``.status()``, and a controller's
   failover load of every task (``last_load_s``, tasks in its context).

Size: ``B10_TASKS`` (default 100,000; quick: 5,000). The reply bytes of a listing are what ZooKeeper sends
for ``getChildren``: Σ(4 + len(name)) over the children, plus 20 bytes of reply header and list length
(the packet length the Java client compares with ``jute.maxbuffer``, 0xfffff = 1,048,575 by default).
``ZooKeeperMain ls`` asks for the children with the parent's stat (``getChildren2``), 68 bytes more: the
length it reports in ``Packet len ... is out of range!`` is that one.

The controller's load is ``FailoverLoad.last_load_s`` (as B3 reads it), median of three controllers started one
after the other; the wall time from its activation until that figure is published is reported too, since
``_load`` publishes it only after loading the groups' coordinators, which the figure itself leaves out.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from benchmarks import admin_paths
from benchmarks.common import Bench, median, table, target, zookeeper
from controller.admin import AdminClient, ensure_layout, wait_for
from controller.admin.migration import migrate
from controller.daemon import Controller, ControllerConfig
from controller.protocol.cluster.layout import BUCKETS, ZkLayout
from controller.protocol.records import codecs, task_records
from controller.protocol.tasks.spec import NoopPipeline, TaskSpec
from controller.zk.client import ZkSettings, make_client
from controller.zk.layout_io import LayoutError, list_tasks
from controller.zk.multi_read import multi_children
from controller.zk.server import find_java, zookeeper_classpath
from controller.zk.subtrees import delete_tree

NAME = "b10_layout"
TITLE = "B10 100,000 tasks: the bucketed layout"

JUTE_MAXBUFFER = 0xFFFFF  # the Java client's default limit on one reply packet (bytes)
REPLY_OVERHEAD = 16 + 4  # getChildren reply: header (xid, zxid, err) and the list's length
CREATES_PER_TX = 250  # creates per kazoo transaction while writing the flat root
TX_WINDOW = 16  # transactions in flight
JAVA_TIMEOUT_S = 120.0


def _listing_bytes(names: list[str]) -> int:
    """Σ(4 + len(name)): the children part of a getChildren reply."""
    return sum(4 + len(n.encode()) for n in names)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


# ---- the flat root, as the earlier release laid it out -------------------------------------------------
def write_flat_root(client: Any, layout: ZkLayout, task_ids: list[str]) -> float:
    """``<root>/tasks/<id>`` and ``<root>/status/<id>`` for every task, the persistent containers, no marker;
    in transactions of ``CREATES_PER_TX`` creates, ``TX_WINDOW`` of them in flight. Returns seconds."""
    t0 = time.perf_counter()
    client.ensure_path(layout.root)
    for path in layout.persistent_roots():
        client.ensure_path(path)
    now = time.time()
    ops: list[tuple[str, bytes]] = []
    for t in task_ids:
        ops.append((f"{layout.tasks}/{t}", TaskSpec(id=t, pipeline=NoopPipeline(kind="noop")).encode()))
    for i, t in enumerate(task_ids):
        ops.append(
            (
                f"{layout.statuses}/{t}",
                codecs.encode(
                    task_records.TaskStatus(broker=f"broker-{i % 100:03d}", state="STOPPED", generation=1, updated=now)
                ),
            )
        )
    in_flight: list[Any] = []

    def settle(keep: int) -> None:
        while len(in_flight) > keep:
            res = in_flight.pop(0).get(timeout=120)
            bad = [r for r in res if isinstance(r, Exception)]
            if bad:
                raise RuntimeError(f"writing the flat root failed: {bad[0]!r}")

    for lo in range(0, len(ops), CREATES_PER_TX):
        tx = client.transaction()
        for path, data in ops[lo : lo + CREATES_PER_TX]:
            tx.create(path, data)
        in_flight.append(tx.commit_async())
        settle(TX_WINDOW)
    settle(0)
    return time.perf_counter() - t0


# ---- ZooKeeper's own Java client -----------------------------------------------------------------------
def java_ls(address: str, path: str, timeout: float = JAVA_TIMEOUT_S) -> dict[str, Any]:
    """``ZooKeeperMain -server address ls path`` (the jars of the embedded server), bounded by ``timeout``;
    the child is stopped by its pid if it outlives it. WARN logging is on so the client's own reason for a
    dropped connection (``Packet len ... is out of range!``) shows."""
    cmd = [
        find_java(),
        "-Xmx256m",
        "-Dorg.apache.logging.log4j.level=WARN",
        "-cp",
        zookeeper_classpath(),
        "org.apache.zookeeper.ZooKeeperMain",
        "-server",
        address,
        "ls",
        path,
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True
    )
    timed_out = False
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.kill(proc.pid, signal.SIGKILL)  # our child, by its pid
            out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
    took = time.perf_counter() - t0
    lines = [ln.strip() for ln in (out + "\n" + err).splitlines() if ln.strip()]
    listing = next((ln for ln in reversed(out.splitlines()) if ln.startswith("[") and ln.endswith("]")), None)
    names = [n for n in listing[1:-1].split(", ") if n] if listing is not None else None
    packet = next((ln for ln in lines if "Packet len" in ln), None)
    loss = next((ln for ln in lines if "ConnectionLoss" in ln or "connection loss" in ln.lower()), None)
    exc = next((ln for ln in lines if "Exception" in ln), None)
    ok = not timed_out and proc.returncode == 0 and names is not None
    return {
        "command": " ".join(
            [
                "java",
                "-cp",
                "<zookeeper jars of pyspark>",
                "org.apache.zookeeper.ZooKeeperMain",
                "-server",
                address,
                "ls",
                path,
            ]
        ),
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "seconds": round(took, 3),
        "ok": ok,
        "children": len(names) if names is not None else None,
        "packet_len_error": packet,
        "connection_loss": loss,
        "error_line": packet or loss or exc,
        "packet_len": int(m.group(1)) if packet and (m := re.search(r"Packet len (\d+)", packet)) else None,
        "output_tail": lines[-12:] if not ok else lines[-3:],
    }


def _java_cell(r: dict[str, Any]) -> str:
    if r["ok"]:
        return f"ok ({r['children']:,} names)"
    if r["timed_out"]:
        return "timed out"
    why = (
        "Packet len out of range" if r["packet_len_error"] else ("ConnectionLoss" if r["connection_loss"] else "error")
    )
    return f"FAILED: {why}"


# ---- the measurements ------------------------------------------------------------------------------------
def measure_flat(bench: Bench, zk: Any, client: Any, layout: ZkLayout, n: int, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    client.get_children(layout.tasks)  # warm-up
    times, names = [], []
    for _ in range(rounds):
        dt, names = _timed(lambda: client.get_children(layout.tasks))
        times.append(dt)
    if len(names) != n:
        raise RuntimeError(f"the flat /tasks lists {len(names)} names, expected {n}")
    res["get_children_tasks_s"] = median(times)
    res["get_children_tasks_runs_s"] = [round(t, 4) for t in times]
    res["tasks_listing_bytes"] = _listing_bytes(names)
    res["tasks_reply_bytes"] = res["tasks_listing_bytes"] + REPLY_OVERHEAD
    dt, statuses = _timed(lambda: client.get_children(layout.statuses))
    res["get_children_status_s"] = dt
    res["status_listing_bytes"] = _listing_bytes(statuses)
    res["status_reply_bytes"] = res["status_listing_bytes"] + REPLY_OVERHEAD
    bench.log(
        f"flat: get_children({layout.tasks}) {res['get_children_tasks_s']:.3f}s, reply {res['tasks_reply_bytes']:,} bytes "
        f"({'over' if res['tasks_reply_bytes'] > JUTE_MAXBUFFER else 'under'} jute.maxbuffer {JUTE_MAXBUFFER:,})"
    )
    res["java_ls"] = java_ls(zk.address, layout.tasks)
    j = res["java_ls"]
    bench.log(
        f"flat: Java ZooKeeperMain ls {layout.tasks}: exit {j['exit_code']} in {j['seconds']:.1f}s: "
        + (f"{j['children']:,} names" if j["ok"] else (j["error_line"] or "no listing"))
    )
    # this release refuses the flat root
    try:
        dt, _ = _timed(lambda: ensure_layout(client, layout))
        res["ensure_layout"] = {"refused": False, "seconds": dt}
    except LayoutError as exc:
        res["ensure_layout"] = {"refused": True, "error": f"LayoutError: {exc}"}
    bench.log(f"flat: ensure_layout: {res['ensure_layout'].get('error', 'accepted (unexpected)')}")
    if client.exists(layout.layout_info) is not None:
        raise RuntimeError("ensure_layout wrote a layout marker on a flat root")
    ctl = Controller(
        ControllerConfig("b10-flat", ZkSettings(hosts=zk.address, root=layout.root, session_timeout_s=30.0))
    )
    try:
        ctl.start()
        res["controller_start"] = {"refused": False}
    except LayoutError as exc:
        res["controller_start"] = {"refused": True, "error": f"LayoutError: {exc}"}
    finally:
        ctl.stop()
    refused = res["controller_start"]["refused"]
    bench.log(f"flat: Controller.start: {'refused (LayoutError)' if refused else 'accepted (unexpected)'}")
    # the admin reads refuse a flat root too (rather than showing it empty)
    admin = AdminClient(client, layout)
    for name, read in (("admin_list_tasks", admin.list_tasks), ("admin_status", admin.status)):
        try:
            read()
            res[name] = {"refused": False}
        except LayoutError as exc:
            res[name] = {"refused": True, "error": f"LayoutError: {exc}"}
    bench.log(
        f"flat: AdminClient.list_tasks() / status(): "
        f"{'refused (LayoutError)' if res['admin_list_tasks']['refused'] and res['admin_status']['refused'] else 'ANSWERED (unexpected)'}"
    )
    return res


def measure_bucketed(bench: Bench, zk: Any, client: Any, layout: ZkLayout, n: int, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    dt, _ = _timed(lambda: ensure_layout(client, layout))
    res["ensure_layout_s"] = dt
    list_tasks(client, layout)  # warm-up
    times, ids = [], []
    for _ in range(rounds):
        dt, ids = _timed(lambda: list_tasks(client, layout))
        times.append(dt)
    if len(ids) != n:
        raise RuntimeError(f"list_tasks found {len(ids)} tasks, expected {n}")
    res["list_tasks_s"] = median(times)
    res["list_tasks_runs_s"] = [round(t, 4) for t in times]
    buckets: dict[str, Any] = {}
    for kind, paths in (("tasks", layout.task_buckets), ("status", layout.status_buckets)):
        listings = multi_children(client, paths)
        sizes = [_listing_bytes(ls or []) for ls in listings]
        counts = [len(ls or []) for ls in listings]
        big = max(range(len(paths)), key=lambda i: sizes[i])
        buckets[kind] = {
            "buckets": len(paths),
            "entries": sum(counts),
            "min_entries": min(counts),
            "max_entries": max(counts),
            "largest_bucket": paths[big],
            "largest_listing_bytes": sizes[big],
            "largest_reply_bytes": sizes[big] + REPLY_OVERHEAD,
            "counts": counts,
        }
    res["buckets"] = buckets
    # the container itself now holds the buckets only
    res["tasks_container_listing_bytes"] = _listing_bytes(client.get_children(layout.tasks))
    bench.log(
        f"bucketed: list_tasks {res['list_tasks_s']:.3f}s; task buckets hold {buckets['tasks']['min_entries']}.."
        f"{buckets['tasks']['max_entries']} tasks, largest listing {buckets['tasks']['largest_listing_bytes']:,} bytes "
        f"({buckets['tasks']['largest_bucket']})"
    )
    bucket0 = layout.task_buckets[0]
    res["java_ls"] = java_ls(zk.address, bucket0)
    j = res["java_ls"]
    expected = len(client.get_children(bucket0))
    res["java_ls"]["expected_children"] = expected
    bench.log(
        f"bucketed: Java ZooKeeperMain ls {bucket0}: exit {j['exit_code']} in {j['seconds']:.1f}s: "
        + (f"{j['children']:,} names (kazoo: {expected:,})" if j["ok"] else (j["error_line"] or "no listing"))
    )
    admin = AdminClient(client, layout)
    dt, rows = _timed(admin.list_tasks)
    res["admin_list_tasks"] = {"seconds": dt, "rows": len(rows)}
    dt, st = _timed(admin.status)
    res["admin_status"] = {"seconds": dt, "tasks_total": st.tasks.get("total"), "by_status": st.tasks.get("by_status")}
    bench.log(
        f"bucketed: AdminClient.list_tasks() {res['admin_list_tasks']['seconds']:.2f}s ({len(rows):,} rows), "
        f"status() {res['admin_status']['seconds']:.2f}s ({st.tasks.get('total'):,} tasks)"
    )
    # a controller's failover load of every task: a fresh controller each round (it wins the election at once)
    runs = [controller_load(zk, layout, f"b10-ctl{r}") for r in range(rounds)]
    res["controller_runs"] = runs
    res["controller"] = {
        "load": runs[0]["load"],
        "last_load_s": median([r["last_load_s"] for r in runs]),
        "active_to_load_published_s": median([r["active_to_load_published_s"] for r in runs]),
        "tasks_in_context": min(r["tasks_in_context"] or 0 for r in runs),
        "rounds": rounds,
    }
    c = res["controller"]
    each = ", ".join(f"{r['last_load_s']:.2f}" for r in runs)
    bench.log(
        f"bucketed: controller load {c['last_load_s']:.3f}s (median of {rounds}: {each}), "
        f"{c['tasks_in_context']:,} tasks in its context; active → load figure published "
        f"{c['active_to_load_published_s']:.2f}s (also the groups' coordinators)"
    )
    return res


def controller_load(zk: Any, layout: ZkLayout, cid: str) -> dict[str, Any]:
    """Start a ``Controller`` on the root, wait for its load, stop it. ``last_load_s`` is its own figure (the
    context read: brokers, tasks, groups); the wall time from ``became_active_at`` until that figure is
    published also covers loading the groups' coordinators (``_load`` sets ``last_load_s`` after them)."""
    ctl = Controller(ControllerConfig(cid, ZkSettings(hosts=zk.address, root=layout.root, session_timeout_s=30.0)))
    try:
        t0 = time.monotonic()
        ctl.start()
        if not wait_for(lambda: ctl.became_active_at is not None, 120, 0.01):
            raise RuntimeError("the controller did not become active")
        if not wait_for(lambda: ctl.loader.last_load_s is not None, 600, 0.01):
            raise RuntimeError("the controller did not load its state")
        published = time.monotonic()
        ctx = ctl.ctx
        return {
            "controller": cid,
            "load": ctl.config.load,
            "last_load_s": ctl.loader.last_load_s,
            "start_to_active_s": round(ctl.became_active_at - t0, 3),
            "active_to_load_published_s": round(published - ctl.became_active_at, 3),
            "tasks_in_context": len(ctx.tasks) if ctx is not None else None,
            "invalid_tasks": len(ctx.invalid_tasks) if ctx is not None else None,
            "task_tree_watched": ctl.tasks.tree_watched,
        }
    finally:
        ctl.stop()


def plot(flat: dict[str, Any], bucketed: dict[str, Any], n: int, out: Any) -> None:
    """Reply bytes of the largest listings (log scale) against the Java client's limit; tasks per bucket."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    labels = ["flat /tasks", "flat /status", "largest\ntask bucket", "largest\nstatus bucket"]
    values = [
        flat["tasks_reply_bytes"],
        flat["status_reply_bytes"],
        bucketed["buckets"]["tasks"]["largest_reply_bytes"],
        bucketed["buckets"]["status"]["largest_reply_bytes"],
    ]
    bars = ax.bar(labels, values, color=["tab:red", "tab:red", "tab:green", "tab:green"])
    for b, v in zip(bars, values):
        ax.text(b.get_x() + b.get_width() / 2, v, f"{v:,}", ha="center", va="bottom", fontsize=8)
    ax.axhline(JUTE_MAXBUFFER, color="black", linestyle="--", linewidth=1)
    ax.text(
        2.5,
        JUTE_MAXBUFFER * 1.15,
        "Java client limit\n(jute.maxbuffer 1,048,575)",
        fontsize=8,
        ha="center",
        va="bottom",
    )
    ax.set_yscale("log")
    ax.set_ylim(min(values) / 3, max(values + [JUTE_MAXBUFFER]) * 4)
    ax.set_ylabel("getChildren reply bytes")
    ax.set_title(f"B10: listings at {n:,} tasks")
    ax.grid(alpha=0.3, axis="y")
    ax2 = fig.add_subplot(1, 2, 2)
    counts = bucketed["buckets"]["tasks"]["counts"]
    step = max(1, (max(counts) - min(counts) + 1) // 40)
    ax2.hist(counts, bins=range(min(counts), max(counts) + step + 1, step), color="tab:blue", edgecolor="white")
    ax2.axvline(n / BUCKETS, color="black", linestyle=":", linewidth=1)
    ax2.set_xlabel("tasks in a bucket")
    ax2.set_ylabel("buckets")
    ax2.set_title(f"{BUCKETS} task buckets (mean {n / BUCKETS:.0f})")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)


def run(bench: Bench) -> dict[str, Any]:
    n = int(os.environ.get("B10_TASKS", 5000 if bench.quick else 100_000))
    full_size = n >= 100_000
    rounds = 3
    root = f"/b10-{n}"
    layout = ZkLayout(root)
    task_ids = [f"task-{i:06d}" for i in range(n)]
    setup: dict[str, Any] = {
        "tasks": n,
        "root": root,
        "buckets": BUCKETS,
        "creates_per_transaction": CREATES_PER_TX,
        "transactions_in_flight": TX_WINDOW,
        "rounds": rounds,
    }
    with zookeeper(heap_mb=2048, name="b10") as zk:  # stopped by its pid and its data dir removed on exit
        client = make_client(ZkSettings(hosts=zk.address, root=root, session_timeout_s=30.0))
        try:
            setup["write_flat_s"] = round(write_flat_root(client, layout, task_ids), 2)
            setup["znodes_written"] = 2 * n
            bench.log(f"flat root {root}: {n:,} tasks and {n:,} statuses written in {setup['write_flat_s']:.1f}s")
            flat = measure_flat(bench, zk, client, layout, n, rounds)
            mig = migrate(client, layout)
            migration = {
                "seconds": mig.seconds,
                "tasks": mig.tasks,
                "statuses": mig.statuses,
                "moved": mig.moved,
                "multis": mig.multis,
                "blocked": [list(b) for b in mig.blocked],
                "done": mig.done,
                "znodes_per_s": mig.moved / mig.seconds if mig.seconds else None,
            }
            bench.log(
                f"migrate: {mig.moved:,} znodes moved in {mig.multis:,} multis in {mig.seconds:.1f}s "
                f"({migration['znodes_per_s']:,.0f}/s); done {mig.done}, blocked {len(mig.blocked)}"
            )
            if not mig.done:
                raise RuntimeError(f"the migration did not finish: {mig.blocked[:3]}")
            bucketed = measure_bucketed(bench, zk, client, layout, n, rounds)
            delete_tree(client, root)  # the admin paths are measured on roots of their own
            admin_sizes = [int(x) for x in os.environ.get("B10_ADMIN_SIZES", "").split(",") if x] or (
                [2000, n] if bench.quick else [20_000, n]
            )
            admin = admin_paths.measure(bench, client, "/b10-admin", sorted(set(admin_sizes)), hosts=zk.address)
        finally:
            client.stop()
            client.close()
    # ---- table -------------------------------------------------------------------------------------------
    tb, sb = bucketed["buckets"]["tasks"], bucketed["buckets"]["status"]
    fj, bj = flat["java_ls"], bucketed["java_ls"]
    ctl = bucketed["controller"]
    rows = [
        ["tasks / statuses", f"{n:,} / {n:,}", f"{tb['entries']:,} / {sb['entries']:,}"],
        ["task listing", "get_children(/tasks)", f"list_tasks ({BUCKETS} buckets, multiRead)"],
        ["task listing s (median of 3)", flat["get_children_tasks_s"], bucketed["list_tasks_s"]],
        [
            "largest task listing Σ(len+4) bytes",
            flat["tasks_listing_bytes"],
            f"{tb['largest_listing_bytes']:,} ({tb['largest_bucket'].rsplit('/', 1)[1]})",
        ],
        ["largest task listing reply bytes", flat["tasks_reply_bytes"], tb["largest_reply_bytes"]],
        ["largest status listing reply bytes", flat["status_reply_bytes"], sb["largest_reply_bytes"]],
        ["tasks per bucket (min..max)", "-", f"{tb['min_entries']}..{tb['max_entries']}"],
        [
            "over jute.maxbuffer (1,048,575)?",
            flat["tasks_reply_bytes"] > JUTE_MAXBUFFER,
            max(tb["largest_reply_bytes"], sb["largest_reply_bytes"]) > JUTE_MAXBUFFER,
        ],
        ["Java ZooKeeperMain ls", f"/tasks: {_java_cell(fj)}", f"/tasks/_00: {_java_cell(bj)}"],
        [
            "Java ls exit code / s",
            f"{fj['exit_code']} / {fj['seconds']:.1f}",
            f"{bj['exit_code']} / {bj['seconds']:.1f}",
        ],
        ["Java client's packet len (error)", fj["packet_len"] if fj["packet_len"] is not None else "-", "-"],
        [
            "ensure_layout (this release)",
            "refused: LayoutError" if flat["ensure_layout"]["refused"] else "accepted",
            f"ok ({bucketed['ensure_layout_s'] * 1000:.1f} ms)",
        ],
        ["Controller.start", "refused: LayoutError" if flat["controller_start"]["refused"] else "accepted", "ok"],
        ["migrate s (flat → buckets)", "-", migration["seconds"]],
        ["migrate znodes moved / multis", "-", f"{migration['moved']:,} / {migration['multis']:,}"],
        [
            "AdminClient.list_tasks() s (rows)",
            "refused: LayoutError" if flat["admin_list_tasks"]["refused"] else "answered",
            f"{bucketed['admin_list_tasks']['seconds']:.2f} ({bucketed['admin_list_tasks']['rows']:,})",
        ],
        [
            "AdminClient.status() s (tasks)",
            "refused: LayoutError" if flat["admin_status"]["refused"] else "answered",
            f"{bucketed['admin_status']['seconds']:.2f} ({bucketed['admin_status']['tasks_total']:,})",
        ],
        ["controller load s (last_load_s, median of 3)", "- (refused)", ctl["last_load_s"]],
        ["controller active → load published s", "-", ctl["active_to_load_published_s"]],
        ["tasks in the controller's context", "-", ctl["tasks_in_context"]],
    ]
    headers = ["metric", "flat (layout 1)", "bucketed (layout 2)"]
    print(table(headers, rows))
    sizes = list(admin)
    admin_headers = ["admin path", *(f"{int(k):,} tasks" if int(k) else "empty" for k in sizes)]
    admin_rows = [
        ["one-task create ms (median of 15)", *(round(admin[k]["create_s"] * 1000, 1) for k in sizes)],
        ["first create into a group without a tally ms", *(round(admin[k]["first_create_s"] * 1000, 1) for k in sizes)],
        ["first page of 50 ms (median of 15)", *(round(admin[k]["page_s"] * 1000, 1) for k in sizes)],
        ["first page of a one-task group ms", *(round(admin[k]["group_page_s"] * 1000, 1) for k in sizes)],
        [
            "status ms, from the controller's summary (median of 15)",
            *(round(admin[k]["status_s"] * 1000, 1) for k in sizes),
        ],
        ["the controller's count for the summary ms", *(round(admin[k]["summary_count_s"] * 1000, 1) for k in sizes)],
        ["status --full s (every task read)", *(round(admin[k]["status_full_s"], 3) for k in sizes)],
    ]
    print(table(admin_headers, admin_rows))
    png = bench.png(NAME)
    try:
        plot(flat, bucketed, n, png)
        plot_name: str | None = png.name
    except Exception as exc:  # a missing matplotlib must not lose the figures
        bench.log(f"no plot: {type(exc).__name__}: {exc}")
        plot_name = None
    largest = max(tb["largest_reply_bytes"], sb["largest_reply_bytes"])
    largest_sum = max(tb["largest_listing_bytes"], sb["largest_listing_bytes"])
    load = ctl["last_load_s"]
    targets = [
        target(
            f"B10 no listing over 1 MiB at {n:,} tasks",
            f"{largest_sum:,} bytes",
            "< 1,048,575 bytes",
            largest < JUTE_MAXBUFFER,
            f"largest of the {2 * BUCKETS} bucket listings, Σ(len+4); its reply packet {largest:,} bytes; the flat "
            f"/tasks reply was {flat['tasks_reply_bytes']:,} bytes",
            quick_size=not full_size,
        ),
        target(
            f"B10 controller load of {n:,} tasks",
            f"{load:.2f} s",
            "< 3 s",
            load < 3.0,
            f"last_load_s, median of {ctl['rounds']} controllers (multiRead load), {ctl['tasks_in_context']:,} tasks in "
            f"its context; active → load published (with the groups' coordinators) "
            f"{ctl['active_to_load_published_s']:.2f} s",
            quick_size=not full_size,
        ),
        target(f"B10 Java client lists one bucket at {n:,} tasks", _java_cell(bj), "succeeds", bj["ok"]),
        target(
            f"B10 Java client lists the flat /tasks at {n:,} tasks",
            _java_cell(fj),
            "(fails past 1 MiB)",
            None,
            fj["error_line"] or "",
        ),
        target(
            "B10 this release refuses the flat root",
            "LayoutError" if flat["ensure_layout"]["refused"] else "accepted",
            "LayoutError",
            all(flat[k]["refused"] for k in ("ensure_layout", "controller_start", "admin_list_tasks", "admin_status")),
        ),
        target(
            f"B10 migration of {n:,} tasks and statuses",
            f"{migration['seconds']:.1f} s",
            "(measure)",
            None,
            f"{migration['moved']:,} znodes in {migration['multis']:,} multis",
        ),
    ]
    empty = admin["0"]
    for k in sizes[1:]:
        a, size_ok = admin[k], int(k) >= 100_000
        targets += [
            target(
                f"B10 one-task create at {int(k):,} tasks",
                f"{a['create_s'] * 1000:.1f} ms",
                "≤ 1.5× empty",
                a["create_s"] <= 1.5 * empty["create_s"],
                f"empty root {empty['create_s'] * 1000:.1f} ms, same run",
                quick_size=not size_ok,
            ),
            target(
                f"B10 first page of 50 at {int(k):,} tasks",
                f"{a['page_s'] * 1000:.1f} ms",
                "≤ 1.5× empty",
                a["page_s"] <= 1.5 * empty["page_s"],
                f"empty root {empty['page_s'] * 1000:.1f} ms, same run",
                quick_size=not size_ok,
            ),
            target(
                f"B10 status at {int(k):,} tasks",
                f"{a['status_s'] * 1000:.1f} ms",
                "< 0.5 s",
                a["status_s"] < 0.5 and a["status_source"] == "summary",
                f"from the controller's summary (empty root {empty['status_s'] * 1000:.1f} ms); "
                f"status --full {a['status_full_s']:.2f} s",
                quick_size=not size_ok,
            ),
        ]
    doc = {
        "setup": setup,
        "flat": flat,
        "migration": migration,
        "bucketed": bucketed,
        "admin_paths": admin,
        "table": {"headers": headers, "rows": rows},
        "admin_table": {"headers": admin_headers, "rows": admin_rows},
        "plot": plot_name,
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
