"""A TCP proxy between one simulated broker and ZooKeeper, for network failure injection.

``partition()`` stops forwarding bytes in both directions while keeping the sockets open (what a
network partition or a frozen peer looks like to both ends: silence); once it returns, no byte sent
after it crosses (a pump preempted between its check and its read would otherwise relay bytes sent
after the partition, and a test measuring from that moment would see a request answered after the cut);
``heal()`` resumes; ``reset()``
drops every connection. Threads are named after the proxy; every loop is bounded by socket timeouts
and the stop flag.

In front of an ensemble (``for_hosts`` with several servers) each new connection goes to the next server in
turn that accepts it, as a ZooKeeper client walks its host list: a client whose server died or stopped
serving (cut off from its peers) reconnects through the same proxy to another.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)


class NetProxy:
    def __init__(
        self, target_host: str, target_port: int, name: str = "proxy", more: Sequence[tuple[str, int]] = ()
    ) -> None:
        self.target = (target_host, target_port)
        self.targets = [self.target, *more]
        self.name = name
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._stopped = threading.Event()
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._gate = threading.Lock()  # held by a pump from its check of ``_open`` until it has read the bytes
        self._accept = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._accept.start()

    @classmethod
    def for_hosts(cls, hosts: str, name: str) -> NetProxy:
        """A proxy in front of ``host:port[,host:port...]`` (a ZooKeeper connect string without a chroot)."""
        targets = []
        for item in hosts.split(","):
            host, _, port = item.strip().rpartition(":")
            targets.append((host, int(port)))
        return cls(*targets[0], name=name, more=targets[1:])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def partition(self) -> None:
        with self._gate:  # waits for a forward in progress: nothing crosses after this returns
            self._open.clear()

    def heal(self) -> None:
        self._open.set()

    @property
    def partitioned(self) -> bool:
        return not self._open.is_set()

    def reset(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for a, b in conns:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self) -> None:
        self._stopped.set()
        self.reset()
        self._listener.close()
        self._accept.join(2)

    def _accept_loop(self) -> None:
        n = 0
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if not self._open.is_set():
                client.close()  # a partitioned host cannot connect either
                continue
            upstream = self._connect(n)
            if upstream is None:
                client.close()
                continue
            with self._lock:
                self._conns.append((client, upstream))
            n += 1
            threading.Thread(
                target=self._pump, args=(client, upstream), name=f"{self.name}-pump{n}", daemon=True
            ).start()

    def _connect(self, n: int) -> socket.socket | None:
        """The ``n``-th connection's upstream: the next target in turn that accepts (None: none does)."""
        for i in range(len(self.targets)):
            try:
                return socket.create_connection(self.targets[(n + i) % len(self.targets)], timeout=2)
            except OSError:
                continue
        return None

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stopped.is_set():
                if not self._open.is_set():
                    self._open.wait(0.2)  # silence: hold the bytes, keep the sockets
                    continue
                try:
                    readable, _, _ = select.select([a, b], [], [], 0.2)
                except (OSError, ValueError):
                    return
                for s in readable:
                    with self._gate:  # (select said readable: the recv does not block)
                        if not self._open.is_set():
                            break
                        try:
                            data = s.recv(65536)
                        except OSError:
                            return
                    if not data:
                        return
                    try:
                        peers[s].sendall(data)  # bytes sent before the partition, delivered late: latency
                    except OSError:
                        return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass
