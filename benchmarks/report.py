"""``python -m benchmarks.report``: the results in ``benchmarks/results/*.json`` as Markdown tables (what
docs/benchmarks.md quotes), so the doc can be refreshed from the latest run without retyping figures."""

from __future__ import annotations

import json
import sys
from typing import Any

from benchmarks.common import RESULTS_DIR, machine_line, markdown_table

ORDER = ("b1_rolling_bounce", "b2_rebalance", "b3_failover", "b4_zk_writes", "b5_event_thread", "b6_spark", "b7_memory")


def _load(name: str) -> dict[str, Any] | None:
    p = RESULTS_DIR / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def render() -> str:
    out: list[str] = []
    targets: list[list[Any]] = []
    for name in ORDER:
        doc = _load(name)
        if doc is None:
            out.append(f"### {name}\n\n(no results yet)\n")
            continue
        out.append(f"### {name} ({doc.get('mode')} run, finished {doc.get('finished')})\n")
        out.append(f"Machine: {machine_line(doc.get('machine', {}))}\n")
        t = doc.get("table")
        if isinstance(t, dict):
            out.append(markdown_table(t["headers"], t["rows"]) + "\n")
        elif isinstance(t, list) and t:
            out.append("```\n" + json.dumps(t, indent=None) + "\n```\n")
        for tg in doc.get("targets", []):
            targets.append(
                [
                    tg["target"],
                    tg["measured"],
                    tg["goal"],
                    "met" if tg["met"] else ("**missed**" if tg["met"] is False else "n/a"),
                    tg.get("note", ""),
                ]
            )
        if doc.get("status") not in (None, "ok"):
            out.append(f"Status: {doc.get('status')} {doc.get('error') or doc.get('reason') or ''}\n")
    head = "### Targets\n\n" + markdown_table(["target", "measured", "goal", "", "note"], targets) + "\n"
    return head + "\n" + "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(render())
