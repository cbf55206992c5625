"""A ZooKeeper ensemble of the chaos run's own, whose servers can be killed one by one and cut off from their
peers while their clients still reach them.

Each server reaches each peer through a proxy of its own (one per ordered pair and port: quorum and
election), so that cutting server N off is silencing every proxy between N and the others, both ways; its
client port stays open. Each server's configuration names its own real ports and its peers' proxies (a
server binds the address its own ``server.N`` line gives). What a server is now (leader, follower, not
serving) is what it answers to ``srvr``."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

from broker_sim.sim.injection import FaultRefused
from broker_sim.sim.netproxy import NetProxy
from controller.zk.server import ZooKeeperServer, four_letter_word

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


def _bound() -> socket.socket:
    """A socket bound to a free loopback port (the port stays ours until it is closed)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    return sock


class ChaosEnsemble:
    """``size`` servers on loopback (not started), with a proxy between every two of them on each peer port."""

    def __init__(self, base_dir: Path, size: int = 3, tick_ms: int = 500) -> None:
        if size < 3 or size % 2 == 0:
            raise ValueError(f"an ensemble to fault has an odd size of at least 3, not {size}")
        ids = list(range(1, size + 1))
        held = [_bound() for _ in range(3 * size)]  # held while the proxies bind: none of them takes one
        ports = [sock.getsockname()[1] for sock in held]
        real = {sid: (ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i, sid in enumerate(ids)}
        try:
            #: (from, to) -> (quorum proxy, election proxy): what server ``from`` dials to reach server ``to``
            self.links: dict[tuple[int, int], tuple[NetProxy, NetProxy]] = {
                (a, b): (
                    NetProxy(HOST, real[b][1], name=f"zk-link-{a}-{b}-q"),
                    NetProxy(HOST, real[b][2], name=f"zk-link-{a}-{b}-e"),
                )
                for a in ids
                for b in ids
                if a != b
            }
        finally:
            for sock in held:
                sock.close()
        self.servers: dict[int, ZooKeeperServer] = {}
        for sid in ids:
            peers: dict[int, tuple[int, int, int]] = {sid: real[sid]}
            for other in ids:
                if other != sid:
                    quorum, election = self.links[(sid, other)]
                    peers[other] = (real[other][0], quorum.port, election.port)
            self.servers[sid] = ZooKeeperServer(
                data_dir=Path(base_dir) / f"zk{sid}",
                port=real[sid][0],
                host=HOST,
                tick_ms=tick_ms,
                max_session_timeout_ms=120_000,
                server_id=sid,
                peers=peers,
            )
        self.isolated: set[int] = set()

    @property
    def hosts(self) -> str:
        return ",".join(s.address for s in self.servers.values())

    def start(self, timeout: float = 120.0) -> ChaosEnsemble:
        """Start every server without waiting (a quorum needs a majority up), then wait for each to serve."""
        for s in self.servers.values():
            s.start(wait=False)
        for s in self.servers.values():
            s.wait_until_serving(timeout)
        return self

    def mode(self, sid: int) -> str | None:
        """ "leader", "follower", or None (down, electing, or cut off from a quorum)."""
        s = self.servers[sid]
        srvr = four_letter_word(s.host, s.port, "srvr")
        return next((line.split(":", 1)[1].strip() for line in srvr.splitlines() if line.startswith("Mode:")), None)

    def modes(self) -> dict[int, str | None]:
        return {sid: self.mode(sid) for sid in self.servers}

    def pick(self, role: str, nth: int = 0) -> int:
        """A server in ``role`` ("leader" or "follower"; the ``nth`` follower, wrapping) now, or the engine's
        refusal when none is (an election under way, a quorum not yet back)."""
        found = sorted(sid for sid, m in self.modes().items() if m == role and sid not in self.isolated)
        if not found:
            raise FaultRefused(f"no ZooKeeper server is {role} now ({self._said()})")
        return found[nth % len(found)]

    def kill(self, sid: int) -> None:
        """SIGKILL of server ``sid`` (its data stays, ``restart`` reuses it)."""
        s = self.servers[sid]
        if not s.is_running():
            raise FaultRefused(f"ZooKeeper server {sid} is not running")
        s.kill()

    def restart(self, sids: list[int], timeout: float = 90.0) -> None:
        """Start the servers ``sids`` again (without waiting, a quorum may need two), then wait until each
        serves."""
        for sid in sids:
            self.servers[sid].start(wait=False)
        for sid in sids:
            self.servers[sid].wait_until_serving(timeout)

    def isolate(self, sid: int) -> None:
        """Cut server ``sid`` off from every peer, both ways (its clients still reach it)."""
        self.isolated.add(sid)
        for (a, b), pair in self.links.items():
            if sid in (a, b):
                for p in pair:
                    p.partition()

    def rejoin(self, sid: int) -> None:
        """The links of server ``sid`` pass again (connections held silent are dropped: the peers reconnect)."""
        for (a, b), pair in self.links.items():
            if sid in (a, b):
                for p in pair:
                    p.reset()
                    p.heal()
        self.isolated.discard(sid)

    def _said(self) -> str:
        return ", ".join(f"{sid}: {m or 'not serving'}" for sid, m in self.modes().items())

    def close(self) -> None:
        """Stop every server by its pid, then the links."""
        for s in self.servers.values():
            try:
                s.stop()
            except Exception:
                log.exception("stopping ZooKeeper server %s", s.server_id)
        for pair in self.links.values():
            for p in pair:
                p.close()
