"""``python -m benchmarks [--quick] [--only B1,B4]``: run the benchmarks, print their tables, write
``benchmarks/results/<name>.json`` (and PNGs), then a summary of every target with its measured figure."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
import time
import traceback

from benchmarks.common import RESULTS_DIR, Bench, machine_info, machine_line, quiet_logging, table

QUICK_SKIPS = ("B6", "B11")
BENCHMARKS = {
    "B1": "benchmarks.b1_rolling_bounce",
    "B2": "benchmarks.b2_rebalance",
    "B3": "benchmarks.b3_failover",
    "B4": "benchmarks.b4_zk_writes",
    "B5": "benchmarks.b5_event_thread",
    "B6": "benchmarks.b6_spark",
    "B7": "benchmarks.b7_memory",
    "B8": "benchmarks.b8_scale",
    "B9": "benchmarks.b9_api",
    "B10": "benchmarks.b10_layout",
    "B11": "benchmarks.b11_density",
}


def _interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, one round each (under 3 minutes in all)")
    p.add_argument("--only", default="", help="comma-separated subset, e.g. B1,B4")
    args = p.parse_args(argv)
    wanted = [b.strip().upper() for b in args.only.split(",") if b.strip()] or list(BENCHMARKS)
    skipped = []
    if args.quick and not args.only:
        # B6 starts a Spark JVM (15 s idle, up to a minute on a loaded machine): not within a 3-minute quick run
        skipped = [b for b in QUICK_SKIPS if b in wanted]
        wanted = [b for b in wanted if b not in QUICK_SKIPS]
    unknown = [b for b in wanted if b not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    quiet_logging()
    # stop cleanly (every benchmark's finally stops its servers and children by pid) on SIGTERM, and on
    # SIGINT even when started in the background (where the shell leaves SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    machine = machine_info()
    # quick results go to results/quick/, so a smoke run never overwrites the figures docs/benchmarks.md quotes
    out_dir = RESULTS_DIR / "quick" if args.quick else RESULTS_DIR
    bench = Bench(quick=args.quick, machine=machine, out_dir=out_dir)
    print(f"zkcontroller benchmarks ({'quick' if args.quick else 'full'}): {', '.join(wanted)}")
    print(f"machine: {machine_line(machine)}")
    for b in skipped:
        print(
            f"({b} is not part of a quick run of everything: it starts a Spark JVM; run `python -m benchmarks --quick --only {b}`)"
        )
    t_all = time.monotonic()
    outcomes = []
    for key in wanted:
        module = importlib.import_module(BENCHMARKS[key])
        print(f"\n== {module.TITLE} ==")
        t0 = time.monotonic()
        try:
            doc = module.run(bench)
            status = doc.get("status", "ok")
        except Exception as exc:
            traceback.print_exc()
            doc = {"status": "error", "error": f"{type(exc).__name__}: {exc}", "targets": []}
            bench.write(module.NAME, doc)
            status = "error"
        took = time.monotonic() - t0
        print(f"   ({key} took {took:.1f}s)")
        outcomes.append((key, module.NAME, status, took, doc.get("targets", [])))
    total = time.monotonic() - t_all
    rows = []
    for key, _name, status, _took, targets in outcomes:
        if not targets:
            rows.append([key, status, "-", "-", "-"])
        for t in targets:
            rows.append(
                [
                    key,
                    t["target"],
                    t["measured"],
                    t["goal"],
                    "met" if t["met"] else ("MISSED" if t["met"] is False else "n/a"),
                ]
            )
    print(f"\n== targets ({'quick' if args.quick else 'full'} run, {total:.0f}s) ==")
    print(table(["bench", "target", "measured", "goal", ""], rows))
    summary = {
        "mode": "quick" if args.quick else "full",
        "machine": machine,
        "total_s": round(total, 1),
        "benchmarks": [
            {"key": k, "name": n, "status": s, "seconds": round(t, 1), "targets": tg} for k, n, s, t, tg in outcomes
        ],
    }
    # the summary keeps earlier entries of benchmarks not run this time (each entry says when it ran)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"summary-{summary['mode']}.json"
    try:
        old = {b["key"]: b for b in json.loads(path.read_text()).get("benchmarks", [])}
    except (OSError, ValueError):
        old = {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    new = {b["key"]: {**b, "finished": stamp} for b in summary["benchmarks"]}
    summary["benchmarks"] = [new.get(k) or old[k] for k in BENCHMARKS if k in new or k in old]
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 0 if all(o[2] in ("ok", "partial", "not done") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
