"""Each pipeline's own log on its broker: ``<logs dir>/<task>.log``, bounded and rotated, read back by the
``logs`` storage request (``zkctl task logs``).

A record goes to a task's log when it is about that task: one of its arguments is the task's id (the
worker's and the runners' messages name the task as an argument), its thread is the task's (``spark-*-<id>``),
or it was logged with ``extra={"task_id": ...}``. Like the broker's own output (``logsink``), logging never
blocks the thread that logs: records are queued (bounded; dropped past it) and one named thread writes them."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

from broker_sim.worker.safe_files import Budget, SafeDir
from controller.protocol.cluster.layout import check_name
from controller.protocol.tasks.storage import MAX_LOG_READ_BYTES, LogLines

#: a task's log file rotates past this size; one older file is kept
MAX_LOG_FILE_BYTES = 1024 * 1024
#: records waiting to be written at most
QUEUE_RECORDS = 10_000
#: characters of one line at most
MAX_LINE_CHARS = 4000


class TaskLogs(logging.Handler):
    """Routes records to per-task files under ``directory``; ``track``/``untrack`` say which ids are tasks."""

    def __init__(self, directory: str) -> None:
        super().__init__(level=logging.INFO)
        self.directory = os.path.abspath(directory)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
        self._tasks: set[str] = set()
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue(maxsize=QUEUE_RECORDS)
        self._writer = threading.Thread(target=self._write_loop, name="task-logs-writer", daemon=True)
        self._started = False

    def start(self) -> TaskLogs:
        os.makedirs(self.directory, exist_ok=True)
        self._writer.start()
        self._started = True
        logging.getLogger().addHandler(self)
        return self

    def stop(self) -> None:
        logging.getLogger().removeHandler(self)
        if self._started:
            try:
                self._queue.put(None, timeout=1.0)
            except queue.Full:
                pass
            self._writer.join(2.0)

    def track(self, task_id: str) -> None:
        self._tasks.add(task_id)

    def untrack(self, task_id: str) -> None:
        self._tasks.discard(task_id)

    def note(self, task_id: str, message: str) -> None:
        """A line of the worker's own about the task (a state change, its error)."""
        self._put(task_id, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"[:MAX_LINE_CHARS])

    # ---- logging.Handler ------------------------------------------------------------------------------
    def _task_of(self, record: logging.LogRecord) -> str | None:
        tid = getattr(record, "task_id", None)
        if isinstance(tid, str):
            return tid
        tasks = self._tasks
        args = record.args if isinstance(record.args, tuple) else ()
        for a in args:
            if isinstance(a, str) and a in tasks:
                return a
        thread = record.threadName or ""
        if thread.startswith("spark-"):
            tail = thread.rsplit("-", 1)[-1]
            for t in tasks:
                if thread.endswith("-" + t) or t == tail:
                    return t
        return None

    def emit(self, record: logging.LogRecord) -> None:
        task = self._task_of(record)
        if task is None:
            return
        try:
            line = self.format(record)
        except Exception:
            return
        self._put(task, line[:MAX_LINE_CHARS])

    def _put(self, task_id: str, line: str) -> None:
        try:
            self._queue.put_nowait((task_id, line))
        except queue.Full:
            pass  # never block the thread that logs

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            task_id, line = item
            try:
                self._append(task_id, line)
            except OSError:
                continue

    def has(self, task_id: str) -> bool:
        return os.path.isfile(self.path_of(task_id)) and not os.path.islink(self.path_of(task_id))

    def path_of(self, task_id: str) -> str:
        return os.path.join(self.directory, check_name("task id", task_id) + ".log")

    def _append(self, task_id: str, line: str) -> None:
        path = self.path_of(task_id)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        fd = os.open(path, flags, 0o644)
        try:
            if os.fstat(fd).st_size > MAX_LOG_FILE_BYTES:
                os.close(fd)
                os.replace(path, path + ".1")
                fd = os.open(path, flags, 0o644)
            os.write(fd, (line.replace("\n", "\n  ") + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)

    # ---- reading ------------------------------------------------------------------------------------
    def read(self, task_id: str, broker_id: str, tail: int, since: int | None, budget: Budget) -> LogLines | None:
        """The last ``tail`` lines (at most ``MAX_LOG_READ_BYTES``), or those after byte ``since``; None where
        this broker has no log of the task."""
        name = check_name("task id", task_id) + ".log"
        d = SafeDir.open(self.directory, budget)
        if d is None:
            return None
        with d:
            if d.kind(name) != "file":
                return None
            data, start, size = d.tail(name, MAX_LOG_READ_BYTES, since)
        lines = data.decode("utf-8", "replace").split("\n")
        skipped = start > (since or 0)  # bytes before ``start`` not read: its first line may be cut
        if skipped:
            lines = lines[1:]
        if lines and lines[-1] == "":
            lines.pop()
        truncated = skipped or (since is None and len(lines) > tail)
        if since is None:
            lines = lines[-tail:]
        return LogLines(task_id, broker_id, self.path_of(task_id), tuple(lines), size, truncated)
