"""A task's Spark checkpoint as files where ``zkctl`` runs: the checkpoint root, the logs listed and read
(bounded), the source files a file source would see, a checkpoint's size, and a reset plan carried out on disk.

No ZooKeeper here: ``offsets`` decides what to read and what to change, ``controller.protocol.tasks.checkpoints``
(pure) parses the bytes and plans resets, and this module is the file system between them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from controller.protocol.tasks import checkpoints as ck
from controller.protocol.tasks.checkpoints import CheckpointError, CheckpointLogs, LogName
from controller.protocol.tasks.spec import FilesSink, FilesSource, SparkPipeline

#: files counted by ``describe``'s checkpoint size at most (a bound on the walk)
MAX_SIZE_FILES = 200_000
#: files listed in a source directory at most (pending files of ``offsets``, ``--to-latest``)
MAX_LISTED = 100_000


def default_checkpoint_root() -> str:
    """The brokers' default (``zkctl broker run --checkpoint-root``): ``$ZKC_CHECKPOINT_ROOT``, else
    ``$ZKC_STATE_DIR/checkpoints``."""
    return os.environ.get("ZKC_CHECKPOINT_ROOT") or os.path.join(os.environ.get("ZKC_STATE_DIR", ".zkc"), "checkpoints")


def local_path(url: str, what: str) -> Path:
    """A local path from a path or ``file:`` URL; any other scheme is refused (not readable from here)."""
    if "://" in url or url.startswith("file:"):
        parsed = urlparse(url)
        if parsed.scheme != "file":
            raise CheckpointError(
                f"{what} {url!r} is on {parsed.scheme}://, which zkctl does not read: run it where that storage "
                "is mounted, or use Spark's tools there"
            )
        return Path(unquote(parsed.path))
    return Path(os.path.abspath(url))


@dataclass(frozen=True)
class CheckpointSize:
    path: str
    exists: bool
    bytes: int = 0
    files: int = 0
    complete: bool = True  # False: the walk stopped at MAX_SIZE_FILES


def read_log(path: Path) -> bytes:
    """A log file's bytes, one past the largest log parsed (so an oversized one is refused, not truncated)."""
    try:
        with open(path, "rb") as f:
            return f.read(ck.MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None


def list_names(path: Path) -> list[str]:
    """A log directory's entries (none where it does not exist)."""
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot list ({exc.strerror})") from None


def remove_file(path: Path) -> None:
    """A log file and Hadoop's checksum beside it (``.<name>.crc``: a stale one would fail Spark's read)."""
    for p in (path, path.with_name(f".{path.name}.crc")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def write_file(path: Path, data: bytes) -> None:
    """Write through a hidden temporary name and rename into place, as Spark's own logs are written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_file(path)
    tmp = path.with_name(f".{path.name}.zkc-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def measure(root: Path) -> CheckpointSize:
    """Bytes and files under the checkpoint (bounded walk); ``exists`` False where it is not seen from here."""
    if not root.is_dir():
        return CheckpointSize(str(root), False)
    total = files = 0
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                continue
            files += 1
            if files >= MAX_SIZE_FILES:
                return CheckpointSize(str(root), True, total, files, complete=False)
    return CheckpointSize(str(root), True, total, files)


def pipeline_paths(p: SparkPipeline) -> tuple[Path | None, Path | None, set[int]]:
    """The pipeline's file source and file sink as local paths (None: not files), and its file sources' indexes."""
    src = local_path(p.source.path, "source path") if isinstance(p.source, FilesSource) else None
    sink = local_path(p.sink.path, "sink path") if isinstance(p.sink, FilesSink) else None
    return src, sink, ({0} if src is not None else set())


def read_logs(root: Path, sink: Path | None, file_sources: set[int]) -> CheckpointLogs:
    """The names of every log of the checkpoint under ``root`` (and of the file sink's log), for the plans."""
    sources = {
        i: tuple(ck.log_names(list_names(root / "sources" / str(i)), f"{root}/sources/{i}")) for i in file_sources
    }
    sink_dir = sink / "_spark_metadata" if sink is not None else None
    return CheckpointLogs(
        offsets=tuple(ck.log_names(list_names(root / "offsets"), f"{root}/offsets")),
        commits=tuple(ck.log_names(list_names(root / "commits"), f"{root}/commits")),
        sources=sources,
        sink=tuple(ck.log_names(list_names(sink_dir), str(sink_dir))) if sink_dir and sink_dir.is_dir() else None,
        stateful=(root / "state").is_dir(),
    )


def _since_compaction(names: Iterable[LogName]) -> list[LogName]:
    """A log's live files, in order: its latest compaction, then the per-batch files after it."""
    chosen = list(names)
    compact = [n for n in chosen if n.compact]
    start = compact[-1].batch if compact else -1
    return [n for n in chosen if (n.compact and n.batch == start) or (not n.compact and n.batch > start)]


def source_entries(log_dir: Path, names: tuple[LogName, ...], upto: int) -> list[ck.SourceFile]:
    """Every entry of a source log up to batch ``upto``: the latest compaction at or below it, then the
    per-batch files after it."""
    out: list[ck.SourceFile] = []
    for n in _since_compaction(n for n in names if n.batch <= upto):
        out += ck.parse_source_log(read_log(log_dir / n.name), str(log_dir / n.name))
    return out


def sink_entries(log_dir: Path, names: tuple[LogName, ...]) -> list[ck.SinkFile]:
    """Every entry of a file sink's log: its latest compaction, then the per-batch files after it."""
    out: list[ck.SinkFile] = []
    for n in _since_compaction(names):
        out += ck.parse_sink_log(read_log(log_dir / n.name), str(log_dir / n.name))
    return out


def listed_files(src: Path) -> list[tuple[str, int]] | None:
    """The files a file source would see (hidden and ``_`` names skipped, as Spark does), as URIs with their
    modification time in ms; None where the directory is not readable from here or too large to list."""
    out: list[tuple[str, int]] = []

    def walk(d: Path, depth: int) -> Iterator[os.DirEntry[str]]:
        with os.scandir(d) as it:
            for e in it:
                if e.name.startswith((".", "_")):
                    continue
                if e.is_dir(follow_symlinks=False) and depth < 8:
                    yield from walk(Path(e.path), depth + 1)
                elif e.is_file():
                    yield e

    try:
        for e in walk(src, 0):
            out.append((Path(e.path).absolute().as_uri(), int(e.stat().st_mtime * 1000)))
            if len(out) > MAX_LISTED:
                return None
    except OSError:
        return None
    return out


def pending_count(src: Path, taken: set[str]) -> int | None:
    files = listed_files(src)
    return None if files is None else sum(1 for uri, _ts in files if uri not in taken)


def sink_files(sink: Path, plan: ck.ResetPlan) -> list[Path]:
    """The data files the removed sink batches committed (to earliest: every file its log names), inside the
    sink directory only: a log naming a file elsewhere is not followed."""
    log_dir = sink / "_spark_metadata"
    if not log_dir.is_dir():
        return []
    if plan.position < 0:
        entries = sink_entries(log_dir, tuple(ck.log_names(list_names(log_dir), str(log_dir))))
    else:
        entries = []
        for b in plan.sink_batches_removed:
            f = log_dir / str(b)
            if f.is_file():
                entries += ck.parse_sink_log(read_log(f), str(f))
    base = sink.resolve()
    out: set[Path] = set()
    for e in entries:
        try:
            p = local_path(e.path, "sink file").resolve()
        except (CheckpointError, OSError, ValueError):
            continue
        if e.action == "add" and p != base and p.is_relative_to(base):
            out.add(p)
    return sorted(out)


def apply_plan(root: Path, sink: Path | None, plan: ck.ResetPlan, sink_files: list[Path]) -> None:
    """Carry a plan out, in the order that leaves readers a consistent sink if it is cut short: the sink's
    log first (readers stop seeing the removed batches' files), then the checkpoint, the files written (a
    batch's commit last), and the removed batches' data files at the end. Run again, a reset cut short
    completes; data files it had not reached stay behind unlisted, which readers through the log skip."""

    def where(rel: str) -> Path:
        if rel.startswith("sink:"):
            assert sink is not None
            return sink / rel[len("sink:") :]
        return root / rel if rel else root

    def remove(rels: list[str]) -> None:
        for rel in sorted((r for r in rels if r in plan.remove_logs), reverse=True):
            remove_file(where(rel))
        for rel in (r for r in rels if r in plan.remove_dirs):
            if where(rel).is_dir():
                shutil.rmtree(where(rel))

    every = list(plan.remove_logs) + list(plan.remove_dirs)
    remove([r for r in every if r.startswith("sink:")])
    remove([r for r in every if not r.startswith("sink:")])
    for rel, data in plan.write:
        write_file(where(rel), data)
    for f in sink_files:
        remove_file(f)
