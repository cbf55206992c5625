"""What every route needs and nothing more: the server's configuration, an admin client on its one
ZooKeeper session (503 at once when that session is away), and the shared answers for ``?wait``."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from controller.admin import AdminClient, to_dict
from controller.admin.roots import missing_root_message
from controller.api.errors import ApiError, error_response
from controller.protocol.cluster.layout import ZkLayout

API = "/api/v1"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@dataclass(frozen=True)
class ApiConfig:
    """What one API server serves: its ZooKeeper client and root, the admin token (None: writes open to
    same-origin clients), the Host names it answers to, and the limits that keep one client from starving
    the others."""

    client: KazooClient
    layout: ZkLayout
    token: str | None = None
    allowed_hosts: frozenset[str] = field(default=LOOPBACK_HOSTS)  # "*": any (behind a proxy that checks)
    sse_idle_s: float = 15.0  # keep-alive comment on a quiet event stream
    max_wait_s: float = 600.0  # the longest ?timeout= a request may ask for
    max_body_bytes: int = 1 << 20  # a request body past this is refused (413) before it is read whole
    max_streams: int = 1000  # event streams open at once; one more is a 503 with the reason
    stream_buffer: int = 1000  # events queued for one stream; a reader that far behind is dropped
    task_metrics_max: int = 500  # tasks whose figures /metrics exports (the first page; 0: none)
    zk_hosts: str = "ZooKeeper"  # how the missing-root error names the ensemble (``--zk``)


@dataclass(frozen=True)
class ApiContext:
    """The routes' view of the server: its configuration and the admin operations."""

    config: ApiConfig
    # set once the root was seen set up: from then on no request pays the round trip (a root is not unmade)
    root_seen: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def require_root(self) -> None:
        """Refuse (404 ``no_cluster``) a root that was never set up, as the command line does: a mistyped
        root must not be created by a write that nobody serves, nor read as an empty cluster."""
        if self.root_seen.is_set():
            return
        message = missing_root_message(self.config.client, self.config.layout, self.config.zk_hosts)
        if message is not None:
            raise ApiError(404, "no_cluster", message)
        self.root_seen.set()

    def admin(self) -> AdminClient:
        if not self.config.client.connected:
            raise ApiError(503, "zookeeper_unavailable", "ZooKeeper is not reachable from this API server; retry later")
        self.require_root()
        return AdminClient(self.config.client, self.config.layout)

    def waited(self, wait: bool, timeout: float) -> float:
        """The seconds to wait for, from ``?wait=&timeout=`` (bounded by ``max_wait_s``)."""
        if not 0 <= timeout <= self.config.max_wait_s:
            raise ApiError(
                422, "invalid_parameter", f"timeout must be between 0 and {self.config.max_wait_s:g} seconds"
            )
        return timeout if wait else 0.0

    @staticmethod
    def done_or_504(result: Any, wait: bool) -> Any:
        body = to_dict(result)
        if wait and not getattr(result, "done", True):
            return error_response(504, "timeout", f"not done within the wait: {json.dumps(body, default=str)}")
        return body
