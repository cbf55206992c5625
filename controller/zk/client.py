"""How every process of ours connects to ZooKeeper: one place for hosts, timeouts, auth and TLS."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from controller.zk.poll import make_handler

DEFAULT_HOSTS = "127.0.0.1:2181"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZkSettings:
    """Connection settings. ``auth`` is ``user:password`` for digest auth; it is never logged."""

    hosts: str = DEFAULT_HOSTS
    root: str = "/zkc"
    session_timeout_s: float = 10.0
    auth: str | None = None
    use_ssl: bool = False
    ca: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    verify_certs: bool = True

    def __repr__(self) -> str:  # keep secrets out of logs and tracebacks
        return f"ZkSettings(hosts={self.hosts!r}, root={self.root!r}, auth={'***' if self.auth else None})"

    __str__ = __repr__


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None or value == "" else value.strip().lower() not in ("0", "false", "no", "off")


def settings_from_env(**overrides: object) -> ZkSettings:
    """Settings from ZKC_ZK / ZKC_ROOT / ZKC_AUTH (or ZKC_AUTH_FILE), TLS from ZKC_ZK_TLS=1 with ZKC_ZK_CA,
    ZKC_ZK_CERT / ZKC_ZK_KEY (client certificate) and ZKC_ZK_TLS_VERIFY=0 (no certificate check), then
    explicit overrides."""
    from controller.zk.security import credential_from_env  # security builds on the client, not the reverse

    auth = None if overrides.get("auth") else credential_from_env()
    values: dict[str, object] = {
        "hosts": os.environ.get("ZKC_ZK", DEFAULT_HOSTS),
        "root": os.environ.get("ZKC_ROOT", "/zkc"),
        "auth": auth or None,
        "use_ssl": _flag("ZKC_ZK_TLS", False),
        "ca": os.environ.get("ZKC_ZK_CA") or None,
        "certfile": os.environ.get("ZKC_ZK_CERT") or None,
        "keyfile": os.environ.get("ZKC_ZK_KEY") or None,
        "verify_certs": _flag("ZKC_ZK_TLS_VERIFY", True),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return ZkSettings(**values)  # type: ignore[arg-type]


def make_client(settings: ZkSettings, *, connect: bool = True, timeout: float = 15.0) -> KazooClient:
    """A kazoo client for ``settings``, connected unless ``connect`` is False."""
    kwargs: dict[str, Any] = dict(
        hosts=settings.hosts,
        handler=make_handler(),  # kazoo's, with one poll(2) per wait instead of a new epoll set (zkpoll.py)
        timeout=settings.session_timeout_s,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
        command_retry=KazooRetry(max_tries=5, delay=0.05, max_delay=0.5),
    )
    if settings.auth:
        kwargs["auth_data"] = [("digest", settings.auth)]
    if settings.use_ssl:
        kwargs.update(
            use_ssl=True,
            ca=settings.ca,
            certfile=settings.certfile,
            keyfile=settings.keyfile,
            verify_certs=settings.verify_certs,
        )
    if settings.auth:  # creates get the ACL policy's ACL for their path (controller/zk/security.py)
        from controller.zk.security import SecureKazooClient

        client: KazooClient = SecureKazooClient(settings.root, **kwargs)
    else:
        client = KazooClient(**kwargs)
    if connect:
        client.start(timeout=timeout)
    return client
