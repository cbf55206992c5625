"""Spark Structured Streaming checkpoints and file-sink logs, read and rewound without Spark. Pure: the caller
reads the files (``controller.admin.offsets``); this module parses their bytes and plans a reset as a list of
file operations.

What a checkpoint holds (Spark's own format, the same since Spark 2): ``offsets/<b>`` (``v1``, a metadata line
with ``batchTimestampMs``, then one line per source: its offset as JSON or ``-``), written before batch ``b``
runs; ``commits/<b>`` once its sink committed it; ``sources/<i>/<b>`` the files a file source took in batch
``b`` (one JSON line per file). The file sink keeps its own log, ``<sink>/_spark_metadata/<b>``, of the files
each committed batch wrote, and skips a batch whose id is already there. Logs are compacted every few batches
(``<b>.compact`` holds every entry up to ``b``; the per-batch files before it are removed later).

Every byte is untrusted (the checkpoint lives on shared storage anyone with access can write): a file that is
too large, truncated, not UTF-8, of another version or not JSON raises ``CheckpointError`` naming the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.protocol.errors import ZkcError

#: the largest log file read (a compacted source log of a long-running query is the big one)
MAX_LOG_BYTES = 32 * 1024 * 1024
#: batches listed per log directory at most (Spark keeps 100 by default, minBatchesToRetain)
MAX_BATCHES = 100_000
#: files of the last committed batch shown per source
SHOWN_FILES = 20

_BATCH = re.compile(r"^(0|[1-9][0-9]{0,17})(\.compact)?$")


class CheckpointError(ZkcError, ValueError):
    """A checkpoint (or a file sink's log) that cannot be read or rewound as asked (HTTP 422)."""

    status = 422
    code = "invalid_checkpoint"


@dataclass(frozen=True)
class LogName:
    """A log file's name: its batch id and whether it is a compaction (``<b>.compact``)."""

    batch: int
    compact: bool = False

    @property
    def name(self) -> str:
        return f"{self.batch}.compact" if self.compact else str(self.batch)


def log_name(name: str) -> LogName | None:
    """The batch of a log directory's entry, or None for anything else (``.crc`` and temporary files)."""
    m = _BATCH.match(name)
    return LogName(int(m.group(1)), m.group(2) is not None) if m else None


def log_names(names: Sequence[str], where: str) -> list[LogName]:
    """The batch files among a directory's ``names``, by batch id."""
    out = sorted((n for n in map(log_name, names) if n is not None), key=lambda n: (n.batch, n.compact))
    if len(out) > MAX_BATCHES:
        raise CheckpointError(f"{where}: {len(out):,} batch files, more than the {MAX_BATCHES:,} read")
    return out


def _lines(data: bytes, where: str) -> list[str]:
    if len(data) > MAX_LOG_BYTES:
        raise CheckpointError(f"{where}: {len(data):,} bytes, over the {MAX_LOG_BYTES:,} read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise CheckpointError(f"{where}: empty (a truncated write?)")
    if lines[0] != "v1":
        raise CheckpointError(f"{where}: log version {lines[0][:20]!r}, only 'v1' is read")
    return lines[1:]


def _json(line: str, where: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise CheckpointError(f"{where}: a line is not JSON (a truncated or foreign file?)") from None


def _obj(line: str, where: str, fields: Mapping[str, type]) -> dict[str, Any]:
    value = _json(line, where)
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: expected a JSON object, got {type(value).__name__}")
    for key, tp in fields.items():
        got = value.get(key)
        if not isinstance(got, tp) or isinstance(got, bool):
            raise CheckpointError(f"{where}: {key!r} missing or not {tp.__name__}")
    return value


def parse_metadata(data: bytes, where: str) -> str | None:
    """The checkpoint's ``metadata`` (``{"id": <query id>}``, no version line): the query's id, if it has one."""
    if len(data) > MAX_LOG_BYTES:
        raise CheckpointError(f"{where}: {len(data):,} bytes, over the {MAX_LOG_BYTES:,} read")
    value = _json(data.decode("utf-8", "replace"), where)
    got = value.get("id") if isinstance(value, dict) else None
    return got if isinstance(got, str) else None


@dataclass(frozen=True)
class OffsetEntry:
    """``offsets/<b>``: when the batch was planned and each source's end offset (None: the source had none)."""

    batch: int
    timestamp_ms: int
    metadata: dict[str, Any]
    sources: tuple[Any, ...]


def parse_offsets(batch: int, data: bytes, where: str) -> OffsetEntry:
    lines = _lines(data, where)
    if len(lines) < 2:
        raise CheckpointError(f"{where}: {len(lines)} line(s) after the version, expected metadata and sources")
    meta = _obj(lines[0], where, {"batchTimestampMs": int})
    sources = tuple(None if line == "-" else _json(line, where) for line in lines[1:])
    return OffsetEntry(batch, meta["batchTimestampMs"], meta, sources)


def parse_commit(data: bytes, where: str) -> None:
    """``commits/<b>``: only its presence matters; its bytes must still be Spark's (else the query cannot start)."""
    lines = _lines(data, where)
    if len(lines) != 1:
        raise CheckpointError(f"{where}: {len(lines)} line(s) after the version, expected 1")
    _obj(lines[0], where, {})


@dataclass(frozen=True)
class SourceFile:
    """A file a file source took: its URI, modification time and the batch that took it."""

    path: str
    timestamp_ms: int
    batch: int


def parse_source_log(data: bytes, where: str) -> list[SourceFile]:
    out = []
    for line in _lines(data, where):
        e = _obj(line, where, {"path": str, "timestamp": int, "batchId": int})
        out.append(SourceFile(e["path"], e["timestamp"], e["batchId"]))
    return out


@dataclass(frozen=True)
class SinkFile:
    """A file the file sink committed (``action`` "add"; "delete" is Spark's, never written by its sink)."""

    path: str
    size: int
    action: str
    raw: dict[str, Any]


def parse_sink_log(data: bytes, where: str) -> list[SinkFile]:
    out = []
    for line in _lines(data, where):
        e = _obj(line, where, {"path": str, "size": int, "action": str})
        out.append(SinkFile(e["path"], e["size"], e["action"], e))
    return out


def encode_log(entries: Sequence[Mapping[str, Any]]) -> bytes:
    """A log file as Spark writes it: ``v1`` and one compact JSON object per line."""
    return ("v1" + "".join("\n" + json.dumps(e, separators=(",", ":")) for e in entries)).encode()


def encode_offsets(metadata: Mapping[str, Any], sources: Sequence[Any]) -> bytes:
    lines = ["v1", json.dumps(metadata, separators=(",", ":"))]
    lines += ["-" if s is None else json.dumps(s, separators=(",", ":")) for s in sources]
    return "\n".join(lines).encode()


COMMIT_BYTES = b'v1\n{"nextBatchWatermarkMs":0}'


# ---- what a checkpoint says -------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointLogs:
    """The batch files found in a checkpoint and in its sink's log (names only; no content)."""

    offsets: tuple[LogName, ...]
    commits: tuple[LogName, ...]
    sources: Mapping[int, tuple[LogName, ...]]  # source index -> its log's files (file sources only)
    sink: tuple[LogName, ...] | None  # None: no file sink log (a console sink, or nothing committed yet)
    stateful: bool = False  # a ``state/`` directory: the query keeps state (aggregations, joins)

    @property
    def last_committed(self) -> int | None:
        return self.commits[-1].batch if self.commits else None

    @property
    def last_planned(self) -> int | None:
        return self.offsets[-1].batch if self.offsets else None

    @property
    def earliest(self) -> int | None:
        """The oldest batch whose offsets are still kept (Spark removes older ones)."""
        return self.offsets[0].batch if self.offsets else None


def _after(names: Sequence[LogName], batch: int) -> list[LogName]:
    return [n for n in names if n.batch > batch]


@dataclass(frozen=True)
class ResetPlan:
    """What a reset does, in order: directories removed whole, log files removed (``.crc`` siblings with them),
    files written, and sink data files removed (those the removed sink batches committed)."""

    target: str  # earliest | batch N | latest
    position: int  # the last batch that stays committed (-1: none, the query starts afresh)
    remove_dirs: tuple[str, ...] = ()  # relative to the checkpoint ("" = the checkpoint) or "sink:_spark_metadata"
    remove_logs: tuple[str, ...] = ()  # "offsets/7", "sources/0/7", "sink:_spark_metadata/7"
    write: tuple[tuple[str, bytes], ...] = ()
    sink_batches_removed: tuple[int, ...] = ()


def plan_to_earliest(logs: CheckpointLogs) -> ResetPlan:
    """Forget everything: the next start reads the sources from the beginning. The sink's log is removed with
    the checkpoint (and the caller removes the data files it lists): its batch ids start again at 0, and a sink
    log that still had them would make Spark skip the replayed batches as already written."""
    dirs = [""] + (["sink:_spark_metadata"] if logs.sink is not None else [])
    sink_batches = tuple(n.batch for n in logs.sink or () if not n.compact)
    return ResetPlan("earliest", -1, remove_dirs=tuple(dirs), sink_batches_removed=sink_batches)


def check_batch(logs: CheckpointLogs, batch: int) -> None:
    """Whether ``--to-batch batch`` can be done; raises CheckpointError saying why not and what can."""
    last, earliest = logs.last_committed, logs.earliest
    if last is None or earliest is None:
        raise CheckpointError("no batch has been committed yet: nothing to rewind (use --to-earliest)")
    if not earliest <= batch <= last:
        raise CheckpointError(
            f"batch {batch} is not a committed batch still in the checkpoint (kept: {earliest} to {last})"
        )
    if logs.stateful and batch != last:
        raise CheckpointError(
            "the query keeps state (its checkpoint has state/): rewinding it to a batch is not supported; "
            "use --to-earliest"
        )
    for where, names in [(f"sources/{i}", n) for i, n in sorted(logs.sources.items())] + [
        ("the sink's _spark_metadata", logs.sink or ())
    ]:
        compacted = [n.batch for n in names if n.compact and n.batch > batch]
        if compacted:
            raise CheckpointError(
                f"batch {batch} lies before the compaction of {where} at batch {compacted[-1]}: the per-batch "
                f"entries after {batch} are merged there; rewind to {compacted[-1]} or later, or --to-earliest"
            )


def plan_to_batch(logs: CheckpointLogs, batch: int) -> ResetPlan:
    """Keep batches up to ``batch`` committed and forget the later ones in the checkpoint and in the sink's
    log (their data files removed): the next start replays from ``batch + 1``, and the sink holds each input
    row once."""
    check_batch(logs, batch)
    remove = [f"offsets/{n.name}" for n in _after(logs.offsets, batch)]
    remove += [f"commits/{n.name}" for n in _after(logs.commits, batch)]
    for i, names in sorted(logs.sources.items()):
        remove += [f"sources/{i}/{n.name}" for n in _after(names, batch)]
    sink_gone = _after(logs.sink or (), batch)
    remove += [f"sink:_spark_metadata/{n.name}" for n in sink_gone]
    return ResetPlan(
        f"batch {batch}", batch, remove_logs=tuple(remove), sink_batches_removed=tuple(n.batch for n in sink_gone)
    )


@dataclass(frozen=True)
class LatestInputs:
    """What ``--to-latest`` needs read: the last committed offsets, each file source's files now present and
    not yet taken (URIs with their modification times), and each compacting log's entries so far (only
    when the new batch is a compaction: ``<b>.compact`` holds every entry up to it)."""

    last: OffsetEntry
    pending: Mapping[int, Sequence[tuple[str, int]]]
    source_entries: Mapping[int, Sequence[SourceFile]]
    sink_entries: Sequence[SinkFile] | None


def is_compaction(batch: int, interval: int) -> bool:
    return interval > 0 and (batch + 1) % interval == 0


def plan_to_latest(logs: CheckpointLogs, latest: LatestInputs, now_ms: int, compact_interval: int = 10) -> ResetPlan:
    """Skip what arrived and was not processed: one more batch, committed, that takes every file now present
    and writes nothing to the sink. Only for checkpoints whose every source is a file source."""
    last = latest.last
    if logs.last_committed is None or logs.last_committed != last.batch:
        raise CheckpointError("no batch has been committed yet: start the task once before --to-latest")
    if logs.stateful:
        raise CheckpointError("the query keeps state (its checkpoint has state/): --to-latest is not supported")
    if set(logs.sources) != set(range(len(last.sources))):
        raise CheckpointError("--to-latest needs every source to be a file source")
    new = last.batch + 1
    plan = plan_to_batch(logs, last.batch)  # drop a planned-but-uncommitted batch first
    write: list[tuple[str, bytes]] = []
    compact = is_compaction(new, compact_interval)
    offsets: list[Any] = []
    for i in range(len(last.sources)):
        entries = [{"path": p, "timestamp": ts, "batchId": new} for p, ts in latest.pending.get(i, ())]
        if compact:
            entries = [
                {"path": e.path, "timestamp": e.timestamp_ms, "batchId": e.batch} for e in latest.source_entries[i]
            ] + entries
        write.append((f"sources/{i}/{LogName(new, compact).name}", encode_log(entries)))
        offsets.append({"logOffset": new})
    if logs.sink is not None:
        sink_compact = is_compaction(new, compact_interval)
        rows = [e.raw for e in latest.sink_entries or ()] if sink_compact else []
        write.append((f"sink:_spark_metadata/{LogName(new, sink_compact).name}", encode_log(rows)))
    meta = dict(last.metadata, batchTimestampMs=now_ms)
    write.append((f"offsets/{new}", encode_offsets(meta, offsets)))
    write.append((f"commits/{new}", COMMIT_BYTES))  # last: the batch counts once all else is there
    return ResetPlan(
        "latest",
        new,
        remove_logs=plan.remove_logs,
        write=tuple(write),
        sink_batches_removed=plan.sink_batches_removed,
    )
