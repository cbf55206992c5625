"""Broker logging that never blocks the thread that logs. A broker's output may be a pipe its parent stopped
reading; a write to a full pipe blocks, and the threads of the fence all log before they act (the probe's
"no answer, fencing", the fence's "stopping N tasks", the watchdog's "HALTING"), so a broker cut off in that
state stopped nothing, never halted and ran its tasks on past its session (tests/integration/worker/test_full_pipe.py).
Records go into a bounded queue instead; one writer thread writes them out and is the only thread a blocked
output can stall. When the queue is full, records are dropped and counted, and the count is written in
their place once there is room again."""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from typing import TextIO

#: records held while the output is blocked; past that they are dropped (and counted)
QUEUE_RECORDS = 10_000
#: how long a flush (``logging.shutdown`` at exit, a halt) waits for the writer: it must not hold an exit
FLUSH_WAIT_S = 0.5


class NonBlockingHandler(logging.Handler):
    """A handler whose ``emit`` only formats and enqueues; a writer thread of its own writes to ``stream``."""

    def __init__(self, stream: TextIO | None = None, capacity: int = QUEUE_RECORDS) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stderr
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=capacity)
        self._dropped = 0
        self._lock = threading.Lock()  # the drop counter and the order of the notice among the lines
        self._writer = threading.Thread(target=self._write_loop, name="log-writer", daemon=True)
        self._writer.start()

    @property
    def dropped(self) -> int:
        with self._lock:
            return self._dropped

    @property
    def pending(self) -> int:
        """Records queued, not yet written."""
        return self._queue.qsize()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            return  # a record that cannot be formatted is not worth blocking or raising for
        with self._lock:  # only non-blocking operations under it; it keeps the drop notice in its place
            try:
                if self._dropped:
                    self._queue.put_nowait(f"[{self._dropped} log records dropped: the output was blocked]\n")
                    self._dropped = 0
                self._queue.put_nowait(line)
            except queue.Full:
                self._dropped += 1

    def _write_loop(self) -> None:
        """Until ``close`` enqueues None: write each line (this thread alone may block on the output)."""
        while True:
            line = self._queue.get()
            if line is None:
                return
            try:
                self.stream.write(line)
                if self._queue.empty():
                    self.stream.flush()
            except Exception:
                pass  # a closed or broken output: nothing to tell it to

    def flush(self) -> None:
        """Wait, at most ``FLUSH_WAIT_S``, for what is queued to be written: never longer."""
        deadline = time.monotonic() + FLUSH_WAIT_S
        while not self._queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.flush()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the writer is blocked on the output: it is a daemon thread, it ends with the process
        super().close()


def log_without_blocking(
    level: int, fmt: str = "%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"
) -> None:
    """Configure the root logger of a broker process: ``level``, on stderr, through a ``NonBlockingHandler``
    (replacing any handler configured before)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = NonBlockingHandler()
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)
