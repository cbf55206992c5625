"""A stack trace cut to a bound without losing its cause: a Spark failure's trace is a Python traceback around a
Py4J error around a JVM stack whose ``Caused by:`` sections, often far from either end, name what went wrong
(the SQL error, the OutOfMemoryError). Keeping only the head, or only the tail, drops them. Pure."""

from __future__ import annotations

import re

from controller.protocol.records.task_records import MAX_FAILURE_TRACE_CHARS

#: lines that name a cause: an exception line (Java or Python), a ``Caused by:``, Py4J's own framing
_CAUSE = re.compile(
    r"^\s*(Caused by:|Traceback \(most recent|py4j\.protocol\.|pyspark\.errors\.|\[[A-Z_]+\]|"
    r"([\w$]+\.)+[\w$]*(Exception|Error)\b|[A-Z]\w*(Exception|Error)\b)"
)
HEAD_LINES = 12  # the top of the trace: the exception and where it was raised
FRAMES_AFTER_CAUSE = 2  # frames kept under each cause line: where that cause was raised
MAX_LINE_CHARS = 1000


def bound_trace(text: str, limit: int = MAX_FAILURE_TRACE_CHARS) -> str:
    """``text`` if it fits in ``limit`` characters; else its head, every line naming a cause (with the frames
    right under it) and as much of its tail as fits, with the omissions marked."""
    if len(text) <= limit:
        return text
    lines = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + "…" for line in text.splitlines()]
    keep: set[int] = set(range(min(HEAD_LINES, len(lines))))
    for i, line in enumerate(lines):
        if _CAUSE.match(line):
            keep.update(range(i, min(i + 1 + FRAMES_AFTER_CAUSE, len(lines))))
    budget = limit // 2  # the head and the causes; the tail gets the rest
    chosen: list[int] = []
    used = 0
    for i in sorted(keep):
        if used + len(lines[i]) + 1 > budget:
            break
        chosen.append(i)
        used += len(lines[i]) + 1
    tail: list[int] = []
    gaps = sum(1 for k, i in enumerate(chosen) if k == 0 or chosen[k - 1] != i - 1)
    room = limit - used - 40 * (gaps + 2)  # (room for the omission markers)
    for i in range(len(lines) - 1, (chosen[-1] if chosen else -1), -1):
        if room - len(lines[i]) - 1 < 0:
            break
        tail.append(i)
        room -= len(lines[i]) + 1
    picked = sorted(set(chosen) | set(tail))
    out: list[str] = []
    last = -1
    for i in picked:
        if i > last + 1:
            out.append(f"… ({i - last - 1} lines omitted)")
        out.append(lines[i])
        last = i
    if last < len(lines) - 1:
        out.append(f"… ({len(lines) - 1 - last} lines omitted)")
    result = "\n".join(out)
    return result if len(result) <= limit else result[-limit:]
