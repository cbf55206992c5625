"""The handler every client of ours uses: kazoo's, waiting with one poll(2) per call (controller/zk/poll.py).
Every client we make uses it (its ``select`` alone, on a socket pair: tests/unit/zk/test_poll.py); the whole
suite runs its ZooKeeper traffic through it."""

from __future__ import annotations

from controller.zk.client import ZkSettings, make_client
from controller.zk.poll import PollingHandler


def test_every_client_we_make_uses_it(zk_settings: ZkSettings):
    client = make_client(zk_settings, connect=False)
    assert isinstance(client.handler, PollingHandler)
    client.start(timeout=10)
    path = f"{zk_settings.root}/zkpoll"
    try:
        client.ensure_path(path)
        assert client.exists(path) is not None
        pending = [client.get_async(path) for _ in range(50)]
        assert all(p.get(timeout=10)[1].version == 0 for p in pending)
        client.delete(zk_settings.root, recursive=True)
    finally:
        client.stop()
        client.close()
