"""Where the embedded ZooKeeper servers this user started are: a record under ``$ZKC_HOME`` (default
``~/.zkc``) of each server's absolute data dir, port and pid, so that ``zk stop|status`` from another
working directory find the server ``zk start`` started (the state dir ``.zkc`` is relative to where it ran).

The record is a hint, never trusted alone: a server is ours only if the process behind its pid runs
ZooKeeper with that data dir's config (``ZooKeeperServer.is_running``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from controller.zk.server import ZooKeeperServer

RECORD_NAME = "zookeeper-servers.json"
MAX_RECORD_BYTES = 256 * 1024
MAX_ENTRIES = 64


def record_file() -> Path:
    home = os.environ.get("ZKC_HOME") or str(Path.home() / ".zkc")
    return Path(home).expanduser() / RECORD_NAME


def _read() -> list[dict[str, Any]]:
    path = record_file()
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    out = []
    for e in data[:MAX_ENTRIES]:
        if isinstance(e, dict) and isinstance(e.get("data_dir"), str) and isinstance(e.get("port"), int):
            out.append({"data_dir": e["data_dir"], "port": e["port"], "pid": e.get("pid")})
    return out


def _write(entries: list[dict[str, Any]]) -> None:
    path = record_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries[-MAX_ENTRIES:], indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: zk stop|status then need --data-dir, and say where they looked


def remember(server: ZooKeeperServer, pid: int) -> None:
    """Note a server we started (replacing an older note of its data dir)."""
    data_dir = str(server.data_dir.resolve())
    entries = [e for e in _read() if e["data_dir"] != data_dir]
    _write([*entries, {"data_dir": data_dir, "port": server.port, "pid": pid}])


def forget(server: ZooKeeperServer) -> None:
    data_dir = str(server.data_dir.resolve())
    entries = _read()
    if any(e["data_dir"] == data_dir for e in entries):
        _write([e for e in entries if e["data_dir"] != data_dir])


def running_servers() -> list[ZooKeeperServer]:
    """The recorded servers that still run (by pid and config: a recycled pid is not ours)."""
    out = []
    for e in _read():
        server = ZooKeeperServer(data_dir=Path(e["data_dir"]), port=e["port"])
        if server.is_running():
            out.append(server)
    return out


__all__ = ["record_file", "remember", "forget", "running_servers", "RECORD_NAME"]
