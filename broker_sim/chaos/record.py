"""A chaos run's placement looks on disk, so that invariant 9 can be judged again without the run.

The run writes ``placements.jsonl`` into its work directory (kept with ``ZKC_CHAOS_KEEP=1``): a first line
with the fault phase's start (``t0``, wall clock) and the run's bound, then one look a line, blind ones
included. ``zkctl sim rejudge DIR`` reads it back and prints invariant 9 over it: a kept run is judged again
by today's rule, and its stretches can be set beside the processes' logs of the same directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker_sim.chaos.summary import Placement, Verdict
from broker_sim.chaos.verdicts import placed_tasks_run_while_stable
from controller.protocol.errors import ZkcError

PLACEMENTS_FILE = "placements.jsonl"
MAX_LINE = 1 << 20  # one look's line: a few hundred placed tasks without an owner at most, far below this


class RecordError(ZkcError):
    """A placements file that is missing or not one a chaos run wrote."""


def write_placements(path: Path, placements: Sequence[Placement], t0: float, bound_s: float) -> None:
    """Write the looks of a run (``t0``: the start of its fault phase; ``bound_s``: invariant 9's bound)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"t0": t0, "bound_s": bound_s}) + "\n")
        for p in placements:
            row = {"t": p.t, "state": p.state, "up": p.controller_up, "unowned": p.unowned, "strangers": p.strangers}
            f.write(json.dumps(row) + "\n")


def _pairs(value: Any, second: type, where: str) -> tuple[tuple[Any, Any], ...]:
    if not isinstance(value, list) or not all(
        isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], second) for x in value
    ):
        raise RecordError(f"{where}: not a list of [{'name, ' + second.__name__}] pairs")
    return tuple((a, b) for a, b in value)


def _look(line: str, where: str) -> Placement:
    try:
        row = json.loads(line)
    except ValueError as exc:
        raise RecordError(f"{where}: not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise RecordError(f"{where}: not an object")
    t, state, up = row.get("t"), row.get("state"), row.get("up")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not (state is None or isinstance(state, str)):
        raise RecordError(f"{where}: no time or state")
    if not isinstance(up, bool):
        raise RecordError(f"{where}: 'up' is not true or false")
    unowned = _pairs(row.get("unowned", []), str, where)
    strangers = _pairs(row.get("strangers", []), int, where)
    return Placement(float(t), state, unowned, strangers, up)


def read_placements(path: Path) -> tuple[float, float, list[Placement]]:
    """``t0``, the bound and the looks of a placements file; a file that is not one a run wrote is refused
    with the line that is wrong."""
    if not path.is_file():
        raise RecordError(f"{path}: no such file (a chaos run's work directory has it, kept with ZKC_CHAOS_KEEP=1)")
    looks: list[Placement] = []
    with open(path, encoding="utf-8") as f:
        head = f.readline(MAX_LINE + 1)
        try:
            first = json.loads(head)
            t0, bound = float(first["t0"]), float(first["bound_s"])
        except (ValueError, KeyError, TypeError):
            raise RecordError(f"{path}:1: not a placements file's first line") from None
        for n, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), ""), start=2):
            if len(line) > MAX_LINE:
                raise RecordError(f"{path}:{n}: a line longer than {MAX_LINE} characters")
            if line.strip():
                looks.append(_look(line, f"{path}:{n}"))
    return t0, bound, looks


def rejudge(workdir: Path, bound_s: float | None = None) -> tuple[Verdict, float, float]:
    """Invariant 9 over a kept run's looks (at its own bound unless ``bound_s``), with the longest time a
    placed task had no running owner, and the longest while Stable."""
    t0, bound, looks = read_placements(workdir / PLACEMENTS_FILE)
    return placed_tasks_run_while_stable(looks, bound if bound_s is None else bound_s, t0)
