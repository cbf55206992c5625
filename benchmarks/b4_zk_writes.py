"""B4 — ZooKeeper write paths: 10,000 status-sized znodes written one by one synchronously, pipelined
with the async API, and in fenced batched multis (``FencedWriter``, as the controller writes), as creates
and as overwrites, in one run (rounds interleave the methods so that noise from other load hits all)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import Bench, median, ratio, table, target, zookeeper
from controller.protocol.records import codecs, task_records
from controller.zk.client import ZkSettings, make_client
from controller.zk.io import Create, Delete, FencedWriter, InterruptibleClient, SetData, chunk_ops

NAME = "b4_zk_writes"
TITLE = "B4 ZooKeeper write paths"


def _payload(i: int) -> bytes:
    return codecs.encode(
        task_records.TaskStatus(
            broker=f"broker-{i % 100:03d}",
            state="RUNNING",
            generation=7,
            updated=time.time(),
            metrics={"uptime_s": 12.5, "rows": i},
        )
    )


def _sync(client: Any, op: str) -> Callable[[list[tuple[str, bytes]]], None]:
    def run(items: list[tuple[str, bytes]]) -> None:
        for p, d in items:
            client.create(p, d) if op == "create" else client.set(p, d)

    return run


def _async(client: Any, op: str) -> Callable[[list[tuple[str, bytes]]], None]:
    def run(items: list[tuple[str, bytes]]) -> None:
        if op == "create":
            pending = [client.create_async(p, d) for p, d in items]
        else:
            pending = [client.set_async(p, d) for p, d in items]
        for a in pending:
            a.get(timeout=60)

    return run


def _multi(writer: FencedWriter, op: str) -> Callable[[list[tuple[str, bytes]]], None]:
    def run(items: list[tuple[str, bytes]]) -> None:
        writer.write([Create(p, d) if op == "create" else SetData(p, d) for p, d in items])

    return run


def _delete_all(writer: FencedWriter, paths: list[str]) -> None:
    writer.write([Delete(p) for p in paths])


def run(bench: Bench) -> dict[str, Any]:
    n = 1500 if bench.quick else 10_000
    rounds = 1 if bench.quick else 3
    results: dict[str, list[float]] = {}
    with zookeeper(heap_mb=512, name="b4") as zk:
        client = make_client(ZkSettings(hosts=zk.address, root="/b4"))
        try:
            zk_client = InterruptibleClient(client)
            client.ensure_path("/b4/epoch")
            epoch_version = client.exists("/b4/epoch").version
            fenced = FencedWriter(zk_client, "/b4/epoch", epoch_version)
            cleaner = FencedWriter(zk_client, None)
            methods: dict[str, Callable[[str], Callable[[list[tuple[str, bytes]]], None]]] = {
                "sync (one create/set per round trip)": lambda op: _sync(client, op),
                "async pipelined": lambda op: _async(client, op),
                "batched fenced multis (FencedWriter)": lambda op: _multi(fenced, op),
            }
            for r in range(rounds):
                order = list(methods)[r % 3 :] + list(methods)[: r % 3]
                for m_i, method in enumerate(order):
                    base = f"/b4/r{r}-{m_i}"
                    client.ensure_path(base)
                    paths = [f"{base}/s-{i:05d}" for i in range(n)]
                    items = [(p, _payload(i)) for i, p in enumerate(paths)]
                    for op in ("create", "set"):
                        fn = methods[method](op)
                        t0 = time.perf_counter()
                        fn(items)
                        dt = time.perf_counter() - t0
                        results.setdefault(f"{method}|{op}", []).append(n / dt)
                        bench.log(f"round {r + 1}/{rounds} {method:<40} {op:<6} {n / dt:10,.0f} writes/s")
                    _delete_all(cleaner, paths)
            multis = len(chunk_ops([Create(p, d) for p, d in items]))
        finally:
            client.stop()
            client.close()
    rows = []
    summary: dict[str, Any] = {}
    for op in ("create", "set"):
        sync = median(results[f"sync (one create/set per round trip)|{op}"])
        for method in (
            "sync (one create/set per round trip)",
            "async pipelined",
            "batched fenced multis (FencedWriter)",
        ):
            med = median(results[f"{method}|{op}"])
            summary[f"{method}|{op}"] = {
                "writes_per_s_median": med,
                "runs": results[f"{method}|{op}"],
                "vs_sync": ratio(med, sync),
            }
            rows.append(
                [method, op, med, min(results[f"{method}|{op}"]), max(results[f"{method}|{op}"]), ratio(med, sync)]
            )
    headers = ["method", "op", "writes/s (median)", "min", "max", "× sync"]
    print(table(headers, rows))
    b_create = summary["batched fenced multis (FencedWriter)|create"]
    b_set = summary["batched fenced multis (FencedWriter)|set"]
    batched = min(b_create["writes_per_s_median"], b_set["writes_per_s_median"])
    speedup = min(b_create["vs_sync"], b_set["vs_sync"])
    targets = [
        target(
            "B4 batched writes/s",
            round(batched),
            "≥ 10,000 /s",
            batched >= 10_000,
            "the lower of create and set, median of rounds",
        ),
        target("B4 batched vs sync", round(speedup, 1), "≥ 8×", speedup >= 8),
    ]
    doc = {
        "writes": n,
        "rounds": rounds,
        "ops_per_multi": 500,
        "multis_per_write": multis,
        "payload_bytes": len(_payload(1)),
        "results": summary,
        "table": {"headers": headers, "rows": rows},
        "targets": targets,
    }
    bench.write(NAME, doc)
    return doc
