"""A task's Spark checkpoint as files on this broker: the logs listed and read, the source files a file source
would see, a checkpoint's size, and a reset plan carried out on disk.

Every path is reached through :class:`SafeDir` (no symbolic link followed below the checkpoint root or the
sink directory, no special file read) and charged to the request's one :class:`Budget`. No ZooKeeper here:
``checkpoint_ops`` decides what to read and what to change, ``controller.protocol.tasks.checkpoints`` (pure) parses
the bytes and plans resets, and this module is the file system between them."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import unquote, urlparse

from broker_sim.worker.safe_files import Budget, BudgetExceeded, SafeDir
from controller.protocol.tasks import checkpoints as ck
from controller.protocol.tasks.checkpoints import CheckpointError, CheckpointLogs, LogName
from controller.protocol.tasks.spec import FilesSink, FilesSource, SparkPipeline
from controller.protocol.tasks.storage import CheckpointSize

#: files listed in a source directory at most (pending files of ``offsets``, ``--to-latest``)
MAX_LISTED = 100_000
#: entries (files and directories) a size walk visits at most
MAX_SIZE_ENTRIES = 200_000
#: directory levels a walk descends at most (a Spark checkpoint has four: state/<op>/<partition>/<files>)
MAX_DEPTH = 16


def local_path(url: str, what: str) -> str:
    """A local absolute path from a path or ``file:`` URL; any other scheme is refused (not a local disk)."""
    if "://" in url or url.startswith("file:"):
        parsed = urlparse(url)
        if parsed.scheme != "file":
            raise CheckpointError(
                f"{what} {url!r} is on {parsed.scheme}://, which the broker does not read: use Spark's tools there"
            )
        url = unquote(parsed.path)
    if not url.startswith("/"):
        raise CheckpointError(f"{what} {url!r} is not absolute: refused")
    return str(PurePosixPath(url))


@dataclass(frozen=True)
class PipelineFiles:
    """The pipeline's file source and file sink as local paths (None: not files)."""

    source: str | None
    sink: str | None

    @property
    def file_sources(self) -> set[int]:
        return {0} if self.source is not None else set()


def pipeline_files(p: SparkPipeline) -> PipelineFiles:
    src = local_path(p.source.path, "source path") if isinstance(p.source, FilesSource) else None
    sink = local_path(p.sink.path, "sink path") if isinstance(p.sink, FilesSink) else None
    return PipelineFiles(src, sink)


def names_in(d: SafeDir, rel: str) -> list[str]:
    """A log directory's entries (none where it does not exist)."""
    sub = d.walk_to(rel)
    if sub is None:
        return []
    with sub:
        return sub.names()


def read_file(d: SafeDir, rel: str) -> bytes:
    """A log file's bytes, one past the largest log parsed (so an oversized one is refused, not truncated)."""
    parent, _, name = rel.rpartition("/")
    sub = d.walk_to(parent) if parent else d
    if sub is None:
        raise CheckpointError(f"{d.path}/{rel}: missing")
    try:
        return sub.read(name, ck.MAX_LOG_BYTES)
    finally:
        if sub is not d:
            sub.close()


def is_file(d: SafeDir, rel: str) -> bool:
    parent, _, name = rel.rpartition("/")
    sub = d.walk_to(parent) if parent else d
    if sub is None:
        return False
    try:
        return sub.kind(name) == "file"
    finally:
        if sub is not d:
            sub.close()


def read_logs(chk: SafeDir, sink: SafeDir | None, file_sources: set[int]) -> CheckpointLogs:
    """The names of every log of the checkpoint (and of the file sink's log), for the plans."""
    sources = {i: tuple(ck.log_names(names_in(chk, f"sources/{i}"), f"{chk.path}/sources/{i}")) for i in file_sources}
    sink_log = None
    if sink is not None and sink.kind("_spark_metadata") is not None:
        sink_log = tuple(ck.log_names(names_in(sink, "_spark_metadata"), f"{sink.path}/_spark_metadata"))
    return CheckpointLogs(
        offsets=tuple(ck.log_names(names_in(chk, "offsets"), f"{chk.path}/offsets")),
        commits=tuple(ck.log_names(names_in(chk, "commits"), f"{chk.path}/commits")),
        sources=sources,
        sink=sink_log,
        stateful=chk.kind("state") == "dir",
    )


def preflight(d: SafeDir, rels: list[str]) -> None:
    """Refuse before reading anything when the logs to read together are over what the request may still read
    (their sizes from a stat each: forged logs are refused in milliseconds, not after seconds of parsing)."""
    total = 0
    for rel in rels:
        parent, _, name = rel.rpartition("/")
        sub = d.walk_to(parent) if parent else d
        if sub is None:
            continue
        try:
            st = sub.lstat(name)
        finally:
            if sub is not d:
                sub.close()
        total += st.st_size if st is not None else 0
    if total > d.budget.room():
        raise BudgetExceeded(
            f"{d.path}: the {len(rels)} log file(s) to read hold {total:,} bytes, over the request's "
            f"{d.budget.max_bytes:,} bytes in total"
        )


def _since_compaction(names: Iterable[LogName]) -> list[LogName]:
    """A log's live files, in order: its latest compaction, then the per-batch files after it."""
    chosen = list(names)
    compact = [n for n in chosen if n.compact]
    start = compact[-1].batch if compact else -1
    return [n for n in chosen if (n.compact and n.batch == start) or (not n.compact and n.batch > start)]


def source_entries(chk: SafeDir, index: int, names: tuple[LogName, ...], upto: int) -> list[ck.SourceFile]:
    """Every entry of a source log up to batch ``upto``: the latest compaction at or below it, then the
    per-batch files after it."""
    out: list[ck.SourceFile] = []
    rels = [f"sources/{index}/{n.name}" for n in _since_compaction(n for n in names if n.batch <= upto)]
    preflight(chk, rels)
    for rel in rels:
        out += ck.parse_source_log(read_file(chk, rel), f"{chk.path}/{rel}")
    return out


def sink_entries(sink: SafeDir, names: tuple[LogName, ...]) -> list[ck.SinkFile]:
    """Every entry of a file sink's log: its latest compaction, then the per-batch files after it."""
    out: list[ck.SinkFile] = []
    rels = [f"_spark_metadata/{n.name}" for n in _since_compaction(names)]
    preflight(sink, rels)
    for rel in rels:
        out += ck.parse_sink_log(read_file(sink, rel), f"{sink.path}/{rel}")
    return out


def listed_files(src: str, budget: Budget) -> list[tuple[str, int]] | None:
    """The files a file source would see (hidden and ``_`` names skipped, as Spark does), as URIs with their
    modification time in ms; None where the directory is not readable here or too large to list."""
    out: list[tuple[str, int]] = []

    def walk(d: SafeDir, depth: int) -> None:
        for name, st in d.entries():
            if name.startswith((".", "_")):
                continue
            if stat.S_ISDIR(st.st_mode) and depth < 8:
                sub = d.sub(name)
                if sub is not None:
                    with sub:
                        walk(sub, depth + 1)
            elif stat.S_ISREG(st.st_mode):
                out.append((PurePosixPath(f"{d.path}/{name}").as_uri(), int(st.st_mtime * 1000)))
                if len(out) > MAX_LISTED:
                    raise BudgetExceeded("too many files")

    try:
        top = SafeDir.open(src, budget)
        if top is None:
            return None
        with top:
            walk(top, 0)
    except CheckpointError:
        return None
    return out


def pending_count(src: str, taken: set[str], budget: Budget) -> int | None:
    files = listed_files(src, budget)
    return None if files is None else sum(1 for uri, _ts in files if uri not in taken)


def measure(root: SafeDir, task_id: str, budget: Budget) -> CheckpointSize:
    """Bytes and files under the checkpoint: a depth-first walk (one open descriptor per level, at most
    ``MAX_DEPTH`` levels) bounded in entries (directories count) and time; ``complete`` False when it stopped
    at a bound."""
    path = f"{root.path}/{task_id}"
    top = root.sub(task_id)
    if top is None:
        return CheckpointSize(path, False)
    total = files = entries = 0
    complete = True

    def walk(d: SafeDir, depth: int) -> None:
        nonlocal total, files, entries, complete
        for name, st in d.entries():
            entries += 1
            if entries > MAX_SIZE_ENTRIES:
                raise BudgetExceeded("entries")
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_DEPTH:
                    complete = False
                    continue
                sub = d.sub(name)
                if sub is not None:
                    with sub:
                        walk(sub, depth + 1)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                files += 1

    try:
        with top:
            walk(top, 0)
    except BudgetExceeded:
        complete = False
    return CheckpointSize(path, True, total, files, complete)


def sink_files(sink: SafeDir, plan: ck.ResetPlan) -> list[str]:
    """The data files the removed sink batches committed (to earliest: every file its log names), as paths
    relative to the sink directory: a log naming a file elsewhere (or through ``..``) is not followed."""
    if sink.kind("_spark_metadata") != "dir":
        return []
    if plan.position < 0:
        names = tuple(ck.log_names(names_in(sink, "_spark_metadata"), f"{sink.path}/_spark_metadata"))
        entries = sink_entries(sink, names)
    else:
        entries = []
        for b in plan.sink_batches_removed:
            rel = f"_spark_metadata/{b}"
            if is_file(sink, rel):
                entries += ck.parse_sink_log(read_file(sink, rel), f"{sink.path}/{rel}")
    base = PurePosixPath(sink.path)
    out: set[str] = set()
    for e in entries:
        try:
            p = PurePosixPath(local_path(e.path, "sink file"))
        except CheckpointError:
            continue
        if e.action != "add" or ".." in p.parts or p == base or not p.is_relative_to(base):
            continue
        out.add(str(p.relative_to(base)))
    return sorted(out)


def _remove_rel(d: SafeDir, rel: str, whole_dir: bool) -> None:
    """A log file and Hadoop's checksum beside it (``.<name>.crc``: a stale one would fail Spark's read), or a
    directory whole; every step below ``d`` checked."""
    parent, _, name = rel.rpartition("/")
    sub = d.walk_to(parent) if parent else d
    if sub is None:
        return
    try:
        if whole_dir:
            sub.rmtree(name)
        else:
            sub.unlink(name)
            sub.unlink(f".{name}.crc")
    finally:
        if sub is not d:
            sub.close()


def _write_rel(d: SafeDir, rel: str, data: bytes) -> None:
    parent, _, name = rel.rpartition("/")
    sub = d.walk_to(parent, create=True) if parent else d
    assert sub is not None
    try:
        sub.unlink(f".{name}.crc")
        sub.write(name, data)
    finally:
        if sub is not d:
            sub.close()


def apply_plan(root: SafeDir, task_id: str, sink: SafeDir | None, plan: ck.ResetPlan, data_files: list[str]) -> None:
    """Carry a plan out, in the order that leaves readers a consistent sink if it is cut short: the sink's
    log first (readers stop seeing the removed batches' files), then the checkpoint, the files written (a
    batch's commit last), and the removed batches' data files at the end. Run again, a reset cut short
    completes; data files it had not reached stay behind unlisted, which readers through the log skip."""

    def place(rel: str) -> tuple[SafeDir, str]:
        if rel.startswith("sink:"):
            if sink is None:
                raise CheckpointError("the plan names the sink, and the pipeline has no file sink here")
            return sink, rel[len("sink:") :]
        return root, f"{task_id}/{rel}" if rel else task_id

    def remove(rels: list[str]) -> None:
        for rel in sorted((r for r in rels if r in plan.remove_logs), reverse=True):
            _remove_rel(*place(rel), whole_dir=False)
        for rel in (r for r in rels if r in plan.remove_dirs):
            _remove_rel(*place(rel), whole_dir=True)

    every = list(plan.remove_logs) + list(plan.remove_dirs)
    remove([r for r in every if r.startswith("sink:")])
    remove([r for r in every if not r.startswith("sink:")])
    for rel, data in plan.write:
        _write_rel(*place(rel), data)
    if sink is not None:
        for rel in data_files:
            _remove_rel(sink, rel, whole_dir=False)
