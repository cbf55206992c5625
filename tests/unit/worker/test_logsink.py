"""Broker logging over a full pipe (``broker_sim.worker.logsink``): the thread that logs never blocks, what
cannot be held is dropped and counted, and the count is written in their place once there is room again. A broker
process whose fence stalls on a full pipe: tests/integration/worker/test_full_pipe.py."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

from broker_sim.worker.logsink import NonBlockingHandler


def test_logging_into_a_full_pipe_never_blocks_and_says_what_it_dropped():
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    out = os.fdopen(w, "w")
    handler = NonBlockingHandler(out, capacity=100)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.Logger("full-pipe")
    logger.addHandler(handler)
    try:
        t0 = time.monotonic()
        for i in range(5_000):  # far more than the pipe and the queue hold: a blocking handler stops here
            logger.warning("record %05d %s", i, "y" * 60)
        assert time.monotonic() - t0 < 2.0
        assert handler.dropped > 0
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(_read_until(r, b"the end")), name="drain", daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while handler.pending >= 100 and time.monotonic() < deadline:  # the writer moves again: room for the count
            time.sleep(0.01)
        logger.warning("the end")
        reader.join(10)
        assert b"log records dropped: the output was blocked" in got, bytes(got[-300:])
        assert got.startswith(b"record 00000") and got.endswith(b"the end\n"), (bytes(got[:40]), bytes(got[-40:]))
    finally:
        handler.close()
        os.set_blocking(r, False)  # whatever is left, so that the writer ends
        try:
            os.read(r, 4_000_000)
        except BlockingIOError:
            pass
        out.close()
        os.close(r)


def _read_until(fd: int, marker: bytes, limit: int = 4_000_000) -> bytes:
    data = b""
    while marker not in data and len(data) < limit:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data
