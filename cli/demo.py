"""``zkctl demo``: the README's main job, on an embedded ZooKeeper and local Spark."""

from __future__ import annotations

import time
from pathlib import Path

import click

from controller.admin import ensure_layout, walk
from controller.layout import ZkLayout
from controller.zkclient import ZkSettings, make_client
from controller.zkserver import ZooKeeperServer, free_port


def run_foundation_demo(state_dir: Path, root: str, echo=click.echo) -> int:
    """Start an embedded ZooKeeper, lay out the cluster root, show the tree, stop everything."""
    server = ZooKeeperServer(data_dir=state_dir / "demo-zookeeper", port=free_port())
    t0 = time.monotonic()
    pid = server.start()
    try:
        echo(f"embedded ZooKeeper up on {server.address} (pid {pid}) in {time.monotonic() - t0:.1f}s")
        client = make_client(ZkSettings(hosts=server.address, root=root))
        try:
            layout = ZkLayout(root)
            ensure_layout(client, layout)
            for depth, path, stat in walk(client, layout.root):
                echo(f"{'  ' * depth}{path if depth == 0 else path.rsplit('/', 1)[-1]}")
        finally:
            client.stop()
            client.close()
    finally:
        server.stop()
        echo("ZooKeeper stopped")
    return 0
