"""The backlog of a streaming file source: files in its directory that its query has not read yet.

Spark's file source says nothing of what is left (its progress reports what a batch read), but both sides are
on disk: the source directory, and the checkpoint's source log (``<checkpoint>/sources/0/<batch>``, compacted
every few batches into ``<batch>.compact``), one JSON line per file the query has taken. So the backlog is the
directory's data files (Spark skips names starting with ``.`` or ``_``) minus the logged ones. Only local
directories say it (an object store's listing is a cost per look); elsewhere there is no backlog figure.

Bounded: looked at most every ``interval_s`` (the status thread polls twice a second), at most ``max_files``
names listed, the log read incrementally (only batches not read before).
"""

from __future__ import annotations

import json
import os
import threading
import time
from urllib.parse import unquote, urlparse

MAX_FILES = 100_000
INTERVAL_S = 2.0


def local_path(path: str) -> str | None:
    """A local file system path for ``path`` (plain or ``file:``), None for any other scheme."""
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return os.path.abspath(unquote(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return os.path.abspath(path)
    return None


class FileBacklog:
    """Counts the files of ``source`` not yet in the source log under ``checkpoint``."""

    def __init__(
        self, source: str, checkpoint: str, interval_s: float = INTERVAL_S, max_files: int = MAX_FILES
    ) -> None:
        self.source = source
        self.log_dir = os.path.join(checkpoint, "sources", "0")
        self.interval_s = interval_s
        self.max_files = max_files
        self._lock = threading.Lock()
        self._taken: set[str] = set()
        self._last_batch = -1
        self._value: int | None = None
        self._at = float("-inf")

    @classmethod
    def of(cls, source_path: str, checkpoint: str) -> FileBacklog | None:
        src, chk = local_path(source_path), local_path(checkpoint)
        return None if src is None or chk is None else cls(src, chk)

    def files(self) -> int | None:
        """Files not read yet (None: the directory cannot be listed, or holds more than ``max_files``)."""
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.interval_s:
                self._at = now
                self._value = self._count()
            return self._value

    def _count(self) -> int | None:
        try:
            self._read_log()
            pending = 0
            listed = 0
            with os.scandir(self.source) as entries:
                for entry in entries:
                    listed += 1
                    if listed > self.max_files:
                        return None
                    if entry.name.startswith((".", "_")) or not entry.is_file(follow_symlinks=False):
                        continue
                    if entry.path not in self._taken:
                        pending += 1
            return pending
        except OSError:
            return None

    def _read_log(self) -> None:
        """Take in the source log's batches written since the last look (the latest compaction first, if the
        log was compacted past them)."""
        try:
            names = os.listdir(self.log_dir)
        except FileNotFoundError:
            return
        batches: dict[int, str] = {}
        for name in names:
            stem, _, ext = name.partition(".")
            if stem.isdigit() and ext in ("", "compact"):
                batches[int(stem)] = name
        new = sorted(b for b in batches if b > self._last_batch)
        compacted = [b for b in new if batches[b].endswith(".compact")]
        if compacted:  # holds every file up to it: the batches before it need no reading
            new = [b for b in new if b >= compacted[-1]]
        for b in new:
            try:
                with open(os.path.join(self.log_dir, batches[b]), encoding="utf-8") as f:
                    for line in f:
                        if len(self._taken) >= self.max_files:
                            break
                        line = line.strip()
                        if not line.startswith("{"):
                            continue  # the "v1" header
                        try:
                            path = json.loads(line).get("path")
                        except ValueError:
                            continue  # a batch file being written as we look: read again next time
                        if isinstance(path, str):
                            local = local_path(path)
                            if local is not None:
                                self._taken.add(local)
            except OSError:
                return
            self._last_batch = b


__all__ = ["FileBacklog", "local_path"]
